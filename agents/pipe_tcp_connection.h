// TcpConnection: a Connection (agents/pipe_connection.h) over one TCP
// socket, in the clear or inside TLS. Framed reads into a FrameReader;
// queued and coalesced writes, sent inline from the caller when nothing
// else is being written (plain TCP only: a TLS session is driven from the
// strand alone). Made by the TCP transport (agents/pipe_tcp_transport.h).
// Internal to //agents.
//
// The same-host lane (plain TCP with a lane capacity): each direction may
// move its frames through a shared-memory ring (agents/shm_ring.h) instead
// of the socket, when the peer can map it, which only a worker of the same
// host (and IPC namespace) can. The byte stream is the same. With its
// first frame, each side offers its ring (a kLane frame naming the
// segment); the peer answers accept or refuse; on accept, the offering
// side sends a switch marker on the socket and from then on writes every
// frame into the ring (a writer thread takes what does not fit at once).
// The peer reads the socket up to the marker, then the ring (on a reader
// thread). The socket stays open and is still read: its end (the peer
// died or closed) is reported once the ring is drained. The lane's
// negotiation (docs/wire_formats.md, "Same-host lane"):
//   kLane payload  1 + segment name   offer
//                  2                  accept
//                  3 + reason         refuse (the direction stays on TCP)
//                  4                  switch: the ring carries what follows
//
// Thread safety: as Connection. Reads, write completions, the TLS
// handshake and the ConnectionEvents callbacks run on the connection's
// strand, or, once the inbound lane is on, on its reader thread; the write
// queues are guarded by mu_.
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
#include <thread>
#include <vector>

#include "agents/pipe_connection.h"
#include "agents/pipe_frame.h"
#include "agents/shm_ring.h"
#include "core/tensor.h"
#include "common/mutex.h"
#include "core/message.h"

namespace switchboard::agents {

class TcpConnection final : public Connection,
                            public std::enable_shared_from_this<TcpConnection> {
 public:
  // Takes `socket` (connected, TCP_NODELAY set here); reports to `events`,
  // which must outlive the connection; received tensors come from
  // `allocate`, frames are checked against `limits`. With `tls`, every
  // byte goes through a TLS session on that context, which handshake()
  // opens before anything else is sent or read.
  // `lane_capacity`: the ring this side offers for the same-host lane (a
  // power of two; 0: no lane, neither offered nor accepted; never with
  // TLS).
  TcpConnection(ConnectionEvents& events, boost::asio::ip::tcp::socket socket,
                const pipe::FrameLimits& limits, pipe::FrameReader::Allocate allocate,
                std::shared_ptr<boost::asio::ssl::context> tls = nullptr,
                size_t lane_capacity = 0);
  // Stops the lane's threads (joins them, unless called on one).
  ~TcpConnection() override;
  // Stops the lane's threads and waits for them (unless called on one):
  // after it, nothing of this connection reports to its events. The
  // transport calls it once its I/O threads are done (no lane starts
  // after that), so that the events (the agent) may go.
  void join_lane();

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
  void on_lane_frame(const std::vector<uint8_t>& payload) override SB_EXCLUDES(mu_);

  // Whether frames go out through / come in through the lane now.
  bool lane_out_active() const SB_EXCLUDES(mu_);
  bool lane_in_active() const { return lane_in_active_.load(); }

 private:
  // One direction's ring and the segment it lives in.
  struct Lane {
    ShmSegment segment;
    std::unique_ptr<ShmRing> ring;
  };

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
  // Drops the first `n` bytes of a queued stream.
  static void consume(std::vector<uint8_t>& bytes, std::vector<QueuedTensor>& tensors,
                      size_t n);
  void consume_locked(size_t n) SB_REQUIRES(mu_) { consume(queued_, queued_tensors_, n); }

  // The lane (pipe_tcp_lane.cc).
  // With the first data frame: makes this side's ring and queues its offer.
  void offer_lane_locked() SB_REQUIRES(mu_);
  // Writes what the lane queue holds into the ring, as far as it fits;
  // true when all of it went. Throws ShmRingCorrupt.
  bool write_lane_locked() SB_REQUIRES(mu_);
  bool lane_queue_empty_locked() const SB_REQUIRES(mu_) {
    return lane_queued_.empty() && lane_queued_tensors_.empty();
  }
  // Fails the connection from the strand (not under mu_).
  void fail_later(std::string reason);
  // The lane's threads. Each holds the connection only while it works (so
  // that dropping the connection ends them), and returns at once when
  // `alive` says it was destroyed meanwhile (on that very thread).
  using Alive = std::shared_ptr<std::atomic<bool>>;
  void lane_write_loop(const std::weak_ptr<TcpConnection>& weak, const Alive& alive);
  void lane_read_loop(const std::weak_ptr<TcpConnection>& weak, const Alive& alive);
  // Stops the lane's threads' loops (they exit within their next wait).
  void stop_lane();
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

  // The same-host lane.
  const size_t lane_capacity_;
  const pipe::FrameLimits limits_;
  const pipe::FrameReader::Allocate allocate_;
  bool lane_offered_ SB_GUARDED_BY(mu_) = false;
  std::unique_ptr<Lane> lane_offer_ SB_GUARDED_BY(mu_);  // offered, not yet answered
  std::unique_ptr<Lane> lane_out_ SB_GUARDED_BY(mu_);    // frames go through it
  std::vector<uint8_t> lane_queued_ SB_GUARDED_BY(mu_);
  std::vector<QueuedTensor> lane_queued_tensors_ SB_GUARDED_BY(mu_);
  CondVar lane_queued_cv_;
  std::atomic<ShmRing*> lane_out_ring_{nullptr};  // lane_out_'s, for waits without mu_
  Mutex lane_in_mu_;
  std::unique_ptr<Lane> lane_in_offer_ SB_GUARDED_BY(lane_in_mu_);  // accepted, before the switch
  std::unique_ptr<Lane> lane_in_;  // set before the reader thread starts; then its own
  std::atomic<ShmRing*> lane_in_ring_{nullptr};  // lane_in_'s, to wake it
  std::string socket_end_ SB_GUARDED_BY(lane_in_mu_);  // why the socket ended
  std::atomic<bool> socket_ended_{false};
  std::atomic<bool> lane_in_active_{false};
  std::atomic<bool> lane_stop_{false};
  std::thread lane_writer_;
  std::thread lane_reader_;
  const Alive lane_alive_ = std::make_shared<std::atomic<bool>>(true);
};

template <typename Emit>
void TcpConnection::for_each_piece(const std::vector<uint8_t>& bytes,
                                   const std::vector<QueuedTensor>& tensors, Emit&& emit) {
  size_t at = 0;
  for (const QueuedTensor& t : tensors) {
    if (t.offset > at) emit(bytes.data() + at, t.offset - at);
    at = t.offset;
    if (t.sent < t.tensor.nbytes()) {
      emit(static_cast<const uint8_t*>(t.tensor.data()) + t.sent, t.tensor.nbytes() - t.sent);
    }
  }
  if (at < bytes.size()) emit(bytes.data() + at, bytes.size() - at);
}

}  // namespace switchboard::agents
