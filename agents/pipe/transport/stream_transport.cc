#include "agents/pipe/transport/stream_transport.h"

#include <fmt/format.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <utility>

#include "common/check.h"
#include "common/error.h"

namespace switchboard::agents::pipe::transport {

namespace asio = boost::asio;
using asio::ip::tcp;

StreamTransport::StreamTransport(ConnectionEvents& events, TransportOptions options)
    : events_(events),
      options_(std::move(options)),
      work_(asio::make_work_guard(io_)),
      strand_(asio::make_strand(io_)),
      acceptor_(strand_) {}

StreamTransport::~StreamTransport() { stop_io(); }

void StreamTransport::stop_io() {
  work_.reset();
  io_.stop();
  join();
}

void StreamTransport::listen(const std::string& address, OnAccept on_accept) {
  boost::system::error_code error;
  const auto ip = asio::ip::make_address(address, error);
  SB_REQUIRE(!error, "PIPE agent \"{}\": cannot parse listen address \"{}\": {}",
             options_.agent_name, address, error.message());
  acceptor_.open(tcp::endpoint(ip, 0).protocol());
  acceptor_.set_option(tcp::acceptor::reuse_address(true));
  if (options_.ports) {
    // A port of the range (SWITCHBOARD_PORT_RANGE), the first one free.
    try {
      bind_in_range(*options_.ports,
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

std::shared_ptr<Connection> StreamTransport::connect(const std::string& address, int port,
                                                     std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
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
  return connected(std::move(socket), timeout);
}

void StreamTransport::every(std::chrono::milliseconds interval,
                            std::function<bool()> tick) {
  asio::post(strand_, [this, interval, tick = std::move(tick)]() mutable {
    if (closed_) return;
    auto timer = std::make_shared<asio::steady_timer>(strand_);
    timers_.push_back(timer);
    arm(std::move(timer), interval, std::move(tick));
  });
}

void StreamTransport::close() {
  closing_ = true;
  closing();
  asio::post(strand_, [this] {
    closed_ = true;
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    for (auto& timer : timers_) timer->cancel();
  });
}

void StreamTransport::join() {
  work_.reset();
  for (auto& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
  joined();
}

void StreamTransport::accept_next() {
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

void StreamTransport::arm(std::shared_ptr<asio::steady_timer> timer,
                          std::chrono::milliseconds interval,
                          std::function<bool()> tick) {
  timer->expires_after(interval);
  auto* raw = timer.get();
  raw->async_wait([this, timer = std::move(timer), interval,
                   tick = std::move(tick)](const boost::system::error_code& e) mutable {
    if (e || closed_ || !tick()) return;
    arm(std::move(timer), interval, std::move(tick));
  });
}

}  // namespace switchboard::agents::pipe::transport
