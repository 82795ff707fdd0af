// TcpConnection: the tcp transport's Connection (agents/pipe/transport/connection.h),
// one plain TCP socket. Frames queued when nothing else is being written
// go out from the caller's thread at once (sendmsg, MSG_DONTWAIT: the
// lowest latency); the rest is coalesced into one write on the strand
// (stream_connection.h). With a lane capacity, the same-host lane
// (shm/shm_lane.h) may take either direction's frames into shared memory
// once the peer, identified and authenticated, accepted it.
// Made by the tcp transport (tcp/tcp_transport.h). Internal to the PIPE
// agent's transports.
//
// Thread safety: as Connection.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <memory>
#include <string>
#include <vector>

#include "agents/pipe/transport/shm/shm_lane.h"
#include "agents/pipe/transport/stream_connection.h"

namespace switchboard::agents::pipe::transport {

class TcpConnection final : public StreamConnection, private LaneCarrier {
 public:
  // Takes `socket` (connected); reports to `events`, which must outlive the
  // connection; received tensors come from `allocate`, frames are checked
  // against `limits`. `lane_capacity`: the ring this side offers for the
  // same-host lane (a power of two; 0: no lane, neither offered nor
  // accepted).
  TcpConnection(ConnectionEvents& events, boost::asio::ip::tcp::socket socket,
                const wire::FrameLimits& limits, wire::FrameReader::Allocate allocate,
                wire::FrameReader::Progress progress, size_t lane_capacity);
  // Stops the lane's threads (joins them, unless called on one).
  ~TcpConnection() override;

  bool enqueue(const rpc::Message& m, const std::vector<Device>& devices,
               const std::vector<wire::TensorRoute>& routes, bool send_now) override
      SB_EXCLUDES(mu_);
  bool enqueue_control(wire::FrameKind kind, const uint8_t* payload = nullptr,
                       size_t size = 0, uint64_t id = 0) override SB_EXCLUDES(mu_);
  void close_after_flush() override SB_EXCLUDES(mu_);
  void on_lane_frame(const std::vector<uint8_t>& payload) override SB_EXCLUDES(mu_);

  // Stops the lane's threads and waits for them (unless called on one):
  // after it, nothing of this connection reports to its events. The
  // transport calls it once its I/O threads are done, so that the events
  // (the agent) may go.
  void join_lane() { lane_->join(); }
  // Whether frames go out through / come in through the lane now.
  bool lane_out_active() const { return lane_->out_active(); }
  bool lane_in_active() const { return lane_->in_active(); }

 private:
  void async_write(const std::vector<boost::asio::const_buffer>& buffers,
                   IoDone done) override;
  void async_read_some(boost::asio::mutable_buffer buffer, IoDone done) override;
  bool sends_inline() const override { return true; }
  void stream_ended(std::string why) override;
  bool side_flushed_locked() override SB_REQUIRES(mu_) { return lane_->out_flushed(); }
  void on_closed() override { lane_->stop(); }

  // LaneCarrier.
  std::shared_ptr<Connection> lane_connection() override {
    return weak_from_this().lock();
  }
  ConnectionEvents& lane_events() override { return events_; }
  void lane_failed(std::string reason) override { fail_later(std::move(reason)); }
  void lane_flushed() override { kick(); }
  std::string lane_peer() override;

  // With the first data frame: queues this side's offer of the lane.
  void offer_lane_locked() SB_REQUIRES(mu_);

  std::unique_ptr<ShmLane> lane_;  // never null; set in the constructor
};

}  // namespace switchboard::agents::pipe::transport
