// TcpConnection: a Connection (agents/pipe_connection.h) over one TCP
// socket, in the clear or inside TLS. Framed reads into a FrameReader;
// queued and coalesced writes, sent inline from the caller when nothing
// else is being written (plain TCP only: a TLS session is driven from the
// strand alone). Made by the TCP transport (agents/pipe_tcp_transport.h).
// Internal to //agents.
//
// Thread safety: as Connection. Reads, write completions, the TLS
// handshake and the ConnectionEvents callbacks run on the connection's
// strand; the write queue is guarded by mu_.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "agents/pipe_connection.h"
#include "agents/pipe_frame.h"
#include "collective/tensor.h"
#include "common/mutex.h"
#include "rpc/message.h"

namespace switchboard::agents {

class TcpConnection final : public Connection,
                            public std::enable_shared_from_this<TcpConnection> {
 public:
  // Takes `socket` (connected, TCP_NODELAY set here); reports to `events`,
  // which must outlive the connection; received tensors come from
  // `allocate`, frames are checked against `limits`. With `tls`, every
  // byte goes through a TLS session on that context, which handshake()
  // opens before anything else is sent or read.
  TcpConnection(ConnectionEvents& events, boost::asio::ip::tcp::socket socket,
                const pipe::FrameLimits& limits, pipe::FrameReader::Allocate allocate,
                std::shared_ptr<boost::asio::ssl::context> tls = nullptr);

  // TLS only, once, before start_reading(): runs the handshake as the
  // client or the server and calls `done` on the strand with an empty
  // string, or why it failed (OpenSSL's reason, the certificate check's,
  // or that `timeout` passed; the socket is then closed) and whether TLS
  // itself refused (a certificate, an alert from the peer) rather than the
  // connection failing or falling silent.
  using HandshakeDone = std::function<void(const std::string& why, bool refused)>;
  void handshake(bool client, std::chrono::milliseconds timeout, HandshakeDone done);
  // "address:port" of the peer (empty when the socket has none).
  std::string remote_address() const;

  bool enqueue(const rpc::Message& m, const std::vector<Device>& devices,
               bool send_now) override SB_EXCLUDES(mu_);
  bool enqueue_control(pipe::FrameKind kind, const uint8_t* payload = nullptr,
                       size_t size = 0, uint64_t id = 0) override SB_EXCLUDES(mu_);
  void start_reading() override;
  void replay(pipe::InboundFrame frame) override;
  void close_after_flush() override SB_EXCLUDES(mu_);
  bool wait_closed(std::chrono::steady_clock::time_point deadline) override SB_EXCLUDES(mu_);
  void close_now() override SB_EXCLUDES(mu_);

 private:
  // A tensor whose bytes follow byte `offset` of the queued frame bytes;
  // `sent` of them already went out (a partial inline send).
  struct QueuedTensor {
    size_t offset = 0;
    Tensor tensor;
    size_t sent = 0;
  };

  // Calls emit(data, size) for each piece of `bytes` and `tensors` in wire
  // order, skipping empty pieces and bytes already sent.
  template <typename Emit>
  static void for_each_piece(const std::vector<uint8_t>& bytes,
                             const std::vector<QueuedTensor>& tensors, Emit&& emit);
  // Posts write_some() to the strand unless a write is in flight.
  void kick_locked() SB_REQUIRES(mu_);
  // Sends what is queued now, from the calling thread, without blocking
  // (MSG_DONTWAIT); keeps what the socket did not take. Only while no
  // write is in flight.
  void send_inline_locked() SB_REQUIRES(mu_);
  // Drops the first `n` bytes of the queued stream.
  void consume_locked(size_t n) SB_REQUIRES(mu_);
  // Strand only: writes what is queued, then again until the queue is empty.
  void write_some() SB_EXCLUDES(mu_);
  // Strand only: reads into the reader and hands parsed frames on.
  void read_some();
  // Strand only: hands parsed frames to the events; false when they stopped
  // reading.
  bool drain();
  // Calls f(stream) with the TLS stream when there is one, else the socket.
  template <typename F>
  void on_stream(F&& f) {
    if (tls_) {
      f(*tls_);
    } else {
      f(socket_);
    }
  }

  ConnectionEvents& events_;
  boost::asio::strand<boost::asio::any_io_executor> strand_;
  boost::asio::ip::tcp::socket socket_;  // strand only, but for send_inline_locked()
  pipe::FrameReader reader_;             // strand only
  // The TLS session over socket_ (null: plain TCP); strand only.
  std::shared_ptr<boost::asio::ssl::context> tls_context_;
  std::unique_ptr<boost::asio::ssl::stream<boost::asio::ip::tcp::socket&>> tls_;
  bool handshake_timed_out_ = false;  // strand only

  Mutex mu_;
  CondVar closed_cv_;
  std::vector<uint8_t> queued_ SB_GUARDED_BY(mu_);
  std::vector<QueuedTensor> queued_tensors_ SB_GUARDED_BY(mu_);
  bool writing_ SB_GUARDED_BY(mu_) = false;
  bool closing_ SB_GUARDED_BY(mu_) = false;
  bool closed_ SB_GUARDED_BY(mu_) = false;
  // The write in progress (strand only).
  std::vector<uint8_t> sending_;
  std::vector<QueuedTensor> sending_tensors_;
  std::vector<boost::asio::const_buffer> buffers_;
};

}  // namespace switchboard::agents
