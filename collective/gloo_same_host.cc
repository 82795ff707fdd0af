#include "collective/gloo_same_host.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <new>
#include <optional>

#include "collective/gloo_signature.h"
#include "common/error.h"
#include "common/host_key.h"
#include "common/shared_memory.h"
#include "store/store.h"

namespace switchboard::collective {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kMagic = 0x53424748;  // "SBGH"
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 512;
constexpr size_t kRecordBytes = 512;
constexpr size_t kReasonBytes = 320;
constexpr size_t kWhatBytes = 224;
// A waiter spins this long before it sleeps on the barrier's futex word:
// long enough for ranks that arrive together (the common case, after equal
// copies), short enough not to take a core from a rank still copying.
constexpr std::chrono::nanoseconds kSpin{20'000};
// A sleeping waiter wakes at least this often to look at the peers' pids,
// the watch and the deadline.
constexpr std::chrono::milliseconds kLook{20};
// Header::aborted while the rank that gave up first writes its reason.
constexpr uint32_t kClaimed = 0xffffffffu;

struct Header {
  uint32_t magic;
  uint32_t version;
  uint32_t ranks;
  uint32_t reserved;
  uint64_t slot_bytes;
  alignas(64) std::atomic<uint32_t> arrived;  // barrier arrivals of every rank, wrapping
  alignas(64) std::atomic<uint32_t> aborted;  // 0, kClaimed, or 1 + the rank that gave up
  char reason[kReasonBytes];                  // why, written before `aborted`
};
static_assert(sizeof(Header) <= kHeaderBytes);

// The op a rank is in. Two per rank, by the parity of the ops it ran here:
// a rank that finished op k here (its last barrier passed) writes op
// k + 1's while others may still read its op k's, and op k + 2's only
// after every rank arrived at op k + 1's first barrier, so done reading op
// k's.
struct OpRecord {
  uint64_t sequence;
  uint32_t tag;           // op_tag(sequence, signature)
  char what[kWhatBytes];  // its signature, described
};

struct Record {
  std::atomic<uint32_t> barriers;  // barriers this rank arrived at
  int32_t pid;
  OpRecord ops[2];
};
static_assert(sizeof(Record) <= kRecordBytes);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

size_t align_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

size_t slots_offset(int size) {
  return align_up(kHeaderBytes + kRecordBytes * static_cast<size_t>(size), 4096);
}

size_t segment_bytes(int size) {
  return slots_offset(size) +
         2 * static_cast<size_t>(size) * SameHostMemory::slot_bytes_for(size);
}

// A peer's text from the segment: within its bounds whatever it holds.
std::string bounded(const char* text, size_t capacity) {
  return std::string(text, strnlen(text, capacity));
}

void put(char* field, size_t capacity, std::string_view text) {
  const size_t n = std::min(text.size(), capacity - 1);
  std::memcpy(field, text.data(), n);
  field[n] = '\0';
}

// A process that ends while this one waits for it: a pidfd where the
// kernel has them (it stays bound to that process, whatever reuses the
// pid later), else kill(pid, 0).
class Peer {
 public:
  Peer(int rank, int pid) : rank_(rank), pid_(pid) {
    if (pid != ::getpid()) fd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  }
  ~Peer() {
    if (fd_ >= 0) ::close(fd_);
  }
  Peer(Peer&& other) noexcept
      : rank_(other.rank_), pid_(other.pid_), fd_(std::exchange(other.fd_, -1)) {}
  Peer(const Peer&) = delete;

  int rank() const { return rank_; }
  int pid() const { return pid_; }
  bool exited() const {
    if (pid_ == ::getpid()) return false;  // ranks as threads of one process
    if (fd_ >= 0) {
      pollfd p{fd_, POLLIN, 0};
      return ::poll(&p, 1, 0) == 1;
    }
    return ::kill(pid_, 0) != 0 && errno == ESRCH;
  }

 private:
  int rank_;
  int pid_;
  int fd_ = -1;
};

std::vector<std::string> keys_of(const std::string& base, int size) {
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(base + std::to_string(r));
  return keys;
}

}  // namespace

struct SameHostMemory::Impl {
  int rank = 0;
  int size = 0;
  size_t slot = 0;  // bytes per rank per set
  SharedMemory memory;
  Header* header = nullptr;
  uint8_t* slots = nullptr;
  std::vector<Peer> peers;
  std::function<std::string(std::string_view)> where;
  uint32_t barriers = 0;  // this rank's, as in its record
  uint64_t chunks = 0;    // chunks moved: picks the set
  uint64_t ops = 0;       // ops begun here: picks the OpRecord
  // The first failure, which every later op names.
  std::optional<std::string> failed;

