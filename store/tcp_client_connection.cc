#include "store/tcp_client_connection.h"

#include <fmt/format.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <cstring>
#include <thread>

#include "common/error.h"
#include "store/tcp_protocol.h"

namespace switchboard::tcpstore {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;

Deadline deadline_after(std::chrono::milliseconds timeout) {
  if (timeout == Store::kNoTimeout) return Deadline::max();
  return Clock::now() + timeout;
}

// An Asio socket on a private io_context, driven synchronously: each
// operation starts an async op and runs the context until it completes or
// the deadline passes (then the op is cancelled).
class ClientConnection::Socket {
 public:
  Socket() : socket_(io_) {}

  // Returns the error, or asio::error::timed_out.
  template <typename Start>
  error_code run(Start&& start, Deadline deadline, size_t* transferred = nullptr) {
    error_code result = asio::error::would_block;
    size_t bytes = 0;
    start([&](const error_code& ec, size_t n = 0) {
      result = ec;
      bytes = n;
    });
    io_.restart();
    if (deadline == Deadline::max()) {
      io_.run();
    } else {
      io_.run_until(deadline);
    }
    if (result == asio::error::would_block) {
      error_code ignored;
      socket_.cancel(ignored);
      io_.restart();
      io_.run();  // lets the cancelled handler run
      result = asio::error::timed_out;
    }
    if (transferred != nullptr) *transferred = bytes;
    return result;
  }

  asio::io_context io_;
  tcp::socket socket_;
  // Bytes read from the socket but not yet consumed.
  std::vector<uint8_t> buffer_ = std::vector<uint8_t>(64 * 1024);
  size_t begin_ = 0;
  size_t end_ = 0;
};

ClientConnection::ClientConnection(std::string host, uint16_t port)
    : host_(std::move(host)), port_(port) {}

ClientConnection::~ClientConnection() = default;

std::string ClientConnection::address() const {
  return fmt::format("{}:{}", host_, port_);
}

bool ClientConnection::is_open() const { return socket_ != nullptr; }

void ClientConnection::close() { socket_.reset(); }

void ClientConnection::fail(const std::string& what, const std::string& reason) {
  close();
  throw ConnectionError(
      fmt::format("TcpStore {} {}: {}", what, address(), reason));
}

void ClientConnection::ensure_open(Deadline deadline) {
  if (socket_) return;
  peer_closed_ = false;
  auto backoff = std::chrono::milliseconds(10);
  std::string last_error = "no attempt made";
  for (;;) {
    auto socket = std::make_unique<Socket>();
    error_code ec;
    tcp::resolver resolver(socket->io_);
    auto endpoints = resolver.resolve(host_, std::to_string(port_), ec);
    if (!ec) {
      ec = socket->run([&](auto handler) {
        asio::async_connect(socket->socket_, endpoints,
                            [handler](const error_code& e, const tcp::endpoint&) mutable {
                              handler(e);
                            });
      }, deadline);
    }
    if (!ec) {
      socket->socket_.set_option(tcp::no_delay(true), ec);
      socket_ = std::move(socket);
      return;
    }
    last_error = ec.message();
    // Only "not listening yet" is worth retrying; the deadline bounds it.
    if (Clock::now() + backoff >= deadline) {
      throw ConnectionError(fmt::format(
          "TcpStore could not connect to {} before its timeout: {}", address(),
          last_error));
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
}

void ClientConnection::write(const Bytes& data, Deadline deadline) {
  if (!socket_) fail("write to", "connection is closed");
  error_code ec = socket_->run([&](auto handler) {
    asio::async_write(socket_->socket_, asio::buffer(data), handler);
  }, deadline);
  if (ec == asio::error::timed_out) {
    close();
    throw TimeoutError(fmt::format("TcpStore write to {} timed out", address()));
  }
  if (ec) fail("write to", ec.message());
}

void ClientConnection::read(void* out, size_t size, Deadline deadline) {
  if (!socket_) fail("read from", "connection is closed");
  auto* dst = static_cast<uint8_t*>(out);
  while (size > 0) {
    Socket& s = *socket_;
    if (s.begin_ < s.end_) {
      size_t n = std::min(size, s.end_ - s.begin_);
      std::memcpy(dst, s.buffer_.data() + s.begin_, n);
      s.begin_ += n;
      dst += n;
      size -= n;
      continue;
    }
    // Large payloads go straight to their destination; small reads refill
    // the buffer so one syscall serves several fields.
    bool direct = size >= s.buffer_.size();
    size_t got = 0;
    error_code ec = s.run([&](auto handler) {
      if (direct) {
        s.socket_.async_read_some(asio::buffer(dst, size), handler);
      } else {
        s.socket_.async_read_some(asio::buffer(s.buffer_), handler);
      }
    }, deadline, &got);
    if (ec == asio::error::timed_out) {
      close();
      throw TimeoutError(fmt::format("TcpStore read from {} timed out", address()));
    }
    if (ec == asio::error::eof || ec == asio::error::connection_reset) {
      peer_closed_ = true;
      fail("read from", "the server closed the connection");
    }
    if (ec) fail("read from", ec.message());
    if (direct) {
      dst += got;
      size -= got;
    } else {
      s.begin_ = 0;
      s.end_ = got;
    }
  }
}

bool ClientConnection::wait_readable(Deadline deadline) {
  if (!socket_) fail("read from", "connection is closed");
  Socket& s = *socket_;
  if (s.begin_ < s.end_) return true;
  error_code ec = s.run([&](auto handler) {
    s.socket_.async_wait(tcp::socket::wait_read, handler);
  }, deadline);
  if (ec == asio::error::timed_out) return false;
  if (ec) fail("read from", ec.message());
  return true;
}

uint8_t ClientConnection::read_u8(Deadline deadline) {
  uint8_t value = 0;
  read(&value, 1, deadline);
  return value;
}

int64_t ClientConnection::read_i64(Deadline deadline) {
  uint8_t raw[8];
  read(raw, 8, deadline);
  return static_cast<int64_t>(load_u64(raw));
}

Bytes ClientConnection::read_bytes(Deadline deadline) {
  uint8_t raw[8];
  read(raw, 8, deadline);
  uint64_t size = load_u64(raw);
  // The server is trusted no further than the protocol's value limit.
  if (size > Limits{}.max_value_bytes) {
    fail("read from", fmt::format("reply announces {} bytes, over the limit", size));
  }
  Bytes value(size);
  read(value.data(), size, deadline);
  return value;
}

}  // namespace switchboard::tcpstore
