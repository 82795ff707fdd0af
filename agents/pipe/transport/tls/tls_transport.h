// The tls transport (transport.h): mutual TLS over TCP
// (tls/tls_connection.h), with the certificates of options.tls. No
// same-host lane: its bytes would bypass the session. Registered in the
// transport registry (registry.h), where it is chosen over tcp whenever a
// worker has certificates; every transport passes one conformance suite
// (tests/agents/pipe/transport/conformance_test.cc). Internal to the PIPE
// agent; this header keeps Asio out of the files that include it.
#pragma once

#include <memory>

#include "agents/pipe/transport/connection.h"
#include "agents/pipe/transport/options.h"
#include "agents/pipe/transport/transport.h"

namespace switchboard::agents::pipe::transport {

// A transport whose connections report to `events`, which must outlive it.
// Threads start at listen(). Throws std::invalid_argument when the TLS
// files cannot be used (tls/tls_context.h).
std::unique_ptr<PipeTransport> make_tls_transport(ConnectionEvents& events,
                                                  TransportOptions options);

}  // namespace switchboard::agents::pipe::transport