  Record* record(int r) const {
    return reinterpret_cast<Record*>(reinterpret_cast<uint8_t*>(header) + kHeaderBytes +
                                     kRecordBytes * static_cast<size_t>(r));
  }
  uint8_t* next_set() {
    return slots + (chunks++ % 2) * slot * static_cast<size_t>(size);
  }
  uint8_t* slot_of(uint8_t* set, int r) const {
    return set + slot * static_cast<size_t>(r);
  }

  void begin(const SameHostOp& run) {
    if (failed) {
      throw ConnectionError(fmt::format(
          "{}: the group failed earlier and is unusable: destroy it and make a new one "
          "(first failure: {})",
          where(run.op), *failed));
    }
    check_aborted(run);
    OpRecord& mine = record(rank)->ops[++ops % 2];
    mine.tag = run.tag;
    mine.sequence = run.sequence;
    put(mine.what, kWhatBytes, run.signature->describe());
  }

  // Fails the op: records why for later ops, tells the peers (unless it was
  // one of them that gave up) and throws. The first rank to give up claims
  // the header's `aborted` (kClaimed), writes its reason, then names itself.
  template <typename E>
  [[noreturn]] void give_up(E error, bool tell_peers = true) {
    failed = error.what();
    uint32_t none = 0;
    if (tell_peers && header->aborted.compare_exchange_strong(
                          none, kClaimed, std::memory_order_acq_rel)) {
      put(header->reason, kReasonBytes, fmt::format("rank {}: {}", rank, error.what()));
      header->aborted.store(static_cast<uint32_t>(rank) + 1, std::memory_order_release);
      futex_wake(&header->arrived);
    }
    throw error;
  }

  void check_aborted(const SameHostOp& run) {
    const uint32_t who = header->aborted.load(std::memory_order_acquire);
    if (who == 0 || who == kClaimed) return;  // a claim is named within a moment
    give_up(
        ConnectionError(fmt::format(
            "{}: rank {} gave up on the op, so it cannot finish (the group is unusable "
            "now: destroy it and make a new one): {}",
            where(run.op), who - 1, bounded(header->reason, kReasonBytes))),
        /*tell_peers=*/false);
  }

  // Whether rank r arrived at this rank's latest barrier.
  bool arrived(int r) const {
    return static_cast<int32_t>(record(r)->barriers.load(std::memory_order_acquire) -
                                barriers) >= 0;
  }

  bool reached(uint32_t target) const {
    return static_cast<int32_t>(header->arrived.load(std::memory_order_acquire) -
                                target) >= 0;
  }

