#include "store/tcp_client_connection.h"

#include <fmt/format.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "common/error.h"
#include "store/tcp_protocol.h"

namespace switchboard::tcpstore {

Deadline deadline_after(std::chrono::milliseconds timeout) {
  if (timeout == Store::kNoTimeout) return Deadline::max();
  return Clock::now() + timeout;
}

namespace {

// Milliseconds left until the deadline, for poll(); -1 means forever.
int poll_timeout(Deadline deadline) {
  if (deadline == Deadline::max()) return -1;
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30));
}

// Errors that mean "the server is not there yet": worth retrying.
bool retryable(int error) {
  return error == ECONNREFUSED || error == ECONNRESET || error == ETIMEDOUT ||
         error == EHOSTUNREACH || error == ENETUNREACH || error == ECONNABORTED;
}

}  // namespace

ClientConnection::ClientConnection(std::string host, uint16_t port,
                                   std::shared_ptr<const Secret> secret)
    : host_(std::move(host)), port_(port), secret_(std::move(secret)) {}

ClientConnection::~ClientConnection() { close(); }

std::string ClientConnection::address() const {
  return fmt::format("{}:{}", host_, port_);
}

bool ClientConnection::is_open() const { return fd_ >= 0; }

void ClientConnection::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  begin_ = end_ = 0;
}

void ClientConnection::fail(const std::string& what, const std::string& reason) {
  close();
  throw ConnectionError(fmt::format("TcpStore {} {}: {}", what, address(), reason));
}

bool ClientConnection::poll_for(short events, Deadline deadline) {
  for (;;) {
    pollfd pfd{fd_, events, 0};
    int ready = ::poll(&pfd, 1, poll_timeout(deadline));
    if (ready > 0) return true;
    if (ready == 0) {
      if (Clock::now() >= deadline) return false;
      continue;  // poll's millisecond rounding woke us early
    }
    if (errno != EINTR) fail("poll on", std::strerror(errno));
  }
}

int ClientConnection::try_connect(Deadline deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* addresses = nullptr;
  int rc = ::getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &addresses);
  if (rc != 0) {
    throw ConnectionError(fmt::format("TcpStore cannot resolve {}: {}", address(),
                                      ::gai_strerror(rc)));
  }
  int error = ECONNREFUSED;
  for (addrinfo* a = addresses; a != nullptr && fd_ < 0; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                      a->ai_protocol);
    if (fd < 0) {
      error = errno;
      break;
    }
    fd_ = fd;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      error = errno;
    } else if (!poll_for(POLLOUT, deadline)) {
      error = ETIMEDOUT;
    } else {
      socklen_t length = sizeof(error);
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
    }
    if (error != 0) close();
  }
  ::freeaddrinfo(addresses);
  if (fd_ < 0) return error;
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return 0;
}

