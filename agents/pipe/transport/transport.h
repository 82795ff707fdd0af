// PipeTransport: a transport's context, in TensorPipe's manner: how the
// PIPE agent reaches its peers and is reached by them: a listener, an
// outgoing connect, the I/O threads that run every Connection
// (connection.h), and the timers of the agent's periodic work (heartbeats).
// The rest of the agent sees connections only through this seam. The
// implementations are tcp/ and tls/, chosen through the transport
// registry (registry.h), where shm/ (the same-host lane) upgrades tcp's
// connections. Internal to //agents/pipe (no Asio here).
//
// Lifecycle: listen() once; connect() and every() any number of times; then
// close() (no more accepts or timer ticks), then join() (waits for the I/O
// threads once every connection was closed). The destructor does both,
// and destroys the I/O context that the connections' sockets and strands
// belong to: whoever holds a connection drops it before the transport goes
// (one destroyed later writes to freed memory).
//
// Thread safety: connect() and every() may be called from any thread;
// listen(), close() and join() from the owner's thread. Accept callbacks,
// timer ticks and the connections' events run on the transport's I/O
// threads.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "agents/pipe/transport/connection.h"

namespace switchboard::agents::pipe::transport {

class PipeTransport {
 public:
  // Runs for every accepted connection, which is not reading yet.
  using OnAccept = std::function<void(std::shared_ptr<Connection>)>;

  virtual ~PipeTransport() = default;

  // The transport's name in the registry ("tcp", "tls").
  virtual std::string_view name() const = 0;

  // Listens on `address` (an IP address; the port is chosen by the system)
  // and starts the I/O threads. Throws std::invalid_argument when the
  // address does not parse, ConnectionError when it cannot be bound; both
  // name the agent.
  virtual void listen(const std::string& address, OnAccept on_accept) = 0;
  // Where listen() listens (empty and 0 before).
  virtual const std::string& address() const = 0;
  virtual int port() const = 0;

  // Connects to a peer's listener, blocking the caller for `timeout` at
  // most; the connection is not reading yet. Throws ConnectionError with the
  // system's reason, or saying that `timeout` passed (a peer behind a cut
  // link answers nothing, and the kernel would retry for minutes).
  virtual std::shared_ptr<Connection> connect(const std::string& address, int port,
                                              std::chrono::milliseconds timeout) = 0;

  // Runs `tick` on an I/O thread every `interval` (the first after one
  // interval) until it returns false or close() is called.
  virtual void every(std::chrono::milliseconds interval, std::function<bool()> tick) = 0;

  // Stops accepting and cancels the timers. Connections stay open: the
  // agent closes them. Idempotent.
  virtual void close() = 0;
  // Waits for the I/O threads, which return once close() was called and
  // every connection closed. Idempotent.
  virtual void join() = 0;
};

}  // namespace switchboard::agents::pipe::transport
