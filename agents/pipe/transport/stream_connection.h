// StreamConnection: what every PIPE connection over a byte stream shares
// (agents/pipe/transport/connection.h): the queue of frames going out, coalesced into
// one write at a time; the frame reader the stream's bytes go into; the
// strand that reads, writes and reports to the ConnectionEvents; the
// closing rules. What the stream is stays with the subclass:
//   tcp/tcp_connection.h   a TCP socket (sends from the caller's thread
//                          when nothing else is being written), with the
//                          same-host lane of shm/shm_lane.h beside it;
//   tls/tls_connection.h   a TLS session over a TCP socket.
// Internal to the PIPE agent's transports; includes Asio.
//
// Thread safety: as Connection. Reads, write completions and the events'
// callbacks run on the strand; the queue is guarded by mu_, which
// subclasses take for their own state that must change together with it.
#pragma once

#include <boost/asio/buffer.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "agents/pipe/transport/connection.h"
#include "agents/pipe/transport/frame_queue.h"
#include "agents/pipe/wire/frame.h"
#include "common/mutex.h"
#include "core/message.h"
#include "core/tensor.h"

namespace switchboard::agents::pipe::transport {

class StreamConnection : public Connection,
                         public std::enable_shared_from_this<StreamConnection> {
 public:
  bool enqueue(const rpc::Message& m, const std::vector<Device>& devices,
               const std::vector<wire::TensorRoute>& routes, bool send_now) override
      SB_EXCLUDES(mu_);
  bool enqueue_control(wire::FrameKind kind, const uint8_t* payload = nullptr,
                       size_t size = 0, uint64_t id = 0) override SB_EXCLUDES(mu_);
  void start_reading() override;
  void replay(wire::InboundFrame frame) override;
  void close_after_flush() override SB_EXCLUDES(mu_);
  bool wait_closed(std::chrono::steady_clock::time_point deadline) override
      SB_EXCLUDES(mu_);
  void close_now() override SB_EXCLUDES(mu_);

  // "address:port" of the peer (empty when the socket has none).
  std::string remote_address() const;

 protected:
  // Takes `socket` (connected; TCP_NODELAY is set here); reports to
  // `events`, which must outlive the connection; received tensors come from
  // `allocate` and their bytes' arrival is told to `progress` (may be
  // null), frames are checked against `limits` (and the stranger limits
  // until `trusted`).
  StreamConnection(ConnectionEvents& events, boost::asio::ip::tcp::socket socket,
                   const wire::FrameLimits& limits, wire::FrameReader::Allocate allocate,
                   wire::FrameReader::Progress progress);

  using IoDone = std::function<void(const boost::system::error_code&, size_t)>;
  // The stream. Called on the strand, one write and one read at a time;
  // `done` must run on the strand (bind it to strand_).
  virtual void async_write(const std::vector<boost::asio::const_buffer>& buffers,
                           IoDone done) = 0;
  virtual void async_read_some(boost::asio::mutable_buffer buffer, IoDone done) = 0;
  // Whether enqueue(send_now) may write from the caller's thread straight
  // to the socket (a plain socket only: a TLS session is driven from the
  // strand alone).
  virtual bool sends_inline() const { return false; }
  // Whether `error` from a read means that the peer closed the stream
  // (rather than that it failed).
  virtual bool is_end(const boost::system::error_code& error) const;

  // Hooks for what a subclass carries beside the stream (the lane).
  // The stream ended (`why`: the peer closed it, or a read failed); by
  // default the connection fails with that reason.
  virtual void stream_ended(std::string why);
  // Whether everything queued beside the stream went, so that a
  // close_after_flush() may close the socket now. When it returns false,
  // the subclass calls kick() once it went.
  virtual bool side_flushed_locked() SB_REQUIRES(mu_) { return true; }
  // The connection closed (either way); stop what runs beside the stream.
  virtual void on_closed() {}

  // Has the strand write what is queued, unless a write is in flight.
  void kick() SB_EXCLUDES(mu_);
  void kick_locked() SB_REQUIRES(mu_);
  // Queues a frame on the stream itself, under mu_ (after the checks of
  // enqueue()); `send_now` as in enqueue().
  void enqueue_locked(const rpc::Message& m, const std::vector<Device>& devices,
                      const std::vector<wire::TensorRoute>& routes, bool send_now)
      SB_REQUIRES(mu_);
  // Fails the connection from the strand (not under mu_).
  void fail_later(std::string reason);
  bool closing_or_closed_locked() const SB_REQUIRES(mu_) { return closed_ || closing_; }
  bool closing_locked() const SB_REQUIRES(mu_) { return closing_; }
  // Closes the socket; strand only.
  void close_socket(bool graceful);

  ConnectionEvents& events_;
  boost::asio::strand<boost::asio::any_io_executor> strand_;
  boost::asio::ip::tcp::socket socket_;  // strand only, but for inline sends
  Mutex mu_;
  FrameQueue queued_ SB_GUARDED_BY(mu_);

 private:
  // Sends what is queued now, from the calling thread, without blocking
  // (MSG_DONTWAIT); keeps what the socket did not take. Only while no
  // write is in flight.
  void send_inline_locked() SB_REQUIRES(mu_);
  // Strand only: writes what is queued, then again until the queue is empty.
  void write_some() SB_EXCLUDES(mu_);
  // Strand only: reads into the reader and hands parsed frames on.
  void read_some();
  // Strand only: hands parsed frames to the events; false when they stopped
  // reading.
  bool drain();

  wire::FrameReader reader_;  // strand only
  CondVar closed_cv_;
  bool writing_ SB_GUARDED_BY(mu_) = false;
  bool closing_ SB_GUARDED_BY(mu_) = false;
  bool closed_ SB_GUARDED_BY(mu_) = false;
  // The write in progress (strand only).
  FrameQueue sending_;
  std::vector<boost::asio::const_buffer> buffers_;
};

}  // namespace switchboard::agents::pipe::transport
