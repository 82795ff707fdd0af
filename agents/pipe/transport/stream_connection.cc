#include "agents/pipe/transport/stream_connection.h"

#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>

namespace switchboard::agents::pipe::transport {

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using rpc::Message;

StreamConnection::StreamConnection(ConnectionEvents& events, tcp::socket socket,
                                   const wire::FrameLimits& limits,
                                   wire::FrameReader::Allocate allocate,
                                   wire::FrameReader::Progress progress)
    : events_(events),
      strand_(asio::make_strand(socket.get_executor())),
      socket_(std::move(socket)),
      reader_(limits, std::move(allocate)) {
  // The reader belongs to this object: `this` outlives it.
  reader_.set_trust([this] { return trusted.load(); });
  reader_.set_progress(std::move(progress));
  boost::system::error_code ignored;
  socket_.set_option(tcp::no_delay(true), ignored);
}

std::string StreamConnection::remote_address() const {
  boost::system::error_code error;
  const tcp::endpoint peer = socket_.remote_endpoint(error);
  if (error) return "";
  return fmt::format("{}:{}", peer.address().to_string(), peer.port());
}

bool StreamConnection::enqueue(const Message& m, const std::vector<Device>& devices,
                               const std::vector<wire::TensorRoute>& routes,
                               bool send_now) {
  MutexLock lock(mu_);
  if (closed_ || closing_) return false;
  enqueue_locked(m, devices, routes, send_now);
  return true;
}

void StreamConnection::enqueue_locked(const Message& m,
                                      const std::vector<Device>& devices,
                                      const std::vector<wire::TensorRoute>& routes,
                                      bool send_now) {
  queued_.append(m, devices, routes);
  if (send_now && !writing_ && sends_inline()) send_inline_locked();
  if (!queued_.empty()) kick_locked();
}

void StreamConnection::send_inline_locked() {
  if (closed_ || queued_.empty()) return;
  // A few pieces cover the common case (a frame or a handful of small
  // ones); more go to the asynchronous path whole.
  constexpr size_t kMaxPieces = 64;
  iovec pieces[kMaxPieces];
  size_t count = 0;
  bool all = true;
  queued_.for_each_piece([&](const uint8_t* data, size_t size) {
    if (count == kMaxPieces) {
      all = false;
      return;
    }
    pieces[count++] = iovec{const_cast<uint8_t*>(data), size};
  });
  if (!all) return;
  msghdr header{};
  header.msg_iov = pieces;
  header.msg_iovlen = count;
  const ssize_t n =
      ::sendmsg(socket_.native_handle(), &header, MSG_DONTWAIT | MSG_NOSIGNAL);
  // Errors (EAGAIN, a reset) are left to the asynchronous path, which
  // retries or reports them.
  if (n > 0) queued_.consume(static_cast<size_t>(n));
}

bool StreamConnection::enqueue_control(wire::FrameKind kind, const uint8_t* payload,
                                       size_t size, uint64_t id) {
  MutexLock lock(mu_);
  if (closed_ || closing_) return false;
  queued_.append_control(kind, id, payload, size);
  kick_locked();
  return true;
}

void StreamConnection::kick() {
  MutexLock lock(mu_);
  kick_locked();
}

void StreamConnection::kick_locked() {
  if (writing_ || closed_) return;
  writing_ = true;
  asio::post(strand_, [self = shared_from_this()] { self->write_some(); });
}

void StreamConnection::write_some() {
  bool close = false;
  {
    MutexLock lock(mu_);
    if (closed_) return;
    // sending_ still holds what waits on a staged tensor's next chunk;
    // what was queued meanwhile goes after it.
    if (!sending_.empty()) {
    } else if (queued_.empty()) {
      writing_ = false;
      if (!closing_ || !side_flushed_locked()) return;
      // Everything queued went: the close may go on.
      closed_ = true;
      closed_cv_.notify_all();
      close = true;
    } else {
      sending_.swap(queued_);
    }
  }
  if (close) {
    on_closed();
    close_socket(/*graceful=*/true);
    return;
  }
  if (std::shared_ptr<wire::ChunkedSource> waiting = sending_.blocked()) {
    // The next chunk is copied while the kernel still sends the last one.
    try {
      waiting->advance();
    } catch (const std::exception& e) {
      events_.connection_failed(shared_from_this(),
                                fmt::format("staging a tensor failed: {}", e.what()));
      return;
    }
  }
  buffers_.clear();
  sending_.for_each_piece(
      [&](const uint8_t* data, size_t size) { buffers_.emplace_back(data, size); });
  async_write(
      buffers_,
      asio::bind_executor(strand_, [self = shared_from_this()](
                                       const boost::system::error_code& error, size_t n) {
        if (!error) self->sending_.consume(n);
        if (error) {
          self->events_.connection_failed(self, "write failed: " + error.message());
          return;
        }
        self->write_some();
      }));
}

void StreamConnection::start_reading() {
  asio::post(strand_, [self = shared_from_this()] { self->read_some(); });
}

bool StreamConnection::is_end(const boost::system::error_code& error) const {
  return error == asio::error::eof;
}

void StreamConnection::stream_ended(std::string why) {
  events_.connection_failed(shared_from_this(), why);
}

void StreamConnection::read_some() {
  std::pair<uint8_t*, size_t> next;
  try {
    next = reader_.next_buffer();  // may fail to allocate a large body
  } catch (const std::exception& e) {
    events_.connection_failed(shared_from_this(),
                              fmt::format("protocol error: {}", e.what()));
    return;
  }
  async_read_some(
      asio::buffer(next.first, next.second),
      asio::bind_executor(strand_, [self = shared_from_this()](
                                       const boost::system::error_code& error, size_t n) {
        if (error) {
          self->stream_ended(self->is_end(error) ? "the peer closed the connection"
                                                 : "read failed: " + error.message());
          return;
        }
        self->last_recv_ns = now_ns();
        try {
          self->reader_.commit(n);
        } catch (const std::exception& e) {
          self->events_.connection_failed(self,
                                          fmt::format("protocol error: {}", e.what()));
          return;
        }
        if (self->drain()) self->read_some();
      }));
}

bool StreamConnection::drain() {
  wire::InboundFrame frame;
  for (;;) {
    try {
      if (!reader_.pop(frame)) return true;  // a stranger's next frame is parsed here
    } catch (const std::exception& e) {
      events_.connection_failed(shared_from_this(),
                                fmt::format("protocol error: {}", e.what()));
      return false;
    }
    if (!events_.on_frame(shared_from_this(), std::move(frame))) return false;
  }
}

void StreamConnection::replay(wire::InboundFrame frame) {
  asio::post(strand_, [self = shared_from_this(), frame = std::move(frame)]() mutable {
    if (!self->events_.on_frame(self, std::move(frame))) return;
    if (self->drain()) self->read_some();
  });
}

void StreamConnection::close_after_flush() {
  MutexLock lock(mu_);
  if (closed_ || closing_) return;
  closing_ = true;
  kick_locked();
}

bool StreamConnection::wait_closed(Clock::time_point deadline) {
  MutexLock lock(mu_);
  return closed_cv_.wait_until(mu_, deadline, [&]() SB_REQUIRES(mu_) { return closed_; });
}

void StreamConnection::close_now() {
  {
    MutexLock lock(mu_);
    if (closed_) return;
    closed_ = true;
    closed_cv_.notify_all();
  }
  on_closed();
  asio::post(strand_,
             [self = shared_from_this()] { self->close_socket(/*graceful=*/false); });
}

void StreamConnection::fail_later(std::string reason) {
  asio::post(strand_, [self = shared_from_this(), reason = std::move(reason)] {
    self->events_.connection_failed(self, reason);
  });
}

void StreamConnection::close_socket(bool graceful) {
  boost::system::error_code ignored;
  socket_.shutdown(graceful ? tcp::socket::shutdown_send : tcp::socket::shutdown_both,
                   ignored);
  socket_.close(ignored);
}

}  // namespace switchboard::agents::pipe::transport
