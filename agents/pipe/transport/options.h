// TransportOptions: what every PIPE transport is made with (the agent's
// transport settings), whichever the registry (registry.h) chooses. Plain
// values; no Asio. Internal to //agents/pipe.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>

#include "agents/pipe/transport/tls/tls_options.h"
#include "agents/pipe/wire/frame.h"
#include "common/listen_address.h"

namespace switchboard::agents::pipe::transport {

struct TransportOptions {
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
  // The certificates of mutual TLS: with them (enabled()) the tls
  // transport is the one chosen. Its connect() returns a connection only
  // after the handshake, and an accepted connection reaches the accept
  // callback only after its own. A handshake that fails or takes longer
  // than `handshake_timeout` is closed: on connect() as a ConnectionError
  // (AuthenticationError when TLS refused a certificate), on accept with a
  // logged warning naming the peer.
  PipeTlsOptions tls;
  std::chrono::milliseconds handshake_timeout{10'000};
  // The ring each connection offers for the same-host lane (the shm
  // transport, which upgrades a tcp connection; 0: no lane). The registry
  // sets it to 0 where the lane cannot go (inside TLS).
  size_t lane_capacity = 0;
};

}  // namespace switchboard::agents::pipe::transport
