// One TCP connection of the PIPE agent to one peer, used in both
// directions: framed reads into a FrameReader, queued and coalesced writes
// (inline from the caller when nothing else is being written). Internal to
// //agents:pipe_agent.
//
// Thread safety: enqueue*(), close_after_flush(), wait_closed() and
// close_now() may be called from any thread; reads, write completions and
// the ConnectionEvents callbacks run on the connection's strand.
#pragma once

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "agents/pipe_frame.h"
#include "collective/tensor.h"
#include "rpc/message.h"

namespace switchboard::agents {

namespace asio = boost::asio;
using asio::ip::tcp;

// Steady-clock nanoseconds, for heartbeat bookkeeping.
int64_t now_ns();

struct Connection;

// What a connection reports to its agent (on the connection's strand).
class ConnectionEvents {
 public:
  virtual ~ConnectionEvents() = default;
  // A complete frame; false stops reading the connection.
  virtual bool on_frame(const std::shared_ptr<Connection>& connection,
                        pipe::InboundFrame frame) = 0;
  virtual void connection_failed(const std::shared_ptr<Connection>& connection,
                                 const std::string& reason) = 0;
};

// One TCP connection to one peer, used in both directions. Reads and
// writes run on the connection's strand; enqueue() may be called from any
// thread.
struct Connection : std::enable_shared_from_this<Connection> {
  Connection(ConnectionEvents& agent, tcp::socket socket, const pipe::FrameLimits& limits,
             pipe::FrameReader::Allocate allocate)
      : agent(agent),
        strand(asio::make_strand(socket.get_executor())),
        socket(std::move(socket)),
        reader(limits, std::move(allocate)) {
    boost::system::error_code ignored;
    this->socket.set_option(tcp::no_delay(true), ignored);
    last_recv_ns = now_ns();
  }

  // Queues one frame (and its tensors' bytes); false when closed. With
  // `send_now` and no write in flight, the calling thread sends what the
  // socket takes at once (lowest latency); otherwise the I/O thread sends
  // it, coalesced with whatever else is queued by then (fewer system calls
  // and packets under load).
  bool enqueue(const rpc::Message& m, const std::vector<Device>& devices, bool send_now);
  bool enqueue_control(pipe::FrameKind kind, const uint8_t* payload = nullptr,
                       size_t size = 0);
  void start_reading();
  // Continues after on_frame() returned false: the frames already parsed,
  // then reading.
  void resume_reading();
  // Closes once everything queued went out (or at once on error).
  void close_after_flush();
  // Waits until close_after_flush() finished (or the connection failed);
  // false at `deadline`.
  bool wait_closed(std::chrono::steady_clock::time_point deadline);
  void close_now();

  ConnectionEvents& agent;
  asio::strand<asio::any_io_executor> strand;
  tcp::socket socket;
  pipe::FrameReader reader;           // strand only
  std::atomic<int> peer{-1};          // set at hello
  std::atomic<bool> failed{false};    // connection_failed() ran
  std::atomic<int64_t> last_recv_ns;  // for the heartbeat check

 private:
  void kick_locked();
  void write_some();
  void read_some();
  // Hands parsed frames to the agent; false when it stopped reading.
  bool drain();

  std::mutex mu_;
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
  // Sends what is queued now, from the calling thread, without blocking
  // (MSG_DONTWAIT); keeps what the socket did not take. Only while no
  // write is in flight.
  void send_inline_locked();
  // Drops the first `n` bytes of the queued stream.
  void consume_locked(size_t n);

  std::vector<uint8_t> queued_;                         // GUARDED_BY(mu_)
  std::vector<QueuedTensor> queued_tensors_;            // GUARDED_BY(mu_)
  bool writing_ = false;                                // GUARDED_BY(mu_)
  bool closing_ = false;                                // GUARDED_BY(mu_)
  bool closed_ = false;                                 // GUARDED_BY(mu_)
  std::condition_variable closed_cv_;
  // The write in progress (strand only).
  std::vector<uint8_t> sending_;
  std::vector<QueuedTensor> sending_tensors_;
  std::vector<asio::const_buffer> buffers_;
};


}  // namespace switchboard::agents
