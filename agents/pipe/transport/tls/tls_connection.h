// TlsConnection: the tls transport's Connection (agents/pipe/transport/connection.h):
// a TLS session over one TCP socket, with mutual certificates
// (tls/tls_context.h). Every byte goes through the session, which
// handshake() opens before anything else is sent or read; writes are
// driven from the strand alone (no sends from the caller's thread) and
// there is no same-host lane (its bytes would bypass the session).
// Made by the tls transport (tls/tls_transport.h). Internal to the PIPE
// agent's transports.
//
// Thread safety: as Connection; the session is touched on the strand only.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "agents/pipe/transport/stream_connection.h"

namespace switchboard::agents::pipe::transport {

class TlsConnection final : public StreamConnection {
 public:
  // As TcpConnection, over a TLS session on `context` (shared by every
  // connection of the transport).
  TlsConnection(ConnectionEvents& events, boost::asio::ip::tcp::socket socket,
                const wire::FrameLimits& limits, wire::FrameReader::Allocate allocate,
                wire::FrameReader::Progress progress,
                std::shared_ptr<boost::asio::ssl::context> context);

  // Once, before start_reading(): runs the handshake as the client or the
  // server and calls `done` on the strand with an empty string, or why it
  // failed (OpenSSL's reason, the certificate check's, or that `timeout`
  // passed; the socket is then closed) and whether TLS itself refused (a
  // certificate, an alert from the peer) rather than the connection
  // failing or falling silent.
  using HandshakeDone = std::function<void(const std::string& why, bool refused)>;
  void handshake(bool client, std::chrono::milliseconds timeout, HandshakeDone done);

 private:
  void async_write(const std::vector<boost::asio::const_buffer>& buffers,
                   IoDone done) override;
  void async_read_some(boost::asio::mutable_buffer buffer, IoDone done) override;
  bool is_end(const boost::system::error_code& error) const override;

  std::shared_ptr<boost::asio::ssl::context> context_;
  boost::asio::ssl::stream<boost::asio::ip::tcp::socket&> stream_;  // strand only
  bool handshake_timed_out_ = false;                                // strand only
};

}  // namespace switchboard::agents::pipe::transport
