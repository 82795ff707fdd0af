// One client connection of TcpStoreServer, and the state every connection
// shares. Private to the server (Asio appears here, never in
// tcp_store_server.h).
//
// A Connection reads into its RequestStream, applies every complete request
// to the shared ServerState in arrival order, and sends what the state
// appended to its output with one async_write per batch. While a write is
// in flight new messages queue in a second buffer (double buffering), so
// there is one write at a time and messages never interleave.
//
// Closing: bad input closes the connection after the replies already queued
// have been sent (as torch's server sends each reply before it reads the
// next request); end of stream from the peer does the same; a read or write
// error and server stop close at once. Closing removes the client from the
// state first, so no WAIT or watch refers to a closed connection.
//
// Thread safety: everything here runs on the server's loop thread, except
// the atomic statistics in ServerContext, which any thread may read.
// Lifetime: a Connection is owned by shared_ptrs: ServerContext::connections
// while open, and each pending Asio handler.
#pragma once

#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "common/auth.h"
#include "store/tcp_protocol.h"
#include "store/tcp_server_state.h"
#include "store/tcp_server_stream.h"

namespace switchboard::tcpstore {

class Connection;

// What the server's connections share; owned by the server, used on its
// loop thread (the atomics from any thread).
struct ServerContext {
  ServerState state;
  Limits limits;
  bool log_connections = false;
  // With a secret, every connection authenticates before its first request
  // (tcp_protocol.h), within handshake_timeout.
  std::shared_ptr<const Secret> secret;
  std::chrono::milliseconds handshake_timeout{10'000};
  // Open connections, so stop() can close them.
  std::unordered_map<ClientId, std::shared_ptr<Connection>> connections;

  std::atomic<size_t> num_connections{0};
  std::atomic<uint64_t> total_connections{0};
  std::atomic<uint64_t> protocol_errors{0};
  std::atomic<uint64_t> auth_failures{0};  // refused, or too slow to prove
  std::atomic<size_t> num_keys{0};
};

class Connection final : public Peer, public std::enable_shared_from_this<Connection> {
 public:
  // Takes an accepted socket; registers nothing until start().
  Connection(ServerContext& context, boost::asio::ip::tcp::socket socket, ClientId id);
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Registers with the context and the state and starts reading.
  void start();
  // Closes the socket at once (pending output is dropped) and unregisters.
  // Idempotent.
  void close(const std::string& why);

  const std::string& peer_name() const { return peer_name_; }

  // Peer: the state appends messages here.
  Bytes& output() override { return output_; }
  void flush() override;

 private:
  void read();
  void on_read(const boost::system::error_code& error, size_t size);
  void process();
  void on_end_of_stream();
  // The handshake on the bytes buffered so far: true once authenticated
  // (the rest are requests), false while it needs more bytes or after it
  // failed (the connection is closing).
  bool authenticate();
  void refuse(const std::string& reason);
  void fail(const std::string& reason);
  void close_after_output(const std::string& why);
  void write();
  void on_write(const boost::system::error_code& error);

  ServerContext& context_;
  boost::asio::ip::tcp::socket socket_;
  const ClientId id_;
  std::string peer_name_;
  RequestStream stream_;
  Request request_;  // reused for every request
  std::string error_;

  // The handshake: authenticated at once without a secret.
  bool authenticated_ = false;
  bool challenged_ = false;  // the server's nonce and proof went out
  Nonce client_nonce_{};
  Nonce server_nonce_{};
  boost::asio::steady_timer handshake_timer_;

  Bytes output_;   // messages queued behind the write in flight
  Bytes sending_;  // the bytes of the write in flight
  bool reading_ = false;     // an async_read_some is pending
  bool writing_ = false;     // an async_write is pending
  bool processing_ = false;  // inside process(): the batch is written after
  bool draining_ = false;    // close once the queued output is sent
  std::string drain_reason_;
  bool closed_ = false;
};

// "127.0.0.1:5000" or "[::1]:5000"; "unknown peer" when the socket has none.
std::string endpoint_name(const boost::asio::ip::tcp::endpoint& endpoint);

}  // namespace switchboard::tcpstore
