// StreamTransport: what the transports over TCP sockets share (tcp/ and
// tls/): an Asio io_context run by `num_io_threads` threads, a TCP
// acceptor, a connect bounded by its timeout, and the timers of every().
// A transport says what becomes of a socket: connected() for one it
// connected, accepted() for one it accepted (which it hands over with
// hand_over() once ready). Internal to agents/pipe/transport; includes
// Asio, so only the transports' sources include it.
//
// Lifecycle and thread safety: as PipeTransport (transport.h). A subclass
// whose members the I/O threads use calls stop_io() first in its
// destructor, so that no handler runs on a half-destroyed object.
#pragma once

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "agents/pipe/transport/connection.h"
#include "agents/pipe/transport/options.h"
#include "agents/pipe/transport/transport.h"

namespace switchboard::agents::pipe::transport {

class StreamTransport : public PipeTransport {
 public:
  // Stops the io_context (pending handlers are dropped, not run) and joins
  // the I/O threads.
  ~StreamTransport() override;

  void listen(const std::string& address, OnAccept on_accept) override;
  const std::string& address() const override { return address_; }
  int port() const override { return port_; }
  // Connects a socket within `timeout`, then hands it to connected().
  std::shared_ptr<Connection> connect(const std::string& address, int port,
                                      std::chrono::milliseconds timeout) override;
  void every(std::chrono::milliseconds interval, std::function<bool()> tick) override;
  void close() override;
  void join() override;

 protected:
  StreamTransport(ConnectionEvents& events, TransportOptions options);

  // A socket connected by connect(), still within `timeout`: the
  // connection to return (throws ConnectionError, or AuthenticationError,
  // when it cannot be made).
  virtual std::shared_ptr<Connection> connected(boost::asio::ip::tcp::socket socket,
                                                std::chrono::milliseconds timeout) = 0;
  // A socket accepted (on the acceptor's strand): hand_over() the
  // connection once it is ready, or drop it.
  virtual void accepted(boost::asio::ip::tcp::socket socket) = 0;
  // In close(), before the acceptor closes (on the caller's thread).
  virtual void closing() {}
  // In join(), once the I/O threads returned.
  virtual void joined() {}

  // Passes an accepted connection to listen()'s callback.
  void hand_over(std::shared_ptr<Connection> connection) {
    on_accept_(std::move(connection));
  }
  bool is_closing() const { return closing_; }
  // What the destructor does; idempotent.
  void stop_io();

  ConnectionEvents& events_;
  const TransportOptions options_;
  boost::asio::io_context io_;

 private:
  // Strand only.
  void accept_next();
  void arm(std::shared_ptr<boost::asio::steady_timer> timer,
           std::chrono::milliseconds interval, std::function<bool()> tick);

  // The acceptor and the timers run on `strand_`, connections on strands
  // of their own. Everything here is touched by the owner's thread only
  // before the I/O threads start (listen()) or after they are joined, and
  // otherwise on `strand_`.
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  boost::asio::strand<boost::asio::io_context::executor_type> strand_;
  boost::asio::ip::tcp::acceptor acceptor_;  // strand only once listening
  std::string address_;                      // written by listen()
  int port_ = 0;                             // written by listen()
  OnAccept on_accept_;                       // written by listen()
  bool closed_ = false;                      // strand only
  std::vector<std::shared_ptr<boost::asio::steady_timer>> timers_;  // strand only
  std::vector<std::thread> threads_;                                // owner's thread
  std::atomic<bool> closing_{false};
};

}  // namespace switchboard::agents::pipe::transport
