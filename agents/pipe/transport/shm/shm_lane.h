// ShmLane: the shm transport, the same-host lane of a TCP connection
// (tcp/tcp_connection.h). Each direction may move its frames through a
// shared-memory ring (shm/shm_ring.h) instead of the socket, when the peer
// can map it, which only a worker of the same host (and network, IPC and
// PID namespaces) can. The byte stream is the same as on the socket.
//
// The socket carries the negotiation and stays open: it is still read, and
// its end (the peer died or closed) is reported once the ring is drained.
// With its first data frame each side offers its ring (a kLane frame
// naming the segment and its host key); the peer answers accept or
// refuse; on accept, the offering side sends a switch marker on the socket
// and from then on writes every frame into the ring (a writer thread takes
// what does not fit at once). The peer reads the socket up to the marker,
// then the ring (on a reader thread). The negotiation
// (docs/wire_formats.md, "Same-host lane"):
//   kLane payload  1 + segment name + "\n" + host key   offer
//                  2                                   accept
//                  3 + reason                          refuse (that direction stays on
//                  TCP) 4                                   switch: the ring carries what
//                  follows
//
// The lane knows nothing of sockets: its connection (a LaneCarrier) sends
// its negotiation frames, decides when to switch, and reports the socket's
// end to it.
//
// Thread safety: every member function may be called from any thread;
// the carrier must call switch_out() under the lock that orders its own
// queue (so that nothing queued after the marker goes on the socket).
// The reader and writer threads report to the carrier's events; each holds
// the connection only while it works, and returns at once when the lane
// was destroyed meanwhile (also on that very thread).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "agents/pipe/transport/connection.h"
#include "agents/pipe/transport/frame_queue.h"
#include "agents/pipe/transport/shm/shm_ring.h"
#include "agents/pipe/wire/frame.h"
#include "common/mutex.h"
#include "core/message.h"

namespace switchboard::agents::pipe::transport {

// What the lane needs of the connection it rides beside.
class LaneCarrier {
 public:
  virtual ~LaneCarrier() = default;
  // The connection as its events know it; null once it is gone.
  virtual std::shared_ptr<Connection> lane_connection() = 0;
  virtual ConnectionEvents& lane_events() = 0;
  // Fails the connection with `reason`, later and on the carrier's own
  // thread: it is called under the lane's lock and must not block.
  virtual void lane_failed(std::string reason) = 0;
  // Everything queued into the ring went while the connection is closing:
  // the socket may close now.
  virtual void lane_flushed() = 0;
  // "rank N (address)", for the lane's logs.
  virtual std::string lane_peer() = 0;
};

class ShmLane {
 public:
  enum class Op : uint8_t {
    kNone = 0,
    kOffer = 1,
    kAccept = 2,
    kRefuse = 3,
    kSwitch = 4
  };

  // `capacity`: the ring this side offers (a power of two); 0: no lane,
  // neither offered nor accepted (`off_reason` says why, to the peer).
  // Received tensors come from `allocate`, frames are checked against
  // `limits`. `carrier` must outlive the lane.
  ShmLane(LaneCarrier& carrier, size_t capacity, std::string off_reason,
          const wire::FrameLimits& limits, wire::FrameReader::Allocate allocate,
          wire::FrameReader::Progress progress);
  // Stops the threads and joins them (detaches the one it runs on).
  ~ShmLane();
  ShmLane(const ShmLane&) = delete;
  ShmLane& operator=(const ShmLane&) = delete;

  // A negotiation frame's op and text.
  static std::pair<Op, std::string> parse(const std::vector<uint8_t>& payload);
  static std::vector<uint8_t> payload(Op op, std::string_view text = {});

