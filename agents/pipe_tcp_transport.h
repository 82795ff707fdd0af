// The TCP PipeTransport (agents/pipe_transport.h): an Asio io_context run
// by `num_io_threads` threads, a TCP acceptor, and TcpConnections
// (agents/pipe_tcp_connection.h). Internal to //agents; this header keeps
// Asio out of the files that include it.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "agents/pipe_connection.h"
#include "agents/pipe_frame.h"
#include "agents/pipe_transport.h"
#include "common/listen_address.h"

namespace switchboard::agents {

struct TcpTransportOptions {
  // Names the agent in errors and logs.
  std::string agent_name;
  size_t num_io_threads = 1;  // at least one runs
  // Every connection's reader: frame limits and where received tensors go.
  pipe::FrameLimits limits;
  pipe::FrameReader::Allocate allocate;
  // The listener's port comes from this range when set (else the kernel
  // picks one).
  std::optional<PortRange> ports;
};

// A transport whose connections report to `events`, which must outlive it.
// Threads start at listen().
std::unique_ptr<PipeTransport> make_tcp_transport(ConnectionEvents& events,
                                                  TcpTransportOptions options);

}  // namespace switchboard::agents
