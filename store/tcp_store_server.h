// TcpStoreServer: the rendezvous server behind TcpStore, wire-compatible
// with PyTorch 1.13's TCPStore (see store/tcp_protocol.h and
// docs/wire_formats.md), plus APPEND, MULTI_GET, MULTI_SET and
// CANCEL_WAIT with the codes later PyTorch versions use.
//
// One Boost.Asio event loop on one thread serves every connection. Each
// connection is parsed as a byte stream (any fragmentation, pipelining);
// requests of a connection are applied in order, each atomically. WAIT and
// the WAIT inside a client's get() are parked on the server and woken by the
// write that creates their keys: there is no polling.
//
// Authentication: a server given a job secret (common/auth.h) requires
// every connection to prove it before its first request (mutual
// challenge-response, HMAC-SHA256 over both sides' nonces: the handshake in
// store/tcp_protocol.h), within handshake_timeout. A connection that does
// not is closed with a warning naming its address, and counted
// (auth_failures()). Without a secret the server speaks PyTorch's protocol
// byte for byte, and warns once per process when it listens on an address
// that is not loopback.
//
// Bad input (an unknown query type, a length over the limits, GET of a
// missing key, ADD on a non-integer) closes that one connection with a
// logged reason; the server keeps serving everyone else and loses no key.
// The server never allocates more than the bytes a client actually sent.
//
// Thread safety: the constructor, stop() and the accessors may be called
// from any thread; stop() and the destructor must not run on the server's
// own loop thread. Ownership: the server owns its sockets, its thread and
// the stored keys; everything is released by stop().
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/auth.h"
#include "store/tcp_protocol.h"

namespace switchboard {

struct TcpStoreServerOptions {
  // Address to listen on: "127.0.0.1" (default), "0.0.0.0", "::" (dual
  // stack, as PyTorch's server binds) or any local address.
  std::string host = "127.0.0.1";
  // 0 picks an ephemeral port; port() tells which.
  uint16_t port = 0;
  int backlog = 2048;
  // Caps on what a request may announce (key/value sizes, key counts).
  tcpstore::Limits limits;
  // Log one line per connection open/close (protocol errors are always
  // logged). The standalone store_server turns this on.
  bool log_connections = false;
  // The job secret every client must prove (null: none, PyTorch's
  // protocol), and how long a client may take to.
  std::shared_ptr<const Secret> secret;
  std::chrono::milliseconds handshake_timeout{10'000};
};

class TcpStoreServer {
 public:
  // Binds, listens and starts the loop thread. Throws ConnectionError naming
  // the host and port when binding fails.
  explicit TcpStoreServer(TcpStoreServerOptions options = {});
  // Calls stop().
  ~TcpStoreServer();

  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  // The port actually bound (the ephemeral one when options.port was 0).
  uint16_t port() const;
  const std::string& host() const;

  // Closes the listener and every connection and joins the loop thread.
  // Idempotent. Clients blocked on the server get a connection error.
  void stop();

  // Statistics, safe from any thread; for tests, the tool and benchmarks.
  size_t num_connections() const;        // open right now
  uint64_t total_connections() const;    // accepted since start
  uint64_t protocol_errors() const;      // connections closed for bad input
  uint64_t auth_failures() const;        // connections refused: no or wrong proof, too slow
  size_t num_keys() const;               // keys stored right now

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace switchboard
