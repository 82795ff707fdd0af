#include "tools/bench/rpc_tcp_baseline.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tools/bench/process.h"
#include "tools/bench/stats.h"

namespace switchboard::bench {

using Clock = std::chrono::steady_clock;
using Figures = std::map<std::string, double>;

namespace {

// Owns a socket.
class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  Socket(Socket&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Socket& operator=(Socket&&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

[[noreturn]] void throw_errno(const char* what) {
  throw std::runtime_error(fmt::format("tcp {}: {}", what, std::strerror(errno)));
}

// TCP_NODELAY, and kSocketTimeout on every send and recv.
Socket configure(int fd, std::chrono::seconds socket_timeout) {
  if (fd < 0) throw_errno("socket");
  Socket socket(fd);
  int one = 1;
  timeval timeout{socket_timeout.count(), 0};
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0 ||
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout) != 0 ||
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout) != 0) {
    throw_errno("setsockopt");
  }
  return socket;
}

// `host` (a numeric IPv4 address) and `port`.
sockaddr_in ipv4(const std::string& host, uint16_t port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1) {
    throw std::invalid_argument(fmt::format("not an IPv4 address: \"{}\"", host));
  }
  return address;
}

void send_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno(errno == EAGAIN ? "send timed out" : "send");
    data += n;
    size -= static_cast<size_t>(n);
  }
}

// Reads exactly `size` bytes; false when the peer closed before the first.
bool recv_all(int fd, char* data, size_t size) {
  for (size_t got = 0; got < size;) {
    ssize_t n = ::recv(fd, data + got, size - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno(errno == EAGAIN ? "recv timed out" : "recv");
    if (n == 0) {
      if (got == 0) return false;
      throw std::runtime_error("tcp recv: the peer closed mid-message");
    }
    got += static_cast<size_t>(n);
  }
  return true;
}

Socket accept_one(int listener, std::chrono::seconds socket_timeout) {
  pollfd readable{listener, POLLIN, 0};
  int waited = ::poll(
      &readable, 1, static_cast<int>(std::chrono::milliseconds(socket_timeout).count()));
  if (waited == 0) throw std::runtime_error("tcp accept: nobody connected in time");
  if (waited < 0) throw_errno("poll");
  return configure(::accept(listener, nullptr, nullptr), socket_timeout);
}

}  // namespace

int run_tcp_server(std::chrono::seconds socket_timeout, const std::string& host) {
  Socket listener(::socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in address = ipv4(host, 0);
  socklen_t length = sizeof address;
  if (listener.fd() < 0 ||
      ::bind(listener.fd(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::listen(listener.fd(), 4) != 0 ||
      ::getsockname(listener.fd(), reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    throw_errno("listen");
  }
  fmt::print("port={}\n", ntohs(address.sin_port));
  std::fflush(stdout);
  {  // ping-pong until the client closes
    Socket peer = accept_one(listener.fd(), socket_timeout);
    char message[kPingBytes];
    while (recv_all(peer.fd(), message, sizeof message)) {
      send_all(peer.fd(), message, sizeof message);
    }
  }
  {  // bulk: one ack per whole 64 MiB
    Socket peer = accept_one(listener.fd(), socket_timeout);
    std::vector<char> buffer(kBulkBytes);
    const char ack = 1;
    while (recv_all(peer.fd(), buffer.data(), buffer.size()))
      send_all(peer.fd(), &ack, 1);
  }
  wait_for_stdin_eof();
  return 0;
}

namespace {

constexpr auto kClientSocketTimeout = std::chrono::seconds(30);
constexpr auto kServerStartTimeout = std::chrono::seconds(120);

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

Socket connect_to(const std::string& host, uint16_t port) {
  Socket socket = configure(::socket(AF_INET, SOCK_STREAM, 0), kClientSocketTimeout);
  sockaddr_in address = ipv4(host, port);
  if (::connect(socket.fd(), reinterpret_cast<sockaddr*>(&address), sizeof address) !=
      0) {
    throw_errno("connect");
  }
  return socket;
}

void measure_tcp_rtt(const std::string& host, uint16_t port, const TcpCounts& counts,
                     Figures& figures) {
  Socket socket = connect_to(host, port);
  char message[kPingBytes] = {};
  std::vector<double> us;
  us.reserve(static_cast<size_t>(counts.round_trips));
  for (int i = 0; i < counts.warmup + counts.round_trips; ++i) {
    auto start = Clock::now();
    send_all(socket.fd(), message, sizeof message);
    if (!recv_all(socket.fd(), message, sizeof message)) {
      throw std::runtime_error("tcp server closed during ping-pong");
    }
    if (i >= counts.warmup) us.push_back(seconds_since(start) * 1e6);
  }
  figures["rtt_us_p50"] = percentile(us, 0.50);
  figures["rtt_us_p99"] = percentile(us, 0.99);
}

void measure_tcp_oneway(const std::string& host, uint16_t port, const TcpCounts& counts,
                        Figures& figures) {
  Socket socket = connect_to(host, port);
  std::vector<char> data(kBulkBytes, 1);
  std::vector<double> gbps;
  for (int i = 0; i < 1 + counts.bulk_sends; ++i) {
    auto start = Clock::now();
    send_all(socket.fd(), data.data(), data.size());
    char ack = 0;
    if (!recv_all(socket.fd(), &ack, 1))
      throw std::runtime_error("tcp server sent no ack");
    if (i > 0)
      gbps.push_back(static_cast<double>(kBulkBytes) / seconds_since(start) / 1e9);
  }
  figures["oneway_GBps"] = median(gbps);
  figures["oneway_GBps_best"] = *std::max_element(gbps.begin(), gbps.end());
}

}  // namespace

Figures run_tcp_baseline(const std::string& self_exe, const TcpCounts& counts,
                         const Placement& where) {
  std::vector<std::string> argv = where.server_prefix;
  argv.insert(argv.end(), {self_exe, "rpc", "--tcp-server", "--bind", where.server});
  ChildProcess server(argv);
  uint16_t port = server.read_port(kServerStartTimeout);
  Figures figures;
  measure_tcp_rtt(where.server, port, counts, figures);
  measure_tcp_oneway(where.server, port, counts, figures);
  server.stop();
  return figures;
}


}  // namespace switchboard::bench
