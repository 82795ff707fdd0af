#include "agents/pipe/transport/tcp/tcp_transport.h"

#include <fmt/format.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <cerrno>
#include <future>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "agents/pipe/transport/tcp/tcp_connection.h"
#include "agents/pipe/transport/tls/tls_connection.h"
#include "agents/pipe/transport/tls/tls_context.h"
#include "common/check.h"
#include "common/error.h"
#include "common/mutex.h"

namespace switchboard::agents::pipe::transport {

namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

// The transport's state is the io_context's: the acceptor and the timers
// run on `strand_`, connections on strands of their own. Everything here
// is touched by the owner's thread only before the I/O threads start
// (listen()) or after they are joined, and otherwise on `strand_`.
class TcpTransport final : public PipeTransport {
 public:
  TcpTransport(ConnectionEvents& events, TcpTransportOptions options)
      : events_(events),
        options_(std::move(options)),
        work_(asio::make_work_guard(io_)),
        strand_(asio::make_strand(io_)),
        acceptor_(strand_) {
    if (options_.tls.enabled())
      tls_ = make_tls_context(options_.tls, options_.agent_name);
  }

  // Stops the io_context (pending handlers are dropped, not run) and joins
  // the I/O threads.
  ~TcpTransport() override {
    work_.reset();
    io_.stop();
    join();
  }

  void listen(const std::string& address, OnAccept on_accept) override {
    boost::system::error_code error;
    const auto ip = asio::ip::make_address(address, error);
    SB_REQUIRE(!error, "PIPE agent \"{}\": cannot parse listen address \"{}\": {}",
               options_.agent_name, address, error.message());
    acceptor_.open(tcp::endpoint(ip, 0).protocol());
    acceptor_.set_option(tcp::acceptor::reuse_address(true));
    if (options_.ports) {
      // A port of the range (SWITCHBOARD_PORT_RANGE), the first one free.
      try {
        bind_in_range(
            *options_.ports,
            fmt::format("PIPE agent \"{}\" on {}", options_.agent_name, address),
            [&](uint16_t port) {
              boost::system::error_code e;
              acceptor_.bind(tcp::endpoint(ip, port), e);
              return e ? e.message() : std::string();
            });
      } catch (const std::runtime_error& e) {
        throw ConnectionError(e.what());
      }
    } else {
      acceptor_.bind(tcp::endpoint(ip, 0), error);
      if (error) {
        throw ConnectionError(fmt::format("PIPE agent \"{}\": cannot listen on {}: {}",
                                          options_.agent_name, address, error.message()));
      }
    }
    acceptor_.listen(asio::socket_base::max_listen_connections);
    address_ = address;
    port_ = acceptor_.local_endpoint().port();
    on_accept_ = std::move(on_accept);
    accept_next();
    for (size_t i = 0; i < std::max<size_t>(1, options_.num_io_threads); ++i) {
      threads_.emplace_back([this] { io_.run(); });
    }
  }

  const std::string& address() const override { return address_; }
  int port() const override { return port_; }