  // Outbound, the offering side.
  // Makes this side's ring once, with the first data frame: the offer to
  // send on the socket, or nothing (no lane, already offered, or no ring
  // could be made: logged).
  std::optional<std::vector<uint8_t>> offer() SB_EXCLUDES(mu_);
  // The peer accepted: frames go through the ring from now on (a writer
  // thread starts). The carrier queued the switch marker just before,
  // under its own lock. False when nothing was offered or it already
  // switched (a protocol error).
  bool switch_out() SB_EXCLUDES(mu_);
  // The peer refused (logged with `reason`); false when nothing was offered.
  bool refused(const std::string& reason) SB_EXCLUDES(mu_);
  bool out_active() const { return out_ring_.load() != nullptr; }
  // Queues a frame into the ring (after switch_out()); what does not fit
  // now goes from the writer thread.
  void enqueue(const rpc::Message& m, const std::vector<Device>& devices,
               const std::vector<wire::TensorRoute>& routes) SB_EXCLUDES(mu_);
  void enqueue_control(wire::FrameKind kind, uint64_t id, const uint8_t* data,
                       size_t size) SB_EXCLUDES(mu_);
  // Whether everything queued went into the ring.
  bool out_flushed() const SB_EXCLUDES(mu_);
  // The connection closes once the ring took what is queued: the writer
  // calls lane_flushed() then.
  void close_after_flush() SB_EXCLUDES(mu_);

  // Inbound, the answering side.
  // The peer offered its ring: the answer to send (accept, or refuse with
  // the reason).
  std::vector<uint8_t> answer(const std::string& offer) SB_EXCLUDES(in_mu_);
  // The switch marker arrived: what follows comes from the ring (a reader
  // thread starts). False when nothing was accepted or it already switched.
  bool switch_in() SB_EXCLUDES(in_mu_);
  bool in_active() const { return in_active_.load(); }
  // The socket ended (`why`): reported once the ring is drained.
  void socket_ended(std::string why) SB_EXCLUDES(in_mu_);

  // Stops the threads' loops (they return within their next wait).
  void stop();
  // stop(), then waits for the threads (unless called on one): after it,
  // nothing of this lane reports to the carrier.
  void join();

 private:
  // One direction's ring and the segment it lives in.
  struct Ring {
    ShmSegment segment;
    std::unique_ptr<ShmRing> ring;
  };
  using Alive = std::shared_ptr<std::atomic<bool>>;

  // Writes what is queued into the ring, as far as it fits; true when all
  // of it went. Throws ShmRingCorrupt.
  bool write_locked() SB_REQUIRES(mu_);
  // Writes, or reports a corrupt ring to the carrier.
  void write_or_fail_locked() SB_REQUIRES(mu_);
  void write_loop(const Alive& alive);
  void read_loop(const Alive& alive);

  LaneCarrier& carrier_;
  const size_t capacity_;
  const std::string off_reason_;
  const wire::FrameLimits limits_;
  const wire::FrameReader::Allocate allocate_;
  const wire::FrameReader::Progress progress_;

  mutable Mutex mu_;  // the outbound direction
  CondVar queued_cv_;
  bool offered_ SB_GUARDED_BY(mu_) = false;
  bool closing_ SB_GUARDED_BY(mu_) = false;
  std::unique_ptr<Ring> offer_ SB_GUARDED_BY(mu_);  // offered, not yet answered
  std::unique_ptr<Ring> out_ SB_GUARDED_BY(mu_);    // frames go through it
  FrameQueue queued_ SB_GUARDED_BY(mu_);
  std::atomic<ShmRing*> out_ring_{nullptr};  // out_'s, for waits without mu_

  Mutex in_mu_;                                           // the inbound direction
  std::unique_ptr<Ring> in_offer_ SB_GUARDED_BY(in_mu_);  // accepted, before the switch
  std::unique_ptr<Ring> in_;  // set before the reader thread starts; then its own
  std::string socket_end_ SB_GUARDED_BY(in_mu_);  // why the socket ended
  std::atomic<ShmRing*> in_ring_{nullptr};        // in_'s, to wake it
  std::atomic<bool> socket_ended_{false};
  std::atomic<bool> in_active_{false};

  std::atomic<bool> stop_{false};
  std::thread writer_;
  std::thread reader_;
  const Alive alive_ = std::make_shared<std::atomic<bool>>(true);
};

}  // namespace switchboard::agents::pipe::transport