void ClientConnection::ensure_open(Deadline deadline, bool retry) {
  if (fd_ >= 0) return;
  peer_closed_ = false;
  auto backoff = std::chrono::milliseconds(10);
  for (;;) {
    int error = try_connect(deadline);
    if (error == 0) {
      if (secret_) authenticate(deadline);
      if (dialect_ == Dialect::kLegacy || validate(deadline)) return;
      continue;  // closed at the VALIDATE: again, in the legacy numbering
    }
    if (!retry || !retryable(error) || Clock::now() + backoff >= deadline) {
      throw ConnectionError(fmt::format("TcpStore could not connect to {}: {}",
                                        address(), std::strerror(error)));
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
}

bool ClientConnection::validate(Deadline deadline) {
  const uint32_t nonce = static_cast<uint32_t>(::getpid());
  Bytes hello;
  encode_request(hello, Request{QueryType::kValidate, {}, {}, 0, kValidateMagic});
  encode_request(hello, Request{QueryType::kPing, {}, {}, 0, nonce});
  uint8_t reply[4];
  try {
    write(hello, deadline);
    read(reply, sizeof(reply), deadline);
  } catch (const ConnectionError&) {
    if (!peer_closed_) throw;
    close();
    peer_closed_ = false;
    dialect_ = Dialect::kLegacy;
    return false;
  }
  const uint32_t echoed = static_cast<uint32_t>(reply[0]) | static_cast<uint32_t>(reply[1]) << 8 |
                          static_cast<uint32_t>(reply[2]) << 16 |
                          static_cast<uint32_t>(reply[3]) << 24;
  if (echoed != nonce) {
    fail("validate with", fmt::format("PING answered {:#x}, not its nonce {:#x}", echoed, nonce));
  }
  dialect_ = Dialect::kTorch2;
  return true;
}

void ClientConnection::authenticate(Deadline deadline) {
  const Nonce mine = random_nonce();
  Bytes hello(kAuthMagic, kAuthMagic + sizeof(kAuthMagic));
  hello.insert(hello.end(), mine.begin(), mine.end());
  uint8_t challenge[kAuthNonceBytes + kAuthMacBytes];
  try {
    write(hello, deadline);
    read(challenge, sizeof(challenge), deadline);
  } catch (const ConnectionError& e) {
    if (!peer_closed_) throw;
    close();
    throw AuthenticationError(fmt::format(
        "TcpStore authenticating with {}: the server closed the connection before proving "
        "the job secret: it has no "
         "secret (a client with one talks only to a server that proves it; give the server "
        "the same SWITCHBOARD_SECRET_FILE or --secret-file) or is not a Switchboard store "
        "server",
        address()));
  }
  Nonce theirs;
  std::memcpy(theirs.data(), challenge, kAuthNonceBytes);
  if (!secret_->verify({challenge + kAuthNonceBytes, kAuthMacBytes},
                       {bytes_of(kAuthServerLabel), mine, theirs})) {
    close();
    throw AuthenticationError(fmt::format(
        "TcpStore authenticating with {}: the server's proof does not match this client's "
        "job secret (the server has another secret); not talking to it",
        address()));
  }
  const Mac proof = secret_->mac({bytes_of(kAuthClientLabel), theirs, mine});
  write(Bytes(proof.begin(), proof.end()), deadline);
  uint8_t verdict = kAuthRefused;
  try {
    verdict = read_u8(deadline);
  } catch (const ConnectionError&) {
    if (!peer_closed_) throw;
  }
  if (verdict != kAuthAccepted) {
    close();
    throw AuthenticationError(fmt::format(
        "TcpStore authenticating with {}: the server refused this client's proof of the job "
        "secret",
        address()));
  }
}

void ClientConnection::write(const Bytes& data, Deadline deadline) {
  if (fd_ < 0) fail("write to", "connection is closed");
  size_t sent = 0;
  while (sent < data.size()) {
    ssize_t n = ::send(fd_, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!poll_for(POLLOUT, deadline)) {
        close();
        throw TimeoutError(fmt::format("TcpStore write to {} timed out", address()));
      }
    } else if (errno != EINTR) {
      fail("write to", std::strerror(errno));
    }
  }
}

size_t ClientConnection::receive(uint8_t* dst, size_t size, Deadline deadline) {
  for (;;) {
    ssize_t n = ::recv(fd_, dst, size, 0);
    if (n > 0) return static_cast<size_t>(n);
    if (n == 0) {
      peer_closed_ = true;
      fail("read from", "the server closed the connection");
    }
    if (errno == ECONNRESET) {
      peer_closed_ = true;
      fail("read from", "the server reset the connection");
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) fail("read from", std::strerror(errno));
    if (!poll_for(POLLIN, deadline)) {
      close();
      throw TimeoutError(fmt::format("TcpStore read from {} timed out", address()));
    }
  }
}

bool ClientConnection::wait_readable(Deadline deadline) {
  if (fd_ < 0) fail("read from", "connection is closed");
  if (begin_ < end_) return true;
  return poll_for(POLLIN, deadline);
}

void ClientConnection::read(void* out, size_t size, Deadline deadline) {
  if (fd_ < 0) fail("read from", "connection is closed");
  auto* dst = static_cast<uint8_t*>(out);
  while (size > 0) {
    if (begin_ < end_) {
      size_t n = std::min(size, end_ - begin_);
      std::memcpy(dst, buffer_.data() + begin_, n);
      begin_ += n;
      dst += n;
      size -= n;
    } else if (size >= buffer_.size()) {
      // Large payloads go straight to their destination.
      size_t n = receive(dst, size, deadline);
      dst += n;
      size -= n;
    } else {
      // Replies usually take a round trip: wait first, then one recv
      // serves several fields.
      if (!poll_for(POLLIN, deadline)) {
        close();
        throw TimeoutError(fmt::format("TcpStore read from {} timed out", address()));
      }
      begin_ = 0;
      end_ = receive(buffer_.data(), buffer_.size(), deadline);
    }
  }
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
