#include "store/tcp_store_server.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <thread>
#include <utility>

#include "common/error.h"
#include "common/mutex.h"
#include "store/tcp_server_connection.h"

namespace switchboard {

namespace asio = boost::asio;
using asio::ip::tcp;
using tcpstore::ClientId;
using tcpstore::Connection;

// The listener, the loop thread and the shared connection context. Every
// member but the atomics in context_ and the stop bookkeeping is used only
// on the loop thread once the constructor returns.
class TcpStoreServer::Impl {
 public:
  explicit Impl(TcpStoreServerOptions options);
  ~Impl() { stop(); }

  void stop() SB_EXCLUDES(stop_mutex_);
  uint16_t port() const { return port_; }
  const std::string& host() const { return options_.host; }
  const tcpstore::ServerContext& context() const { return context_; }

 private:
  tcp::endpoint resolve();
  void listen(const tcp::endpoint& endpoint);
  void accept();
  void on_accept(const boost::system::error_code& error, tcp::socket socket);
  void run();
  void close_all();

  const TcpStoreServerOptions options_;
  asio::io_context io_{1};
  tcp::acceptor acceptor_{io_};
  asio::steady_timer retry_timer_{io_};
  tcpstore::ServerContext context_;
  ClientId next_client_id_ = 1;
  uint16_t port_ = 0;
  bool stopping_ = false;  // on the loop thread: no more accepts

  Mutex stop_mutex_;
  bool stopped_ SB_GUARDED_BY(stop_mutex_) = false;
  // Started by the constructor; joined by stop().
  std::thread thread_ SB_GUARDED_BY(stop_mutex_);
};

TcpStoreServer::Impl::Impl(TcpStoreServerOptions options) : options_(std::move(options)) {
  context_.limits = options_.limits;
  context_.log_connections = options_.log_connections;
  context_.secret = options_.secret;
  context_.handshake_timeout = options_.handshake_timeout;
  const tcp::endpoint endpoint = resolve();
  listen(endpoint);
  if (!options_.secret && !endpoint.address().is_loopback()) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      spdlog::warn("store server: listening on {} without a job secret: anyone who can reach "
                   "port {} can read, change and delete the job's keys (set {} or "
                   "--secret-file; docs/security.md)",
                   options_.host, port_, Secret::kEnvironmentVariable);
    }
  }
  accept();
  thread_ = std::thread([this] { run(); });
}

tcp::endpoint TcpStoreServer::Impl::resolve() {
  boost::system::error_code error;
  auto address = asio::ip::make_address(options_.host, error);
  if (!error) return tcp::endpoint(address, options_.port);
  // A host name ("localhost"): the first address it resolves to.
  tcp::resolver resolver(io_);
  auto results = resolver.resolve(options_.host, std::to_string(options_.port),
                                  tcp::resolver::passive, error);
  if (error || results.empty()) {
    throw ConnectionError(fmt::format("store server: cannot resolve {}:{}: {}",
                                      options_.host, options_.port,
                                      error ? error.message() : "no address"));
  }
  return results.begin()->endpoint();
}

void TcpStoreServer::Impl::listen(const tcp::endpoint& endpoint) {
  boost::system::error_code error;
  auto check = [&](const char* step) {
    if (!error) return;
    throw ConnectionError(fmt::format("store server: cannot listen on {}:{}: {} failed: {}",
                                      options_.host, options_.port, step,
                                      error.message()));
  };
  acceptor_.open(endpoint.protocol(), error);
  check("socket");
  acceptor_.set_option(asio::socket_base::reuse_address(true), error);
  check("SO_REUSEADDR");
  if (endpoint.address().is_v6() && endpoint.address().is_unspecified()) {
    // "::" serves IPv4 clients too, as PyTorch's server does.
    acceptor_.set_option(asio::ip::v6_only(false), error);
    check("IPV6_V6ONLY");
  }
  acceptor_.bind(endpoint, error);
  check("bind");
  acceptor_.listen(options_.backlog, error);
  check("listen");
  port_ = acceptor_.local_endpoint(error).port();
  check("getsockname");
}

void TcpStoreServer::Impl::accept() {
  acceptor_.async_accept([this](const boost::system::error_code& error, tcp::socket socket) {
    on_accept(error, std::move(socket));
  });
}

void TcpStoreServer::Impl::on_accept(const boost::system::error_code& error,
                                     tcp::socket socket) {
  if (stopping_ || error == asio::error::operation_aborted) return;
  if (error) {
    // Out of descriptors or memory: back off instead of spinning.
    spdlog::warn("store server: accept on port {} failed: {}", port_, error.message());
    retry_timer_.expires_after(std::chrono::milliseconds(100));
    retry_timer_.async_wait([this](const boost::system::error_code& wait_error) {
      if (!wait_error && !stopping_) accept();
    });
    return;
  }
  boost::system::error_code ignored;
  socket.set_option(tcp::no_delay(true), ignored);
  std::make_shared<Connection>(context_, std::move(socket), next_client_id_++)->start();
  accept();
}

void TcpStoreServer::Impl::run() {
  // A handler that throws (out of memory) must not end the server silently.
  for (;;) {
    try {
      io_.run();
      return;
    } catch (const std::exception& e) {
      spdlog::error("store server: port {}: unexpected error: {}", port_, e.what());
    }
  }
}

void TcpStoreServer::Impl::close_all() {
  stopping_ = true;
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  retry_timer_.cancel();
  auto connections = std::move(context_.connections);
  context_.connections.clear();
  for (auto& [id, connection] : connections) connection->close("server stopping");
}

void TcpStoreServer::Impl::stop() {
  MutexLock lock(stop_mutex_);
  if (stopped_) return;
  stopped_ = true;
  // Once every socket is closed the loop has no work left and run() returns.
  asio::post(io_, [this] { close_all(); });
  if (thread_.joinable()) thread_.join();
}

TcpStoreServer::TcpStoreServer(TcpStoreServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

TcpStoreServer::~TcpStoreServer() { stop(); }

uint16_t TcpStoreServer::port() const { return impl_->port(); }
const std::string& TcpStoreServer::host() const { return impl_->host(); }
void TcpStoreServer::stop() { impl_->stop(); }

size_t TcpStoreServer::num_connections() const {
  return impl_->context().num_connections.load();
}
uint64_t TcpStoreServer::total_connections() const {
  return impl_->context().total_connections.load();
}
uint64_t TcpStoreServer::protocol_errors() const {
  return impl_->context().protocol_errors.load();
}
uint64_t TcpStoreServer::auth_failures() const {
  return impl_->context().auth_failures.load();
}
size_t TcpStoreServer::num_keys() const { return impl_->context().num_keys.load(); }

}  // namespace switchboard
