#include "agents/pipe/transport/tcp/tcp_connection.h"

#include <fmt/format.h>

#include <boost/asio/write.hpp>

namespace switchboard::agents::pipe::transport {

namespace asio = boost::asio;
using asio::ip::tcp;
using rpc::Message;

TcpConnection::TcpConnection(ConnectionEvents& events, tcp::socket socket,
                             const wire::FrameLimits& limits,
                             wire::FrameReader::Allocate allocate,
                             wire::FrameReader::Progress progress, size_t lane_capacity)
    : StreamConnection(events, std::move(socket), limits, allocate, progress),
      lane_(std::make_unique<ShmLane>(static_cast<LaneCarrier&>(*this), lane_capacity,
                                      "this worker has it off", limits,
                                      std::move(allocate), std::move(progress))) {}

TcpConnection::~TcpConnection() {
  // Before anything of this object goes: the lane's threads call it.
  lane_.reset();
}

void TcpConnection::async_write(const std::vector<asio::const_buffer>& buffers,
                                IoDone done) {
  asio::async_write(socket_, buffers, std::move(done));
}

void TcpConnection::async_read_some(asio::mutable_buffer buffer, IoDone done) {
  socket_.async_read_some(buffer, std::move(done));
}

bool TcpConnection::enqueue(const Message& m, const std::vector<Device>& devices,
                            const std::vector<wire::TensorRoute>& routes, bool send_now) {
  MutexLock lock(mu_);
  if (closing_or_closed_locked()) return false;
  if (lane_->out_active()) {
    lane_->enqueue(m, devices, routes);
    return true;
  }
  offer_lane_locked();
  enqueue_locked(m, devices, routes, send_now);
  return true;
}

bool TcpConnection::enqueue_control(wire::FrameKind kind, const uint8_t* payload,
                                    size_t size, uint64_t id) {
  {
    MutexLock lock(mu_);
    if (closing_or_closed_locked()) return false;
    if (lane_->out_active()) {
      lane_->enqueue_control(kind, id, payload, size);
      return true;
    }
  }
  return StreamConnection::enqueue_control(kind, payload, size, id);
}

void TcpConnection::close_after_flush() {
  lane_->close_after_flush();
  StreamConnection::close_after_flush();
}

void TcpConnection::stream_ended(std::string why) {
  if (lane_->in_active()) {
    // What the peer wrote into the ring before it went is read first; the
    // lane's reader then reports the end.
    lane_->socket_ended(std::move(why));
    return;
  }
  StreamConnection::stream_ended(std::move(why));
}

std::string TcpConnection::lane_peer() {
  return fmt::format("rank {} ({})", peer.load(), remote_address());
}

void TcpConnection::offer_lane_locked() {
  if (std::optional<std::vector<uint8_t>> offer = lane_->offer()) {
    queued_.append_control(wire::FrameKind::kLane, 0, offer->data(), offer->size());
  }
}

void TcpConnection::on_lane_frame(const std::vector<uint8_t>& payload) {
  auto [op, text] = ShmLane::parse(payload);
  bool expected = false;
  switch (op) {
    case ShmLane::Op::kOffer: {
      const std::vector<uint8_t> answer = lane_->answer(text);
      enqueue_control(wire::FrameKind::kLane, answer.data(), answer.size());
      return;
    }
    case ShmLane::Op::kAccept: {
      // The marker and the switch under one lock: every frame queued after
      // the marker goes into the ring.
      MutexLock lock(mu_);
      if (closing_or_closed_locked()) return;
      expected = lane_->switch_out();
      if (expected) {
        const std::vector<uint8_t> marker = ShmLane::payload(ShmLane::Op::kSwitch);
        queued_.append_control(wire::FrameKind::kLane, 0, marker.data(), marker.size());
        kick_locked();
      }
      break;
    }
    case ShmLane::Op::kRefuse:
      expected = lane_->refused(text);
      break;
    case ShmLane::Op::kSwitch:
      expected = lane_->switch_in();
      break;
    case ShmLane::Op::kNone:
      break;
  }
  if (expected) return;
  fail_later(fmt::format("protocol error: an unexpected lane frame (op {}, {} bytes)",
                         static_cast<int>(op), payload.size()));
}

}  // namespace switchboard::agents::pipe::transport