  std::shared_ptr<Connection> connect(const std::string& address, int port,
                                      std::chrono::milliseconds timeout) override {
    tcp::socket socket(io_);
    boost::system::error_code error;
    const tcp::endpoint endpoint(asio::ip::make_address(address, error),
                                 static_cast<uint16_t>(port));
    if (error) throw ConnectionError(error.message());
    // A non-blocking connect, waited for with poll() up to `timeout`. The
    // system call itself, not Asio's synchronous connect(), which waits
    // without a limit even on a non-blocking socket (a peer whose packets
    // vanish, behind a cut link with its address already resolved, held a
    // join for the kernel's two minutes of SYN retries).
    socket.open(endpoint.protocol(), error);
    if (!error) socket.non_blocking(true, error);
    if (error) throw ConnectionError(error.message());
    if (::connect(socket.native_handle(), endpoint.data(),
                  static_cast<socklen_t>(endpoint.size())) != 0) {
      error = boost::system::error_code(errno, boost::system::system_category());
    }
    if (error == asio::error::would_block || error == asio::error::in_progress) {
      pollfd fd{socket.native_handle(), POLLOUT, 0};
      int rc = 0;
      const auto deadline = std::chrono::steady_clock::now() + timeout;
      do {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now());
        rc = ::poll(&fd, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
      } while (rc < 0 && errno == EINTR);
      if (rc == 0) {
        throw ConnectionError(fmt::format("no answer within {} ms", timeout.count()));
      }
      int so_error = 0;
      socklen_t length = sizeof(so_error);
      ::getsockopt(socket.native_handle(), SOL_SOCKET, SO_ERROR, &so_error, &length);
      error = boost::system::error_code(rc < 0 ? errno : so_error,
                                        boost::system::system_category());
    }
    if (error) throw ConnectionError(error.message());
    socket.non_blocking(false, error);
    if (error) throw ConnectionError(error.message());
    if (!tls_) return make_connection(std::move(socket));
    std::shared_ptr<TlsConnection> connection = make_tls_connection(std::move(socket));
    {
      // The handshake runs on the connection's strand, bounded by its own
      // timer; a transport destroyed meanwhile breaks the promise.
      using Outcome = std::pair<std::string, bool>;
      auto outcome = std::make_shared<std::promise<Outcome>>();
      std::future<Outcome> done = outcome->get_future();
      connection->handshake(true, timeout,
                            [outcome](const std::string& why, bool refused) {
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
        // caller must not treat it as one (a dynamic joiner drops members
        // it cannot reach).
        if (result.second)
          throw AuthenticationError("TLS handshake failed: " + result.first);
        throw ConnectionError("TLS handshake failed: " + result.first);
      }
    }
    return connection;
  }

  void every(std::chrono::milliseconds interval, std::function<bool()> tick) override {
    asio::post(strand_, [this, interval, tick = std::move(tick)]() mutable {
      if (closed_) return;
      auto timer = std::make_shared<asio::steady_timer>(strand_);
      timers_.push_back(timer);
      arm(std::move(timer), interval, std::move(tick));
    });
  }

  void close() override {
    closing_ = true;
    {
      // Handshakes still running would hold the I/O threads until their
      // timeout.
      MutexLock lock(handshakes_mu_);
      for (const auto& connection : handshaking_) connection->close_now();
    }
    asio::post(strand_, [this] {
      closed_ = true;
      boost::system::error_code ignored;
      acceptor_.close(ignored);
      for (auto& timer : timers_) timer->cancel();
    });
  }

  void join() override {
    work_.reset();
    for (auto& thread : threads_) {
      if (thread.joinable()) thread.join();
    }
    // The same-host lane's threads report to the events too, and a
    // connection may outlive this transport (a reference held elsewhere):
    // they are done before the events may go.
    std::vector<std::weak_ptr<TcpConnection>> made;
    {
      MutexLock lock(made_mu_);
      made.swap(made_);
    }
    for (const auto& weak : made) {
      if (std::shared_ptr<TcpConnection> connection = weak.lock())
        connection->join_lane();
    }
  }

 private:
  std::shared_ptr<TcpConnection> make_connection(tcp::socket socket) {
    auto connection = std::make_shared<TcpConnection>(
        events_, std::move(socket), options_.limits, options_.allocate, options_.progress,
        options_.lane_capacity);
    if (options_.lane_capacity > 0) {
      MutexLock lock(made_mu_);
      std::erase_if(made_,
                    [](const std::weak_ptr<TcpConnection>& w) { return w.expired(); });
      made_.push_back(connection);
    }
    return connection;
  }

  std::shared_ptr<TlsConnection> make_tls_connection(tcp::socket socket) {
    return std::make_shared<TlsConnection>(events_, std::move(socket), options_.limits,
                                           options_.allocate, options_.progress, tls_);
  }

  // Hands an accepted connection to the agent, after its TLS handshake
  // when there is TLS.
  void accepted(tcp::socket socket) {
    if (!tls_) {
      on_accept_(make_connection(std::move(socket)));
      return;
    }
    std::shared_ptr<TlsConnection> connection = make_tls_connection(std::move(socket));
    {
      MutexLock lock(handshakes_mu_);
      handshaking_.insert(connection);
    }
    if (closing_) connection->close_now();
    connection->handshake(
        false, options_.handshake_timeout,
        [this, connection, peer = connection->remote_address()](const std::string& why,
                                                                bool) {
          {
            MutexLock lock(handshakes_mu_);
            handshaking_.erase(connection);
          }
          if (why.empty() && !closing_) {
            on_accept_(connection);
            return;
          }
          connection->close_now();
          if (!closing_) {
            spdlog::warn(
                "rpc agent \"{}\": refused a connection from {}: TLS handshake "
                "failed: {}",
                options_.agent_name, peer, why);
          }
        });
  }

  // Strand only.
  void accept_next() {
    acceptor_.async_accept(
        [this](const boost::system::error_code& error, tcp::socket socket) {
          if (error) {
            if (error != asio::error::operation_aborted) {
              spdlog::warn("rpc agent \"{}\": accept failed: {}", options_.agent_name,
                           error.message());
            }
            if (!acceptor_.is_open()) return;
          } else {
            accepted(std::move(socket));
          }
          accept_next();
        });
  }

  // Strand only.
  void arm(std::shared_ptr<asio::steady_timer> timer, std::chrono::milliseconds interval,
           std::function<bool()> tick) {
    timer->expires_after(interval);
    auto* raw = timer.get();
    raw->async_wait([this, timer = std::move(timer), interval,
                     tick = std::move(tick)](const boost::system::error_code& e) mutable {
      if (e || closed_ || !tick()) return;
      arm(std::move(timer), interval, std::move(tick));
    });
  }

  ConnectionEvents& events_;
  const TcpTransportOptions options_;
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  asio::strand<asio::io_context::executor_type> strand_;
  tcp::acceptor acceptor_;                                   // strand only once listening
  std::string address_;                                      // written by listen()
  int port_ = 0;                                             // written by listen()
  OnAccept on_accept_;                                       // written by listen()
  bool closed_ = false;                                      // strand only
  std::vector<std::shared_ptr<asio::steady_timer>> timers_;  // strand only
  std::vector<std::thread> threads_;                         // owner's thread
  std::shared_ptr<asio::ssl::context> tls_;                  // null: plain TCP
  std::atomic<bool> closing_{false};
  // Every connection with a lane this transport made, for join().
  Mutex made_mu_;
  std::vector<std::weak_ptr<TcpConnection>> made_ SB_GUARDED_BY(made_mu_);
  Mutex handshakes_mu_;
  // Accepted connections whose TLS handshake is still running.
  std::set<std::shared_ptr<TlsConnection>> handshaking_ SB_GUARDED_BY(handshakes_mu_);
};

}  // namespace

std::unique_ptr<PipeTransport> make_tcp_transport(ConnectionEvents& events,
                                                  TcpTransportOptions options) {
  return std::make_unique<TcpTransport>(events, std::move(options));
}

}  // namespace switchboard::agents::pipe::transport
