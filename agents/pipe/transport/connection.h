// Connection and ConnectionEvents: the PIPE agent's view of one connection
// to one peer, whatever carries it (the transports under agents/pipe/transport/: tcp,
// tls, shm; a transport is chosen through agents/pipe/transport/transport.h). Internal to
// //agents (no Asio here).
//
// A connection is used in both directions: frames queued with enqueue*()
// go out in order; frames read from it are handed to its ConnectionEvents
// one at a time, in order, on the connection's strand (one thread at a time).
//
// Thread safety: every member function may be called from any thread.
// Ownership: shared; in-flight I/O holds a reference, so a connection lives
// until it is closed and its operations completed. The ConnectionEvents
// given to a connection must outlive it (the agent joins its I/O threads
// before it goes away).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agents/pipe/wire/frame.h"
#include "common/auth.h"
#include "core/message.h"
#include "core/tensor.h"

namespace switchboard::agents::pipe::transport {

// Steady-clock nanoseconds, for heartbeat bookkeeping.
inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class Connection;

// What a connection reports to its agent, on the connection's strand.
class ConnectionEvents {
 public:
  virtual ~ConnectionEvents() = default;
  // A complete frame; false stops reading the connection (until replay()).
  virtual bool on_frame(const std::shared_ptr<Connection>& connection,
                        wire::InboundFrame frame) = 0;
  // The connection failed (closed by the peer, an I/O error, bytes that are
  // not a frame: `reason` says which). Also called by the agent itself to
  // close a connection; runs at least once per failure, the agent keeps
  // the first.
  virtual void connection_failed(const std::shared_ptr<Connection>& connection,
                                 const std::string& reason) = 0;
};

class Connection {
 public:
  virtual ~Connection() = default;
  static uint64_t next_serial() {
    static std::atomic<uint64_t> last{0};
    return last.fetch_add(1, std::memory_order_relaxed) + 1;
  }

  // Queues one frame (and its tensors' bytes, which must stay unchanged
  // until sent, but for the tensors `routes` hands to a channel: see
  // wire::append_frame); false when the connection is closed or closing. With
  // `send_now` and no write in flight, the calling thread sends what the
  // connection takes at once (lowest latency); otherwise an I/O thread
  // sends it, coalesced with whatever else is queued by then.
  virtual bool enqueue(const rpc::Message& m, const std::vector<Device>& devices,
                       const std::vector<wire::TensorRoute>& routes, bool send_now) = 0;
  // Queues a frame of `kind` with an opaque payload (hello, heartbeat,
  // goodbye) or with an id only (cancel); false when closed or closing.
  virtual bool enqueue_control(wire::FrameKind kind, const uint8_t* payload = nullptr,
                               size_t size = 0, uint64_t id = 0) = 0;
  // Starts handing frames to the events (once).
  virtual void start_reading() = 0;
  // Hands `frame`, which on_frame() returned false for, to the events again
  // on the strand; when accepted this time, the connection goes on with the
  // frames read after it.
  virtual void replay(wire::InboundFrame frame) = 0;
  // Closes once everything queued went out (or at once on error).
  virtual void close_after_flush() = 0;
  // Waits until close_after_flush() finished or the connection closed;
  // false at `deadline`.
  virtual bool wait_closed(std::chrono::steady_clock::time_point deadline) = 0;
  // Closes now; queued frames are dropped. Idempotent.
  virtual void close_now() = 0;
  // A kLane frame's payload (the same-host lane's negotiation), handed on
  // by the agent once the peer is identified and authenticated. Transports
  // without a lane ignore it.
  virtual void on_lane_frame(const std::vector<uint8_t>& payload) { (void)payload; }

  // The agent's bookkeeping, on any thread: the peer's rank once its hello
  // named it (-1 before), whether connection_failed() ran for it, and when
  // bytes last arrived (now_ns(); for the heartbeat check).
  std::atomic<int> peer{-1};
  std::atomic<bool> failed{false};
  std::atomic<int64_t> last_recv_ns{now_ns()};
  // When the connection was made (now_ns()): an accepted one that has not
  // said an authenticated hello by the hello deadline is closed, however
  // slowly it keeps sending.
  const int64_t opened_ns = now_ns();
  // Set by the agent once the peer is identified and authenticated (or
  // identified, without a job secret): until then its frames must fit the
  // stranger limits (wire::kMaxStrangerFrameBytes, no tensors) and are read
  // one at a time (wire::FrameReader::set_trust). Never cleared.
  std::atomic<bool> trusted{false};

  // Tells this connection apart from every other of this process, also
  // one made later at the same address (the handshake keeps its state by
  // it: agents/pipe/handshake.h).
  const uint64_t serial = next_serial();
};

}  // namespace switchboard::agents::pipe::transport
