// ShmRing: a single-producer, single-consumer byte pipe through memory
// shared by two processes on one host: the same-host lane of PIPE
// connections (agents/pipe/transport/shm/shm_lane.h), which carries the very bytes
// the TCP socket would, without a system call when neither side sleeps.
//
//   // writer's process                        // reader's process
//   ShmSegment seg = ShmSegment::create(cap);  ShmSegment seg = ShmSegment::open(name);
//   ShmRing out(seg, ShmRing::kProducer);      ShmRing in(seg, ShmRing::kConsumer);
//   size_t n = out.write_some(data, size);     auto [p, n] = in.readable();
//   out.wait_space(...) when n < size;         ... use p[0..n) ...; in.consume(n);
//                                              in.wait_data(...) when n == 0;
//
// The segment: a SharedMemory (common/shared_memory.h) of the writer's,
// sealed, which the reader opens by its name ("<pid>/<fd>", sent over the
// connection's authenticated socket). Nothing is ever left in /dev/shm or
// anywhere else: the memory goes with the last mapping.
//
// Layout (docs/wire_formats.md, "Same-host lane"): a 256-byte header, then
// `capacity` data bytes (a power of two). head and tail count bytes since
// the start (wrapping at 2^64); data byte i lives at offset i % capacity.
//
// A hostile peer: the other process may write anything into the segment
// at any time. The reader never reads outside its mapping (it masks every
// index with the capacity it validated when it mapped, and never reads it
// again), and checks that the writer's head stays within `capacity` of its
// own tail; the writer checks the reader's tail the same way. A violation
// throws ShmRingCorrupt (the connection is then closed); bytes that are no
// frame are the frame reader's business, as on TCP.
//
// Wake-ups: a side that finds nothing to do spins briefly, then sleeps on
// a futex word in the header; the other side wakes it only when it said it
// sleeps. How long it spins adapts to the gaps it sees (SpinBudget): long
// while the other side answers quickly, about a microsecond while it does
// not, so that a peer busy between messages (Python) never finds its core
// taken by our spin. Waits are bounded (they return to let the caller check its own
// stop flag), so a peer that never wakes us cannot hold a thread forever.
//
// Thread safety: one producer thread at a time and one consumer thread at a
// time per ring (the connection serializes them); close() from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "common/shared_memory.h"

namespace switchboard::agents::pipe {

class ShmRingCorrupt : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The ring's memory: a SharedMemory (common/shared_memory.h) of a header
// and a power of two of data bytes. Move-only; unmaps (and closes) on
// destruction.
class ShmSegment {
 public:
  // Makes a sealed memory file of `data_capacity` (a power of two, >= 4096)
  // bytes of ring data plus the header, its pages reserved, mapped.
  // Throws std::invalid_argument for a bad capacity, std::system_error
  // (naming the step) when the file cannot be made, reserved or mapped.
  static ShmSegment create(size_t data_capacity);
  // Maps the file another process made (`name`: its "<pid>/<fd>").
  // Throws std::invalid_argument for a name of another form,
  // std::system_error when it cannot be opened or mapped, ShmRingCorrupt
  // when it is not sealed against shrinking and growing or its size is not
  // a header plus a power of two.
  static ShmSegment open(const std::string& name);
  // Over memory the caller owns (tests, the fuzzer): nothing is unmapped.
  static ShmSegment borrow(void* data, size_t size);

  ShmSegment() = default;

  void* data() const { return memory_.data(); }
  size_t size() const { return memory_.size(); }
  // create()'s: how a reader opens it ("<pid>/<fd>"); empty otherwise.
  const std::string& name() const { return memory_.name(); }

 private:
  explicit ShmSegment(SharedMemory memory) : memory_(std::move(memory)) {}
  SharedMemory memory_;
};

// How long one side of a ring spins before it sleeps, in nanoseconds:
// starts at the longest spin, and after each sleep moves towards twice the
// time the wait took, or halves when that was longer than any spin.
// Not thread-safe: each side's waits run on one thread at a time.
class SpinBudget {
 public:
  static constexpr int64_t kMinNs = 1'000;
  static constexpr int64_t kMaxNs = 50'000;

  int64_t budget_ns() const { return budget_ns_; }
  // A wait that spun all of its budget and then slept ended, with bytes
  // (or room), `waited_ns` after it began.
  void slept(int64_t waited_ns);

 private:
  int64_t budget_ns_ = kMaxNs;
};

class ShmRing {
 public:
  enum Role { kProducer, kConsumer };
  static constexpr size_t kHeaderBytes = 256;

  // The producer initializes the header (a fresh segment); the consumer
  // validates it and keeps its own copy of the capacity. Throws
  // ShmRingCorrupt for a segment that is no ring. `segment` must outlive
  // the ring.
  ShmRing(const ShmSegment& segment, Role role);

  size_t capacity() const { return capacity_; }

  // Producer: copies up to `size` bytes in; returns how many fit (0 when
  // full) and wakes a sleeping consumer.
  size_t write_some(const uint8_t* data, size_t size);
  // Producer: until there is room, the ring is closed, `stop` is set or
  // `timeout` passed; true when there is room.
  bool wait_space(const std::atomic<bool>& stop, std::chrono::microseconds timeout);

  // Consumer: the bytes that can be read now, contiguous (up to the end of
  // the data area; the rest after consume()). Throws ShmRingCorrupt.
  std::pair<const uint8_t*, size_t> readable();
  // Consumer: marks `n` bytes (of the last readable()) read, and wakes a
  // producer waiting for room.
  void consume(size_t n);
  // Consumer: until there are bytes, the ring is closed, `stop` is set or
  // `timeout` passed; true when there are bytes.
  bool wait_data(const std::atomic<bool>& stop, std::chrono::microseconds timeout);

  // Either side: marks the ring closed and wakes both.
  void close();
  bool closed() const;
  // Wakes both sides' waits (after setting a stop flag they check).
  void wake_all();

 private:
  struct Header;

  Header* header_;
  uint8_t* data_;
  size_t capacity_;    // validated once; never read from the segment again
  uint64_t position_;  // our own head (producer) or tail (consumer)
  SpinBudget spin_;    // of wait_space (producer) or wait_data (consumer)
};

}  // namespace switchboard::agents::pipe
