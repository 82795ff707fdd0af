// A blocking TCP connection with deadlines, used by TcpStore (internal).
//
// Every read and write takes a deadline; on timeout or error the connection
// is closed (a late reply could otherwise be read as the answer to a later
// request) and the next call reconnects. Connecting retries refused
// connections with exponential backoff until its deadline.
//
// Thread safety: none; TcpStore serializes calls with its own mutex.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "store/store.h"

namespace switchboard::tcpstore {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// A deadline `timeout` from now; Store::kNoTimeout means never.
Deadline deadline_after(std::chrono::milliseconds timeout);

class ClientConnection {
 public:
  ClientConnection(std::string host, uint16_t port);
  ~ClientConnection();

  // Opens the connection unless it is open. Throws ConnectionError naming
  // host:port and the last error when the deadline passes first.
  void ensure_open(Deadline deadline);
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

 private:
  class Socket;

  void fail(const std::string& what, const std::string& reason);

  const std::string host_;
  const uint16_t port_;
  std::unique_ptr<Socket> socket_;
  bool peer_closed_ = false;
};

}  // namespace switchboard::tcpstore