  // Arrives at the next barrier and waits for every rank to arrive there.
  void arrive_and_wait(const SameHostOp& run, Clock::time_point deadline) {
    ++barriers;
    record(rank)->barriers.store(barriers, std::memory_order_release);
    const uint32_t target = barriers * static_cast<uint32_t>(size);
    if (header->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == target) {
      futex_wake(&header->arrived);
      return;
    }
    const auto spin_end = Clock::now() + kSpin;
    while (Clock::now() < spin_end) {
      for (int i = 0; i < 16; ++i) {
        if (reached(target)) return;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      }
    }
    for (;;) {
      const uint32_t seen = header->arrived.load(std::memory_order_acquire);
      if (static_cast<int32_t>(seen - target) >= 0) return;
      check_aborted(run);
      // A dead peer first: the watch may have found its connection closed
      // too, but the pid says more (and gloo_process_group.cc prefers it).
      for (const Peer& peer : peers) {
        if (arrived(peer.rank()) || !peer.exited()) continue;
        give_up(PeerExited(fmt::format(
            "{}: rank {} (pid {}) exited while this rank waited for it; the group is "
            "unusable now: destroy it and make a new one",
            where(run.op), peer.rank(), peer.pid())));
      }
      if (run.stop != nullptr && (*run.stop)()) {
        give_up(Error(
            ErrorCode::kCancelled,
            fmt::format("{}: stopped by the group's signature watch", where(run.op))));
      }
      const auto now = Clock::now();
      if (now >= deadline) {
        std::vector<int> missing;
        for (int r = 0; r < size; ++r) {
          if (!arrived(r)) missing.push_back(r);
        }
        give_up(TimeoutError(
            fmt::format("{}: timed out after {} ms waiting for ranks [{}] (same-host "
                        "shared memory); the group is unusable now: destroy it and make "
                        "a new one",
                        where(run.op), run.timeout.count(), fmt::join(missing, ", "))));
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::microseconds>(deadline - now);
      futex_wait(&header->arrived, seen,
                 std::min<std::chrono::microseconds>(left + std::chrono::microseconds(1),
                                                     kLook));
    }
  }

  // The op's first barrier: then every rank's record names its op, and
  // ranks whose ops disagree all fail here.
  void first_barrier(const SameHostOp& run, Clock::time_point deadline) {
    arrive_and_wait(run, deadline);
    const size_t parity = ops % 2;
    const OpRecord& mine = record(rank)->ops[parity];
    std::vector<std::string> differ;
    for (int r = 0; r < size; ++r) {
      const OpRecord& theirs = record(r)->ops[parity];
      if (r == rank || (theirs.tag == mine.tag && theirs.sequence == mine.sequence))
        continue;
      std::string what = bounded(theirs.what, kWhatBytes);
      if (what == mine.what) {
        what +=
            fmt::format(" (its op {}, this rank's {})", theirs.sequence, run.sequence);
      }
      differ.push_back(fmt::format("rank {}: {}", r, what));
    }
    if (differ.empty()) return;
    failed = fmt::format("the ranks disagreed on {}", where(run.op));
    throw Error(
        ErrorCode::kFailedPrecondition,
        fmt::format("{}: the ranks disagree on the op, so it did not run (the group "
                    "is unusable now: destroy it and make a new one): rank {}: {}; {}",
                    where(run.op), rank, bounded(mine.what, kWhatBytes),
                    fmt::join(differ, "; ")));
  }

  // The chunk's barrier: its op's first (which checks the records) or not.
  void meet(const SameHostOp& run, Clock::time_point deadline, bool first) {
    if (first) {
      first_barrier(run, deadline);
    } else {
      arrive_and_wait(run, deadline);
    }
  }

  // Allreduce (root -1) or reduce to `root`: each rank copies its chunk
  // into its slot; barrier; each reduces its share of the chunk into slot 0;
  // barrier; each rank that wants the result copies it out.
  void reduce(Tensor& tensor, ReduceOp op, int root, const SameHostOp& run) {
    begin(run);
    const auto deadline = deadline_of(run);
    const size_t element = tensor.element_size();
    const DType dtype = tensor.dtype();
    auto* data = static_cast<uint8_t*>(tensor.data());
    const size_t n = static_cast<size_t>(size);
    for_chunks(
        tensor.nbytes(), slot, element, [&](size_t offset, size_t length, bool first) {
          uint8_t* set = next_set();
          if (length > 0) std::memcpy(slot_of(set, rank), data + offset, length);
          meet(run, deadline, first);
          // This rank's share of the chunk, in whole cache lines where it can.
          const size_t elements = length / element;
          const size_t line = std::max<size_t>(1, 64 / element);
          const size_t share = align_up((elements + n - 1) / n, line);
          const size_t begin = std::min(elements, share * static_cast<size_t>(rank));
          const size_t end = std::min(elements, begin + share);
          if (end > begin) {
            uint8_t* out = set + begin * element;  // slot 0 holds the result
            for (int r = 1; r < size; ++r) {
              reduce_elements(op, dtype, out, out, slot_of(set, r) + begin * element,
                              end - begin);
            }
          }
          arrive_and_wait(run, deadline);
          if (length > 0 && (root < 0 || root == rank))
            std::memcpy(data + offset, set, length);
        });
  }

  Clock::time_point deadline_of(const SameHostOp& run) const {
    return run.timeout.count() == 0 ? Clock::time_point::max()
                                    : Clock::now() + run.timeout;
  }

  // Chunks of at most `max_chunk` bytes (whole elements of `element`
  // bytes) of `total` bytes: body(offset, length, first) for each, at
  // least once (an empty op still meets the others at its first barrier).
  template <typename Body>
  void for_chunks(size_t total, size_t max_chunk, size_t element, Body body) {
    const size_t chunk = max_chunk / element * element;
    size_t offset = 0;
    bool first = true;
    do {
      const size_t length = std::min(chunk, total - offset);
      body(offset, length, first);
      offset += length;
      first = false;
    } while (offset < total);
  }
};

size_t SameHostMemory::slot_bytes_for(int size) {
  constexpr size_t kSet = size_t{8} << 20;
  const size_t per_rank = kSet / static_cast<size_t>(std::max(size, 1));
  return std::clamp<size_t>(per_rank / 4096 * 4096, size_t{256} << 10, size_t{4} << 20);
}

SameHostMemory::SameHostMemory(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SameHostMemory::~SameHostMemory() = default;

std::unique_ptr<SameHostMemory> SameHostMemory::connect(
    Store& store, const std::string& prefix, int rank, int size, bool wanted,
    std::chrono::milliseconds timeout,
    std::function<std::string(std::string_view)> where) {
  const std::string at = where("rendezvous");
  const std::string base = prefix + "same_host/";
  if (size > kMaxRanks) {
    spdlog::debug("{}: Gloo over TCP only: {} ranks share no memory (at most {})", at,
                  size, kMaxRanks);
    return nullptr;  // every rank decides alike, without the store
  }
  // 1. Which host (and namespaces) each rank runs in, and its pid.
  const std::string mine = wanted ? host_key() : std::string("off");
  store.set(base + "host/" + std::to_string(rank),
            to_bytes(fmt::format("{}\n{}", ::getpid(), mine)));
  const auto host_keys = keys_of(base + "host/", size);
  store.wait(host_keys, timeout);
  std::vector<int> pids(static_cast<size_t>(size), 0);
  for (int r = 0; r < size; ++r) {
    const std::string value = to_string(store.get(host_keys[r]));
    const size_t cut = value.find('\n');
    const std::string key =
        cut == std::string::npos ? std::string() : value.substr(cut + 1);
    if (key != mine || key == "off") {
      spdlog::debug("{}: Gloo over TCP only: {}", at,
                    mine == "off"  ? std::string("this rank turned shared memory off")
                    : key == "off" ? fmt::format("rank {} turned shared memory off", r)
                                   : fmt::format("rank {} runs on another host or in "
                                                 "other namespaces",
                                                 r));
      return nullptr;
    }
    try {
      pids[r] = std::stoi(value.substr(0, cut));
    } catch (const std::exception&) {
      spdlog::warn("{}: Gloo over TCP only: rank {} sent no pid (\"{}\")", at, r,
                   value.substr(0, 32));
      return nullptr;
    }
  }
  // 2. Rank 0 makes the segment; every rank maps it.
  auto impl = std::make_unique<Impl>();
  impl->rank = rank;
  impl->size = size;
  impl->slot = slot_bytes_for(size);
  impl->where = std::move(where);
  const size_t bytes = segment_bytes(size);
  std::string problem;
  if (rank == 0) {
    try {
      impl->memory = SharedMemory::create(bytes, "switchboard-gloo");
      auto* header = new (impl->memory.data()) Header{};
      impl->header = header;
      header->magic = kMagic;
      header->version = kVersion;
      header->ranks = static_cast<uint32_t>(size);
      header->slot_bytes = impl->slot;
      for (int r = 0; r < size; ++r) new (impl->record(r)) Record{};
      store.set(base + "name", to_bytes(impl->memory.name()));
    } catch (const std::exception& e) {
      store.set(base + "name", to_bytes(std::string("!") + e.what()));
      spdlog::warn("{}: Gloo over TCP only: no shared memory of {} bytes: {}", at, bytes,
                   e.what());
      return nullptr;
    }
  } else {
    store.wait({base + "name"}, timeout);
    const std::string name = to_string(store.get(base + "name"));
    if (!name.empty() && name[0] == '!') {
      spdlog::warn("{}: Gloo over TCP only: rank 0 made no shared memory: {}", at,
                   name.substr(1));
      return nullptr;
    }
    try {
      impl->memory = SharedMemory::open(name);
      const auto* header = static_cast<const Header*>(impl->memory.data());
      if (impl->memory.size() != bytes || header->magic != kMagic ||
          header->version != kVersion || header->ranks != static_cast<uint32_t>(size) ||
          header->slot_bytes != impl->slot) {
        problem = fmt::format(
            "the segment {} of {} bytes is not a group of {}'s ({} bytes, slots of {})",
            name, impl->memory.size(), size, bytes, impl->slot);
      }
    } catch (const std::exception& e) {
      problem = fmt::format("cannot map rank 0's segment {}: {}", name, e.what());
    }
  }
  store.set(base + "mapped/" + std::to_string(rank), to_bytes(problem));
  // 3. Shared memory only when every rank mapped it.
  const auto mapped_keys = keys_of(base + "mapped/", size);
  store.wait(mapped_keys, timeout);
  for (int r = 0; r < size; ++r) {
    const std::string theirs = to_string(store.get(mapped_keys[r]));
    if (!theirs.empty()) {
      spdlog::warn("{}: Gloo over TCP only: rank {}: {}", at, r, theirs);
      return nullptr;
    }
  }
  impl->header =
      static_cast<Header*>(impl->memory.data());  // rank 0's, or a peer's mapping
  impl->slots = static_cast<uint8_t*>(impl->memory.data()) + slots_offset(size);
  impl->record(rank)->pid = ::getpid();
  for (int r = 0; r < size; ++r) {
    if (r != rank) impl->peers.emplace_back(r, pids[r]);
  }
  return std::unique_ptr<SameHostMemory>(new SameHostMemory(std::move(impl)));
}

void SameHostMemory::allreduce(Tensor& tensor, ReduceOp op, const SameHostOp& run) {
  impl_->reduce(tensor, op, /*root=*/-1, run);
}

void SameHostMemory::reduce(Tensor& tensor, ReduceOp op, int root,
                            const SameHostOp& run) {
  impl_->reduce(tensor, op, root, run);
}

void SameHostMemory::reduce_scatter(Tensor& output, const std::vector<Tensor>& inputs,
                                    ReduceOp op, const SameHostOp& run) {
  Impl& s = *impl_;
  s.begin(run);
  const auto deadline = s.deadline_of(run);
  const size_t element = output.element_size();
  const DType dtype = output.dtype();
  auto* out = static_cast<uint8_t*>(output.data());
  const size_t n = static_cast<size_t>(s.size);
  // Each rank's slot holds one piece for every rank: piece q of rank r's
  // slot is r's input for q over this chunk of the output.
  s.for_chunks(output.nbytes(), s.slot / n, element,
               [&](size_t offset, size_t length, bool first) {
                 uint8_t* set = s.next_set();
                 uint8_t* mine = s.slot_of(set, s.rank);
                 for (size_t q = 0; q < n && length > 0; ++q) {
                   std::memcpy(mine + q * length,
                               static_cast<const uint8_t*>(inputs[q].data()) + offset,
                               length);
                 }
                 s.meet(run, deadline, first);
                 if (length == 0) return;
                 const size_t piece = static_cast<size_t>(s.rank) * length;
                 reduce_elements(op, dtype, out + offset, s.slot_of(set, 0) + piece,
                                 s.slot_of(set, 1) + piece, length / element);
                 for (int r = 2; r < s.size; ++r) {
                   reduce_elements(op, dtype, out + offset, out + offset,
                                   s.slot_of(set, r) + piece, length / element);
                 }
               });
}

void SameHostMemory::broadcast(Tensor& tensor, int root, const SameHostOp& run) {
  Impl& s = *impl_;
  s.begin(run);
  const auto deadline = s.deadline_of(run);
  auto* data = static_cast<uint8_t*>(tensor.data());
  const size_t set_bytes = s.slot * static_cast<size_t>(s.size);
  s.for_chunks(tensor.nbytes(), set_bytes, 1,
               [&](size_t offset, size_t length, bool first) {
                 uint8_t* set = s.next_set();
                 if (s.rank == root && length > 0)
                   std::memcpy(set, data + offset, length);
                 s.meet(run, deadline, first);
                 if (s.rank != root && length > 0)
                   std::memcpy(data + offset, set, length);
               });
}

void SameHostMemory::allgather(const std::vector<Tensor>& outputs, const Tensor& input,
                               const SameHostOp& run) {
  Impl& s = *impl_;
  s.begin(run);
  const auto deadline = s.deadline_of(run);
  const auto* data = static_cast<const uint8_t*>(input.data());
  s.for_chunks(input.nbytes(), s.slot, 1, [&](size_t offset, size_t length, bool first) {
    uint8_t* set = s.next_set();
    if (length > 0) std::memcpy(s.slot_of(set, s.rank), data + offset, length);
    s.meet(run, deadline, first);
    if (length == 0) return;
    for (int r = 0; r < s.size; ++r) {
      std::memcpy(static_cast<uint8_t*>(outputs[r].data()) + offset, s.slot_of(set, r),
                  length);
    }
  });
}

void SameHostMemory::barrier(const SameHostOp& run) {
  Impl& s = *impl_;
  s.begin(run);
  s.first_barrier(run, s.deadline_of(run));
}

std::string SameHostMemory::describe() const {
  return fmt::format("shared memory of {} MiB ({} KiB per rank per chunk)",
                     impl_->memory.size() >> 20, impl_->slot >> 10);
}

}  // namespace switchboard::collective
