#include "agents/pipe/transport/tls/tls_connection.h"

#include <fmt/format.h>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include "agents/pipe/transport/tls/tls_context.h"

namespace switchboard::agents::pipe::transport {

namespace asio = boost::asio;
using asio::ip::tcp;

TlsConnection::TlsConnection(ConnectionEvents& events, tcp::socket socket,
                             const wire::FrameLimits& limits,
                             wire::FrameReader::Allocate allocate,
                             wire::FrameReader::Progress progress,
                             std::shared_ptr<asio::ssl::context> context)
    : StreamConnection(events, std::move(socket), limits, std::move(allocate),
                       std::move(progress)),
      context_(std::move(context)),
      stream_(socket_, *context_) {}

void TlsConnection::async_write(const std::vector<asio::const_buffer>& buffers,
                                IoDone done) {
  asio::async_write(stream_, buffers, std::move(done));
}

void TlsConnection::async_read_some(asio::mutable_buffer buffer, IoDone done) {
  stream_.async_read_some(buffer, std::move(done));
}

bool TlsConnection::is_end(const boost::system::error_code& error) const {
  // A TLS peer that closes its socket without a close_notify reads as a
  // truncated stream: to the agent, the same end.
  return error == asio::error::eof || error == asio::ssl::error::stream_truncated;
}

void TlsConnection::handshake(bool client, std::chrono::milliseconds timeout,
                              HandshakeDone done) {
  auto self = std::static_pointer_cast<TlsConnection>(shared_from_this());
  asio::post(strand_, [self, client, timeout, done = std::move(done)]() mutable {
    // A peer that says nothing is cut off at `timeout`: the socket closes
    // under the handshake, which then fails.
    auto timer = std::make_shared<asio::steady_timer>(self->strand_);
    timer->expires_after(timeout);
    timer->async_wait([self, timer](const boost::system::error_code& error) {
      if (error) return;
      self->handshake_timed_out_ = true;
      boost::system::error_code ignored;
      self->socket_.close(ignored);
    });
    self->stream_.async_handshake(
        client ? asio::ssl::stream_base::client : asio::ssl::stream_base::server,
        asio::bind_executor(self->strand_, [self, timer, timeout, done = std::move(done)](
                                               const boost::system::error_code& error) {
          timer->cancel();
          if (!error && !self->handshake_timed_out_) {
            done("", false);
          } else if (self->handshake_timed_out_) {
            done(fmt::format("no TLS handshake within {} ms", timeout.count()), false);
          } else {
            done(tls_failure_reason(error, self->stream_.native_handle()),
                 error.category() == asio::error::get_ssl_category());
          }
        }));
  });
}

}  // namespace switchboard::agents::pipe::transport
