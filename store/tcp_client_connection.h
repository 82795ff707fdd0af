// A blocking TCP connection with deadlines, used by TcpStore (internal).
//
// Plain POSIX sockets driven with poll(): a request costs one send() and,
// per reply, one poll() and one recv() (replies are buffered, so several
// fields usually come from one recv). Every read and write takes a deadline;
// on timeout or error the connection is closed (a late reply could
// otherwise be read as the answer to a later request) and the next call
// reconnects. Connecting retries while the server is not listening yet
// (refused, unreachable) with exponential backoff until its deadline; other
// errors (no such host, out of file descriptors) fail at once.
//
// Thread safety: none; TcpStore serializes calls with its own mutex.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/auth.h"
#include "store/store.h"
#include "store/tcp_protocol.h"

namespace switchboard::tcpstore {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// A deadline `timeout` from now; Store::kNoTimeout means never.
Deadline deadline_after(std::chrono::milliseconds timeout);

class ClientConnection {
 public:
  // With `secret`, every connection made authenticates first (the
  // handshake in tcp_protocol.h), proving the secret and checking the
  // server's proof of it.
  ClientConnection(std::string host, uint16_t port,
                   std::shared_ptr<const Secret> secret = nullptr);
  ~ClientConnection();

  // Opens the connection unless it is open, and authenticates it when
  // there is a secret. Throws ConnectionError naming host:port and the
  // last error when the deadline passes first, or what went wrong in the
  // handshake (AuthenticationError when a proof failed; not retried).
  // With `retry` false, makes one attempt only.
  void ensure_open(Deadline deadline, bool retry = true);
  bool is_open() const;
  void close();

  // Writes all of `data`. Throws ConnectionError (and closes) on failure,
  // TimeoutError (and closes) when the deadline passes.
  void write(const Bytes& data, Deadline deadline);
  // Reads exactly `size` bytes into `out`, same errors as write(). A peer
  // that closed the connection is a ConnectionError whose message says so;
  // peer_closed() tells it apart from other failures.
  void read(void* out, size_t size, Deadline deadline);
  uint8_t read_u8(Deadline deadline);
  // Waits until a reply byte is available. Returns false when the deadline
  // passes first, leaving the connection open (the caller decides what to
  // do with the reply still owed); throws ConnectionError like read().
  bool wait_readable(Deadline deadline);
  int64_t read_i64(Deadline deadline);
  Bytes read_bytes(Deadline deadline);

  // True when the last failure was the server closing the connection.
  bool peer_closed() const { return peer_closed_; }
  std::string address() const;

  // How the server numbers the query types (tcp_protocol.h, Dialect),
  // learned on the first connection that opened: every new connection
  // starts with PyTorch 2.x's VALIDATE and a PING. A server that answers
  // the PING (PyTorch 2.x's, or ours) is spoken to in PyTorch 2.x's
  // numbering; one that closes the connection at the VALIDATE (PyTorch
  // 1.13's, or an older Switchboard store server) is reached again and
  // spoken to in the legacy numbering, on every later connection too.
  // Valid once ensure_open() has returned.
  Dialect dialect() const { return dialect_.value_or(Dialect::kLegacy); }

 private:
  // One connection attempt; returns 0 or the errno that made it fail.
  int try_connect(Deadline deadline);
  // poll()s for `events` until the deadline; false on timeout.
  bool poll_for(short events, Deadline deadline);
  // Reads whatever is available into `dst` (at most `size`), waiting until
  // the deadline. Returns the byte count; throws on timeout, EOF or error.
  size_t receive(uint8_t* dst, size_t size, Deadline deadline);
  [[noreturn]] void fail(const std::string& what, const std::string& reason);
  // The client's side of the handshake on a new connection.
  void authenticate(Deadline deadline);
  // VALIDATE and PING on a new connection (see dialect()). False when the
  // server closed the connection instead: it speaks the legacy numbering.
  bool validate(Deadline deadline);

  const std::string host_;
  const uint16_t port_;
  const std::shared_ptr<const Secret> secret_;
  int fd_ = -1;
  // Bytes received but not yet consumed: buffer_[begin_, end_).
  std::vector<uint8_t> buffer_ = std::vector<uint8_t>(64 * 1024);
  size_t begin_ = 0;
  size_t end_ = 0;
  bool peer_closed_ = false;
  std::optional<Dialect> dialect_;  // unknown until a connection opened
};

}  // namespace switchboard::tcpstore
