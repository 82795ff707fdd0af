#include "agents/pipe/transport/tls/tls_transport.h"

#include <spdlog/spdlog.h>

#include <future>
#include <set>
#include <string>
#include <utility>

#include "agents/pipe/transport/stream_transport.h"
#include "agents/pipe/transport/tls/tls_connection.h"
#include "agents/pipe/transport/tls/tls_context.h"
#include "common/error.h"
#include "common/mutex.h"

namespace switchboard::agents::pipe::transport {

namespace {

using boost::asio::ip::tcp;

class TlsTransport final : public StreamTransport {
 public:
  TlsTransport(ConnectionEvents& events, TransportOptions options)
      : StreamTransport(events, std::move(options)),
        context_(make_tls_context(options_.tls, options_.agent_name)) {}
  ~TlsTransport() override { stop_io(); }

  std::string_view name() const override { return "tls"; }

 private:
  std::shared_ptr<Connection> connected(tcp::socket socket,
                                        std::chrono::milliseconds timeout) override {
    std::shared_ptr<TlsConnection> connection = make_connection(std::move(socket));
    // The handshake runs on the connection's strand, bounded by its own
    // timer; a transport destroyed meanwhile breaks the promise.
    using Outcome = std::pair<std::string, bool>;
    auto outcome = std::make_shared<std::promise<Outcome>>();
    std::future<Outcome> done = outcome->get_future();
    connection->handshake(true, timeout, [outcome](const std::string& why, bool refused) {
      outcome->set_value({why, refused});
    });
    Outcome result;
    try {
      result = done.get();
    } catch (const std::future_error&) {
      result = {"the transport closed", false};
    }
    if (!result.first.empty()) {
      connection->close_now();
      // A certificate refused (by either side) is not a peer gone: the
      // caller must not treat it as one (a dynamic joiner drops members it
      // cannot reach).
      if (result.second)
        throw AuthenticationError("TLS handshake failed: " + result.first);
      throw ConnectionError("TLS handshake failed: " + result.first);
    }
    return connection;
  }

  // Hands an accepted connection over once its handshake succeeded.
  void accepted(tcp::socket socket) override {
    std::shared_ptr<TlsConnection> connection = make_connection(std::move(socket));
    {
      MutexLock lock(handshakes_mu_);
      handshaking_.insert(connection);
    }
    if (is_closing()) connection->close_now();
    connection->handshake(
        false, options_.handshake_timeout,
        [this, connection, peer = connection->remote_address()](const std::string& why,
                                                                bool) {
          {
            MutexLock lock(handshakes_mu_);
            handshaking_.erase(connection);
          }
          if (why.empty() && !is_closing()) {
            hand_over(connection);
            return;
          }
          connection->close_now();
          if (!is_closing()) {
            spdlog::warn(
                "rpc agent \"{}\": refused a connection from {}: TLS handshake "
                "failed: {}",
                options_.agent_name, peer, why);
          }
        });
  }

  // Handshakes still running would hold the I/O threads until their
  // timeout.
  void closing() override {
    MutexLock lock(handshakes_mu_);
    for (const auto& connection : handshaking_) connection->close_now();
  }

  std::shared_ptr<TlsConnection> make_connection(tcp::socket socket) {
    return std::make_shared<TlsConnection>(events_, std::move(socket), options_.limits,
                                           options_.allocate, options_.progress,
                                           context_);
  }

  const std::shared_ptr<boost::asio::ssl::context> context_;
  Mutex handshakes_mu_;
  // Accepted connections whose TLS handshake is still running.
  std::set<std::shared_ptr<TlsConnection>> handshaking_ SB_GUARDED_BY(handshakes_mu_);
};

}  // namespace

std::unique_ptr<PipeTransport> make_tls_transport(ConnectionEvents& events,
                                                  TransportOptions options) {
  return std::make_unique<TlsTransport>(events, std::move(options));
}

}  // namespace switchboard::agents::pipe::transport
