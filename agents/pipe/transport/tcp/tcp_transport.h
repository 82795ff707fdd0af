// The TCP PipeTransport (agents/pipe/transport/transport.h): an Asio io_context run
// by `num_io_threads` threads and a TCP acceptor, whose connections are one
// of the three stream transports, each in its own folder:
//   tcp/tcp_connection.h   plain TCP;
//   shm/shm_lane.h         plain TCP whose frames move through shared
//                          memory once both sides agree (lane_capacity);
//   tls/tls_connection.h   mutual TLS over TCP (tls.enabled()).
// Every transport passes one conformance suite
// (tests/agents/pipe/transport/conformance_test.cc). Internal to the PIPE agent; this
// header keeps Asio out of the files that include it.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "agents/pipe/transport/connection.h"
#include "agents/pipe/transport/tls/tls_options.h"
#include "agents/pipe/transport/transport.h"
#include "agents/pipe/wire/frame.h"
#include "common/listen_address.h"

namespace switchboard::agents::pipe::transport {

struct TcpTransportOptions {
  // Names the agent in errors and logs.
  std::string agent_name;
  size_t num_io_threads = 1;  // at least one runs
  // Every connection's reader: frame limits and where received tensors go.
  wire::FrameLimits limits;
  wire::FrameReader::Allocate allocate;
  wire::FrameReader::Progress progress;  // may be null
  // The listener's port comes from this range when set (else the kernel
  // picks one).
  std::optional<PortRange> ports;
  // Mutual TLS on every connection when enabled(): connect() returns a
  // connection only after its handshake, and an accepted connection
  // reaches the accept callback only after its own. A handshake that
  // fails or takes longer than `handshake_timeout` is closed: on connect()
  // as a ConnectionError, on accept with a logged warning naming the peer.
  PipeTlsOptions tls;
  std::chrono::milliseconds handshake_timeout{10'000};
  // The ring each connection offers for the same-host lane (0: no lane;
  // never with TLS).
  size_t lane_capacity = 0;
};

// A transport whose connections report to `events`, which must outlive it.
// Threads start at listen(). Throws std::invalid_argument when the TLS
// files cannot be used (tls/tls_context.h).
std::unique_ptr<PipeTransport> make_tcp_transport(ConnectionEvents& events,
                                                  TcpTransportOptions options);

}  // namespace switchboard::agents::pipe::transport
