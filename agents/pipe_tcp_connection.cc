#include "agents/pipe_tcp_connection.h"

#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include "agents/pipe_tls.h"

namespace switchboard::agents {

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using rpc::Message;

TcpConnection::TcpConnection(ConnectionEvents& events, tcp::socket socket,
                             const pipe::FrameLimits& limits,
                             pipe::FrameReader::Allocate allocate,
                             std::shared_ptr<asio::ssl::context> tls, size_t lane_capacity)
    : events_(events),
      strand_(asio::make_strand(socket.get_executor())),
      socket_(std::move(socket)),
      reader_(limits, allocate),
      tls_context_(std::move(tls)),
      lane_capacity_(tls_context_ ? 0 : lane_capacity),
      limits_(limits),
      allocate_(std::move(allocate)) {
  // The reader belongs to this object: `this` outlives it.
  reader_.set_trust([this] { return trusted.load(); });
  boost::system::error_code ignored;
  socket_.set_option(tcp::no_delay(true), ignored);
  if (tls_context_) {
    tls_ = std::make_unique<asio::ssl::stream<tcp::socket&>>(socket_, *tls_context_);
  }
}

std::string TcpConnection::remote_address() const {
  boost::system::error_code error;
  const tcp::endpoint peer = socket_.remote_endpoint(error);
  if (error) return "";
  return fmt::format("{}:{}", peer.address().to_string(), peer.port());
}

void TcpConnection::handshake(bool client, std::chrono::milliseconds timeout,
                              HandshakeDone done) {
  asio::post(strand_, [self = shared_from_this(), client, timeout,
                       done = std::move(done)]() mutable {
    // A peer that says nothing is cut off at `timeout`: the socket closes
    // under the handshake, which then fails.
    auto timer = std::make_shared<asio::steady_timer>(self->strand_);
    timer->expires_after(timeout);
    timer->async_wait([self, timer](const boost::system::error_code& error) {
      if (error) return;
      self->handshake_timed_out_ = true;
      boost::system::error_code ignored;
      self->socket_.close(ignored);
    });
    self->tls_->async_handshake(
        client ? asio::ssl::stream_base::client : asio::ssl::stream_base::server,
        asio::bind_executor(self->strand_, [self, timer, timeout, done = std::move(done)](
                                               const boost::system::error_code& error) {
          timer->cancel();
          if (!error && !self->handshake_timed_out_) {
            done("", false);
          } else if (self->handshake_timed_out_) {
            done(fmt::format("no TLS handshake within {} ms", timeout.count()), false);
          } else {
            done(tls_failure_reason(error, self->tls_->native_handle()),
                 error.category() == asio::error::get_ssl_category());
          }
        }));
  });
}

bool TcpConnection::enqueue(const Message& m, const std::vector<Device>& devices,
                         bool send_now) {
  MutexLock lock(mu_);
  if (closed_ || closing_) return false;
  if (lane_out_) {
    pipe::append_frame(lane_queued_, m, devices);
    for (const Tensor& t : m.tensors) {
      if (t.nbytes() > 0) lane_queued_tensors_.push_back({lane_queued_.size(), t, 0});
    }
    try {
      if (!write_lane_locked()) lane_queued_cv_.notify_all();  // the writer thread goes on
    } catch (const ShmRingCorrupt& e) {
      fail_later(std::string("protocol error: ") + e.what());
    }
    return true;
  }
  if (!lane_offered_ && lane_capacity_ > 0) offer_lane_locked();
  pipe::append_frame(queued_, m, devices);
  for (const Tensor& t : m.tensors) {
    if (t.nbytes() > 0) queued_tensors_.push_back({queued_.size(), t, 0});
  }
  if (send_now && !writing_ && !tls_) send_inline_locked();
  if (!queued_.empty() || !queued_tensors_.empty()) kick_locked();
  return true;
}

void TcpConnection::send_inline_locked() {
  if (closed_ || (queued_.empty() && queued_tensors_.empty())) return;
  // A few pieces cover the common case (a frame or a handful of small
  // ones); more go to the asynchronous path whole.
  constexpr size_t kMaxPieces = 64;
  iovec pieces[kMaxPieces];
  size_t count = 0;
  bool all = true;
  for_each_piece(queued_, queued_tensors_, [&](const uint8_t* data, size_t size) {
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
  const ssize_t n = ::sendmsg(socket_.native_handle(), &header, MSG_DONTWAIT | MSG_NOSIGNAL);
  // Errors (EAGAIN, a reset) are left to the asynchronous path, which
  // retries or reports them.
  if (n > 0) consume_locked(static_cast<size_t>(n));
}

void TcpConnection::consume(std::vector<uint8_t>& bytes, std::vector<QueuedTensor>& tensors,
                            size_t n) {
  size_t at = 0;        // frame bytes fully sent
  size_t finished = 0;  // tensors fully sent
  while (n > 0) {
    const size_t end = finished < tensors.size() ? tensors[finished].offset : bytes.size();
    const size_t taken = std::min(n, end - at);
    at += taken;
    n -= taken;
    if (n == 0 || finished == tensors.size()) break;
    QueuedTensor& t = tensors[finished];
    const size_t take = std::min(n, t.tensor.nbytes() - t.sent);
    t.sent += take;
    n -= take;
    if (t.sent < t.tensor.nbytes()) break;
    ++finished;
  }
  bytes.erase(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(at));
  tensors.erase(tensors.begin(), tensors.begin() + static_cast<std::ptrdiff_t>(finished));
  for (QueuedTensor& t : tensors) t.offset -= at;
}

bool TcpConnection::enqueue_control(pipe::FrameKind kind, const uint8_t* payload,
                                 size_t size, uint64_t id) {
  MutexLock lock(mu_);
  if (closed_ || closing_) return false;
  if (lane_out_) {
    pipe::append_control_frame(lane_queued_, kind, id, payload, size);
    try {
      if (!write_lane_locked()) lane_queued_cv_.notify_all();
    } catch (const ShmRingCorrupt& e) {
      fail_later(std::string("protocol error: ") + e.what());
    }
    return true;
  }
  pipe::append_control_frame(queued_, kind, id, payload, size);
  kick_locked();
  return true;
}

void TcpConnection::kick_locked() {
  if (writing_) return;
  writing_ = true;
  asio::post(strand_, [self = shared_from_this()] { self->write_some(); });
}

void TcpConnection::write_some() {
  {
    MutexLock lock(mu_);
    if (closed_) return;
    if (queued_.empty() && queued_tensors_.empty()) {
      writing_ = false;
      // Closed once the lane's queue went too (its writer kicks again).
      if (closing_ && lane_queue_empty_locked()) {
        closed_ = true;
        closed_cv_.notify_all();
        stop_lane();
        boost::system::error_code ignored;
        socket_.shutdown(tcp::socket::shutdown_send, ignored);
        socket_.close(ignored);
      }
      return;
    }
    sending_.swap(queued_);
    sending_tensors_.swap(queued_tensors_);
  }
  buffers_.clear();
  for_each_piece(sending_, sending_tensors_,
                 [&](const uint8_t* data, size_t size) { buffers_.emplace_back(data, size); });
  auto written = asio::bind_executor(
      strand_, [self = shared_from_this()](const boost::system::error_code& error, size_t) {
        self->sending_.clear();
        self->sending_tensors_.clear();
        if (error) {
          self->events_.connection_failed(self, "write failed: " + error.message());
          return;
        }
        self->write_some();
      });
  on_stream([&](auto& stream) { asio::async_write(stream, buffers_, std::move(written)); });
}

void TcpConnection::start_reading() {
  asio::post(strand_, [self = shared_from_this()] { self->read_some(); });
}

void TcpConnection::read_some() {
  std::pair<uint8_t*, size_t> next;
  try {
    next = reader_.next_buffer();  // may fail to allocate a large body
  } catch (const std::exception& e) {
    events_.connection_failed(shared_from_this(), fmt::format("protocol error: {}", e.what()));
    return;
  }
  auto arrived = asio::bind_executor(
      strand_, [self = shared_from_this()](const boost::system::error_code& error, size_t n) {
        if (error) {
          // A TLS peer that closes its socket without a close_notify reads
          // as a truncated stream: to the agent, the same end.
          const bool closed =
              error == asio::error::eof || error == asio::ssl::error::stream_truncated;
          std::string why =
              closed ? "the peer closed the connection" : "read failed: " + error.message();
          if (self->lane_in_active_) {
            // What the peer wrote into the ring before it went is read
            // first; the lane's reader then reports the end.
            {
              MutexLock lock(self->lane_in_mu_);
              self->socket_end_ = std::move(why);
            }
            self->socket_ended_ = true;
            if (ShmRing* ring = self->lane_in_ring_.load()) ring->wake_all();
            return;
          }
          self->events_.connection_failed(self, why);
          return;
        }
        self->last_recv_ns = now_ns();
        try {
          self->reader_.commit(n);
        } catch (const std::exception& e) {
          self->events_.connection_failed(self, fmt::format("protocol error: {}", e.what()));
          return;
        }
        if (self->drain()) self->read_some();
      });
  on_stream([&](auto& stream) {
    stream.async_read_some(asio::buffer(next.first, next.second), std::move(arrived));
  });
}

bool TcpConnection::drain() {
  pipe::InboundFrame frame;
  for (;;) {
    try {
      if (!reader_.pop(frame)) return true;  // a stranger's next frame is parsed here
    } catch (const std::exception& e) {
      events_.connection_failed(shared_from_this(), fmt::format("protocol error: {}", e.what()));
      return false;
    }
    if (!events_.on_frame(shared_from_this(), std::move(frame))) return false;
  }
}

void TcpConnection::replay(pipe::InboundFrame frame) {
  asio::post(strand_, [self = shared_from_this(), frame = std::move(frame)]() mutable {
    if (!self->events_.on_frame(self, std::move(frame))) return;
    if (self->drain()) self->read_some();
  });
}

void TcpConnection::close_after_flush() {
  MutexLock lock(mu_);
  if (closed_ || closing_) return;
  closing_ = true;
  lane_queued_cv_.notify_all();
  kick_locked();
}

bool TcpConnection::wait_closed(Clock::time_point deadline) {
  MutexLock lock(mu_);
  return closed_cv_.wait_until(mu_, deadline, [&]() SB_REQUIRES(mu_) { return closed_; });
}

void TcpConnection::close_now() {
  {
    MutexLock lock(mu_);
    if (closed_) return;
    closed_ = true;
    closed_cv_.notify_all();
  }
  stop_lane();
  asio::post(strand_, [self = shared_from_this()] {
    boost::system::error_code ignored;
    self->socket_.shutdown(tcp::socket::shutdown_both, ignored);
    self->socket_.close(ignored);
  });
}

}  // namespace switchboard::agents
