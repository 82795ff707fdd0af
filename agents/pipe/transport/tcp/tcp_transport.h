// The tcp transport (transport.h): plain TCP connections
// (tcp/tcp_connection.h), each of which may hand its frames to the
// same-host lane (shm/shm_lane.h: the shm transport, which upgrades a tcp
// connection once both sides agree) when options.lane_capacity is set.
// Registered in the transport registry (registry.h); every transport passes
// one conformance suite (tests/agents/pipe/transport/conformance_test.cc).
// Internal to the PIPE agent; this header keeps Asio out of the files that
// include it.
#pragma once

#include <memory>

#include "agents/pipe/transport/connection.h"
#include "agents/pipe/transport/options.h"
#include "agents/pipe/transport/transport.h"

namespace switchboard::agents::pipe::transport {

// A transport whose connections report to `events`, which must outlive it.
// Threads start at listen(). Ignores options.tls.
std::unique_ptr<PipeTransport> make_tcp_transport(ConnectionEvents& events,
                                                  TransportOptions options);

}  // namespace switchboard::agents::pipe::transport
