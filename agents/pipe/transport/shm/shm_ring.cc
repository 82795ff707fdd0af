#include "agents/pipe/transport/shm/shm_ring.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <thread>

namespace switchboard::agents::pipe {

namespace {

constexpr uint32_t kMagic = 0x53425249;  // "SBRI"
constexpr uint32_t kVersion = 1;
// Spinning before sleeping: bytes that come within the spin are picked up
// without a system call on either side. How long a side spins adapts to
// the gaps it sees (SpinBudget, shm_ring.h): up to kMaxNs while the other
// side answers within it (a ping-pong of small calls), down to kMinNs
// while it does not (a peer that runs Python between messages), so that
// the spin never takes a core from the work that makes the next message.
// Clock reads while spinning: one every this many pauses (~20 ns each).
constexpr int kPausesPerClockRead = 16;
// How much a writer copies before it publishes the bytes to the reader.
constexpr size_t kChunk = 16 * 1024;

bool power_of_two(uint64_t n) { return n != 0 && (n & (n - 1)) == 0; }

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Spins until `ready()` or `done()`, for at most `budget_ns` since `start`;
// true when `ready()`.
template <typename Ready, typename Done>
bool spin(int64_t start, int64_t budget_ns, Ready ready, Done done) {
  for (int i = 1;; ++i) {
    if (ready()) return true;
    if (done()) return false;
    cpu_relax();
    if (i % kPausesPerClockRead == 0 && now_ns() - start >= budget_ns) return ready();
  }
}

}  // namespace

// The shared header. Every field is written by one side only (the
// producer: magic, version, capacity, head, data_word, producer_sleeping;
// the consumer: tail, space_word, consumer_sleeping), except `closed`.
struct ShmRing::Header {
  uint32_t magic;
  uint32_t version;
  uint64_t capacity;
  alignas(64) std::atomic<uint64_t> head;
  std::atomic<uint32_t> data_word;
  std::atomic<uint32_t> producer_sleeping;
  alignas(64) std::atomic<uint64_t> tail;
  std::atomic<uint32_t> space_word;
  std::atomic<uint32_t> consumer_sleeping;
  alignas(64) std::atomic<uint32_t> closed;
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

// ------------------------------------------------------------ ShmSegment

ShmSegment ShmSegment::create(size_t data_capacity) {
  if (!power_of_two(data_capacity) || data_capacity < 4096) {
    throw std::invalid_argument(
        fmt::format("shared-memory ring: capacity {} is not a power of two >= 4096",
                    data_capacity));
  }
  return ShmSegment(
      SharedMemory::create(ShmRing::kHeaderBytes + data_capacity, "switchboard-ring"));
}

ShmSegment ShmSegment::open(const std::string& name) {
  SharedMemory memory;
  try {
    memory = SharedMemory::open(name);
  } catch (const SharedMemoryRefused& e) {
    throw ShmRingCorrupt(e.what());
  }
  const size_t size = memory.size();
  if (size <= ShmRing::kHeaderBytes || !power_of_two(size - ShmRing::kHeaderBytes) ||
      size - ShmRing::kHeaderBytes > (size_t{1} << 32)) {
    throw ShmRingCorrupt(
        fmt::format("shared-memory segment {}: {} bytes, not a ring's", name, size));
  }
  return ShmSegment(std::move(memory));
}

ShmSegment ShmSegment::borrow(void* data, size_t size) {
  return ShmSegment(SharedMemory::borrow(data, size));
}

// --------------------------------------------------------------- ShmRing

ShmRing::ShmRing(const ShmSegment& segment, Role role)
    : header_(static_cast<Header*>(segment.data())),
      data_(static_cast<uint8_t*>(segment.data()) + kHeaderBytes),
      capacity_(segment.size() > kHeaderBytes ? segment.size() - kHeaderBytes : 0),
      position_(0) {
  // The layout docs/wire_formats.md gives ("Same-host lane").
  static_assert(sizeof(Header) <= kHeaderBytes);
  static_assert(offsetof(Header, capacity) == 8 && offsetof(Header, head) == 64 &&
                offsetof(Header, tail) == 128 && offsetof(Header, closed) == 192);
  if (segment.data() == nullptr || !power_of_two(capacity_)) {
    throw ShmRingCorrupt(
        fmt::format("shared-memory ring: a segment of {} bytes holds no ring", segment.size()));
  }
  if (role == kProducer) {
    header_->magic = kMagic;
    header_->version = kVersion;
    header_->capacity = capacity_;
    header_->head.store(0, std::memory_order_relaxed);
    header_->tail.store(0, std::memory_order_relaxed);
    header_->data_word.store(0, std::memory_order_relaxed);
    header_->space_word.store(0, std::memory_order_relaxed);
    header_->producer_sleeping.store(0, std::memory_order_relaxed);
    header_->consumer_sleeping.store(0, std::memory_order_relaxed);
    header_->closed.store(0, std::memory_order_release);
    return;
  }
  // Read once; the capacity used from now on is the mapping's.
  const uint32_t magic = header_->magic;
  const uint32_t version = header_->version;
  const uint64_t capacity = header_->capacity;
  if (magic != kMagic || version != kVersion || capacity != capacity_) {
    throw ShmRingCorrupt(fmt::format(
        "shared-memory ring: bad header (magic {:#x}, version {}, capacity {} in a "
        "mapping of {} data bytes)",
        magic, version, capacity, capacity_));
  }
  position_ = header_->tail.load(std::memory_order_acquire);
}

size_t ShmRing::write_some(const uint8_t* data, size_t size) {
  const uint64_t tail = header_->tail.load(std::memory_order_acquire);
  const uint64_t used = position_ - tail;
  if (used > capacity_) {
    throw ShmRingCorrupt(fmt::format(
        "shared-memory ring: the reader's position {} is not within {} bytes behind ours ({})",
        tail, capacity_, position_));
  }
  const size_t n = std::min<uint64_t>(size, capacity_ - used);
  // Published a chunk at a time: the reader copies one chunk out while the
  // next is copied in (on another core), so a large frame costs little
  // more than one copy's time.
  size_t done = 0;
  while (done < n) {
    const size_t at = position_ & (capacity_ - 1);
    const size_t k = std::min({n - done, kChunk, capacity_ - at});
    std::memcpy(data_ + at, data + done, k);
    done += k;
    position_ += k;
    header_->head.store(position_, std::memory_order_seq_cst);
    if (header_->consumer_sleeping.load(std::memory_order_seq_cst) != 0) {
      header_->data_word.fetch_add(1, std::memory_order_seq_cst);
      futex_wake(&header_->data_word);
    }
  }
  return n;
}

bool ShmRing::wait_space(const std::atomic<bool>& stop, std::chrono::microseconds timeout) {
  auto room = [&] {
    return position_ - header_->tail.load(std::memory_order_seq_cst) < capacity_;
  };
  auto done = [&] { return closed() || stop.load(std::memory_order_relaxed); };
  const int64_t start = now_ns();
  if (spin(start, spin_.budget_ns(), room, done)) return true;
  if (done()) return false;
  const uint32_t seen = header_->space_word.load(std::memory_order_seq_cst);
  header_->producer_sleeping.store(1, std::memory_order_seq_cst);
  if (!room() && !closed() && !stop.load(std::memory_order_seq_cst)) {
    futex_wait(&header_->space_word, seen, timeout);
  }
  header_->producer_sleeping.store(0, std::memory_order_seq_cst);
  const bool ok = room();
  if (ok) spin_.slept(now_ns() - start);
  return ok;
}

std::pair<const uint8_t*, size_t> ShmRing::readable() {
  const uint64_t head = header_->head.load(std::memory_order_acquire);
  const uint64_t available = head - position_;
  if (available > capacity_) {
    throw ShmRingCorrupt(fmt::format(
        "shared-memory ring: the writer's position {} is not within {} bytes ahead of ours ({})",
        head, capacity_, position_));
  }
  const size_t at = position_ & (capacity_ - 1);
  return {data_ + at, std::min<uint64_t>(available, capacity_ - at)};
}

void ShmRing::consume(size_t n) {
  position_ += n;
  header_->tail.store(position_, std::memory_order_seq_cst);
  if (header_->producer_sleeping.load(std::memory_order_seq_cst) != 0) {
    header_->space_word.fetch_add(1, std::memory_order_seq_cst);
    futex_wake(&header_->space_word);
  }
}

bool ShmRing::wait_data(const std::atomic<bool>& stop, std::chrono::microseconds timeout) {
  auto ready = [&] { return header_->head.load(std::memory_order_seq_cst) != position_; };
  auto done = [&] { return closed() || stop.load(std::memory_order_relaxed); };
  const int64_t start = now_ns();
  if (spin(start, spin_.budget_ns(), ready, done)) return true;
  if (done()) return false;
  const uint32_t seen = header_->data_word.load(std::memory_order_seq_cst);
  header_->consumer_sleeping.store(1, std::memory_order_seq_cst);
  if (!ready() && !closed() && !stop.load(std::memory_order_seq_cst)) {
    futex_wait(&header_->data_word, seen, timeout);
  }
  header_->consumer_sleeping.store(0, std::memory_order_seq_cst);
  const bool ok = ready();
  if (ok) spin_.slept(now_ns() - start);
  return ok;
}

void SpinBudget::slept(int64_t waited_ns) {
  // Bytes that came within twice the longest spin would have been caught
  // by a spin of twice this wait (the next gap is likely alike); later
  // ones say that spinning is wasted here: halve it.
  budget_ns_ = waited_ns <= kMaxNs ? std::clamp((budget_ns_ + 2 * waited_ns) / 2, kMinNs, kMaxNs)
                                   : std::max(kMinNs, budget_ns_ / 2);
}

void ShmRing::close() {
  header_->closed.store(1, std::memory_order_seq_cst);
  wake_all();
}

bool ShmRing::closed() const { return header_->closed.load(std::memory_order_acquire) != 0; }

void ShmRing::wake_all() {
  header_->data_word.fetch_add(1, std::memory_order_seq_cst);
  header_->space_word.fetch_add(1, std::memory_order_seq_cst);
  futex_wake(&header_->data_word);
  futex_wake(&header_->space_word);
}

}  // namespace switchboard::agents::pipe
