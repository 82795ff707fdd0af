// RawTcpClient: a blocking POSIX socket to a TCPStore server, for tests that
// check the server's bytes exactly. Every read has a guard timeout
// (SO_RCVTIMEO, 30 s by default) so a server bug fails a test instead of
// hanging it; sends use MSG_NOSIGNAL so a closed server cannot kill the test.
//
// Also request encoders (over tcpstore::encode_request) and little-endian
// reply builders, so expectations read like the protocol notes.
//
// Not thread-safe; one test thread owns each client.
#pragma once

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "store/tcp_protocol.h"

namespace sbtest {

using switchboard::Bytes;
using switchboard::tcpstore::QueryType;

class RawTcpClient {
 public:
  explicit RawTcpClient(uint16_t port,
                        std::chrono::seconds guard = std::chrono::seconds(30)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd_ < 0) throw std::runtime_error(fmt::format("socket: {}", std::strerror(errno)));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      int error = errno;
      ::close(fd_);
      throw std::runtime_error(fmt::format("connect to port {}: {}", port,
                                           std::strerror(error)));
    }
    timeval timeout{static_cast<time_t>(guard.count()), 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  ~RawTcpClient() { close(); }
  RawTcpClient(const RawTcpClient&) = delete;
  RawTcpClient& operator=(const RawTcpClient&) = delete;

  void send(const Bytes& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw std::runtime_error(fmt::format("send: {}", std::strerror(errno)));
      sent += static_cast<size_t>(n);
    }
  }

  // Sends one byte per send() call.
  void send_bytewise(const Bytes& bytes) {
    for (uint8_t byte : bytes) send(Bytes{byte});
  }

  // Reads exactly `size` bytes; throws on EOF, error or the guard timeout.
  Bytes read(size_t size) {
    Bytes out(size);
    size_t got = 0;
    while (got < size) {
      ssize_t n = ::recv(fd_, out.data() + got, size - got, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n == 0) throw std::runtime_error(fmt::format("EOF after {} of {} bytes", got, size));
      if (n < 0) {
        throw std::runtime_error(fmt::format("recv after {} of {} bytes: {}", got, size,
                                             std::strerror(errno)));
      }
      got += static_cast<size_t>(n);
    }
    return out;
  }
  uint8_t read_u8() { return read(1)[0]; }
  int64_t read_i64() {
    return static_cast<int64_t>(switchboard::tcpstore::load_u64(read(8).data()));
  }
  Bytes read_value() {
    uint64_t size = switchboard::tcpstore::load_u64(read(8).data());
    return read(size);
  }

  // Reads until the server closes. Returns "eof" (or "reset") then, "data"
  // when bytes arrive instead, "timeout" after the guard.
  std::string read_close() {
    uint8_t byte;
    for (;;) {
      ssize_t n = ::recv(fd_, &byte, 1, 0);
      if (n == 0) return "eof";
      if (n > 0) return "data";
      if (errno == EINTR) continue;
      if (errno == ECONNRESET) return "reset";
      if (errno == EAGAIN || errno == EWOULDBLOCK) return "timeout";
      return std::strerror(errno);
    }
  }

  void shutdown_write() { ::shutdown(fd_, SHUT_WR); }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// Request encoders.
inline Bytes request(QueryType type, std::vector<std::string> keys = {},
                     std::vector<Bytes> values = {}, int64_t delta = 0) {
  Bytes out;
  switchboard::tcpstore::encode_request(
      out, switchboard::tcpstore::Request{type, std::move(keys), std::move(values), delta});
  return out;
}
inline Bytes set_request(const std::string& key, const std::string& value) {
  return request(QueryType::kSet, {key}, {switchboard::to_bytes(value)});
}
inline Bytes get_request(const std::string& key) { return request(QueryType::kGet, {key}); }
inline Bytes add_request(const std::string& key, int64_t delta) {
  return request(QueryType::kAdd, {key}, {}, delta);
}
inline Bytes wait_request(std::vector<std::string> keys) {
  return request(QueryType::kWait, std::move(keys));
}
inline Bytes delete_request(const std::string& key) {
  return request(QueryType::kDeleteKey, {key});
}
inline Bytes num_keys_request() { return request(QueryType::kGetNumKeys); }

// Reply builders and concatenation.
inline Bytes hex(std::initializer_list<int> bytes) {
  Bytes out;
  for (int b : bytes) out.push_back(static_cast<uint8_t>(b));
  return out;
}
inline Bytes i64(int64_t value) {
  Bytes out;
  switchboard::tcpstore::put_i64(out, value);
  return out;
}
inline Bytes value(const std::string& text) {
  Bytes out;
  switchboard::tcpstore::put_bytes(out, text);
  return out;
}
inline Bytes cat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const Bytes& part : parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}
// A watch event: type | key | old | new.
inline Bytes event(uint8_t type, const std::string& key, const std::string& old_value,
                   const std::string& new_value) {
  return cat({Bytes{type}, value(key), value(old_value), value(new_value)});
}

// Polls `done` until it returns true or `guard` passes; returns its last
// result. For conditions no reply reports (the server saw a disconnect).
template <typename Predicate>
bool eventually(Predicate done, std::chrono::seconds guard = std::chrono::seconds(30)) {
  auto deadline = std::chrono::steady_clock::now() + guard;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace sbtest
