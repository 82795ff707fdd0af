// Internals of the NCCL backend: private to //collective:nccl (this header
// is in the target's srcs, not its hdrs). nccl_process_group.cc builds
// NcclProcessGroup on them; nothing else may include it.
//
// What is here: the NCCL names of dtypes and reductions, the translation of
// NCCL failures into switchboard errors, the communicators (Comm, one NCCL
// communicator and one non-blocking stream per local device), how an op is
// enqueued on one (enqueue, with its Slot per device and the Events that
// tell when it finished), and the state an NcclProcessGroup shares with its
// in-flight Works (GroupState, OpState, the posted sends and recvs).
//
// Ownership: GroupState is shared (shared_ptr) by the group's Impl and by
// every OpState, so a Work may outlive its group; an OpState holds its
// group, its communicator and, once issued, its Events; a posted send or
// recv (PendingP2P) holds its tensor and its OpState until it is issued.
// GroupState owns its communicators (Comm) through `main` and `cliques`.
//
// Thread safety: Comm and GroupState say which of their mutexes guards what
// (SB_GUARDED_BY; SB_REQUIRES(mu) where the caller must hold it), checked by
// the clang build (--config=tsa). Lock order: GroupState::p2p_mu before any
// Comm::mu or GroupState::mu; GroupState::mu is released before a Comm::mu
// is taken, never held with one.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "collective/process_group.h"
#include "core/tensor.h"
#include "collective/work.h"
#include "common/mutex.h"

namespace switchboard::collective::nccl_internal {

using Clock = std::chrono::steady_clock;
using Timeout = ProcessGroup::Timeout;

// `from` + `timeout`; the end of time for a timeout of 0 (no timeout).
Clock::time_point deadline_after(Timeout timeout, Clock::time_point from = Clock::now());

// Sleeps between polls: 5 us at first, doubling up to 1 ms.
class Backoff {
 public:
  void pause();

 private:
  std::chrono::microseconds delay_{5};
};

// ---------------------------------------------------------------------------
// Types, reductions and errors

struct NcclType {
  ncclDataType_t type;
  std::string_view name;
};

NcclType nccl_type(DType dtype);

struct NcclOp {
  ncclRedOp_t op;
  std::string_view name;
};

// Throws std::invalid_argument for AVG on a non-floating dtype.
NcclOp nccl_op(ReduceOp op, DType dtype);

std::string_view nccl_result_name(ncclResult_t result);

// A failed NCCL call or asynchronous error: ConnectionError when a peer or
// the network went away, Error(kInternal) otherwise.
[[noreturn]] void throw_nccl(ncclResult_t result, ncclComm_t comm, std::string_view what);

// Checks the result of a call that enqueues work (ncclInProgress is fine in
// non-blocking mode: await_ready() resolves it).
void nccl_enqueued(ncclResult_t result, ncclComm_t comm, std::string_view what);

// Rethrows the exception in flight with `prefix` in front of its message,
// keeping its type.
[[noreturn]] void rethrow_with_context(const std::string& prefix);

// Polls non-blocking communicators until none is in progress; throws the
// first asynchronous error, or TimeoutError once `deadline` passed.
void await_ready(const std::vector<ncclComm_t>& comms, Clock::time_point deadline,
                 Timeout timeout, std::string_view what);

// "[cuda:0, cuda:2]", for messages.
std::string devices_str(const std::vector<int>& devices);

// ---------------------------------------------------------------------------
// Communicators

// One communicator clique of this process: an ncclComm_t and a stream per
// local device. Thread safety: `mu` serializes every use of `comms`
// (enqueue, error query, abort, finalize); the rest is immutable once
// created.
struct Comm {
  std::string label;  // "cuda:0 (NCCL rank 1 of 2)", for messages
  std::vector<int> devices;
  std::vector<cudaStream_t> streams;

  Mutex mu;
  std::vector<ncclComm_t> comms SB_GUARDED_BY(mu);  // null once aborted or closed
  bool aborted SB_GUARDED_BY(mu) = false;
  bool closed SB_GUARDED_BY(mu) = false;  // finalized by the group's destructor

  Comm() = default;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  // Idempotent; never throws.
  void abort_locked() SB_REQUIRES(mu);

  ~Comm();
};

// Creates one communicator per device of `devices` (NCCL ranks first_rank,
// first_rank + 1, ...) in non-blocking mode and waits until they are ready.
std::shared_ptr<Comm> create_comm(std::string label, const std::vector<int>& devices,
                                  int nranks, int first_rank, const ncclUniqueId& id,
                                  Clock::time_point deadline, Timeout timeout);

// Stream-ordered device memory: cudaMallocAsync on a stream, cudaFreeAsync
// on the same stream, so the bytes live until every op queued before the
// free finished.
class StreamBuffer {
 public:
  StreamBuffer(size_t nbytes, cudaStream_t stream, int device);
  ~StreamBuffer();
  StreamBuffer(const StreamBuffer&) = delete;
  StreamBuffer& operator=(const StreamBuffer&) = delete;

  char* data() const { return static_cast<char*>(data_); }

 private:
  void* data_ = nullptr;
  cudaStream_t stream_;
};

// cudaMemcpyAsync of `nbytes` on `stream`; nothing when dst == src or
// nbytes == 0. `what` names the copy in the error.
void copy_async(void* dst, const void* src, size_t nbytes, cudaStream_t stream,
                std::string_view what);

// Makes `stream` wait for the work issued so far to the legacy default
// stream of `device` (where the copy helpers and most user kernels run).
void order_after_legacy(int device, cudaStream_t stream);

// True when list[r] starts where list[r - 1] ends (one flat buffer).
bool adjacent(const std::vector<Tensor>& list);

// ---------------------------------------------------------------------------
// Issuing ops

// What an op enqueues on one device of its communicator.
struct Slot {
  size_t index;  // position in the communicator's device list
  int device;
  ncclComm_t comm;
  cudaStream_t stream;
};
using SlotFn = std::function<void(const Slot&)>;

// The completion events of one issued op (or batch), one per device.
struct Events {
  std::vector<int> devices;
  std::vector<cudaEvent_t> events;

  Events() = default;
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
  ~Events();

  bool finished() const;
};

// Enqueues one op on `comm`: each stream first waits for its device's legacy
// default stream; `nccl` runs for every device inside one NCCL group; once
// NCCL accepted the group (non-blocking mode), `after` runs for every
// device; then a completion event is recorded per device. Locks comm.mu.
std::shared_ptr<Events> enqueue(Comm& comm, Clock::time_point deadline, Timeout timeout,
                                const SlotFn& nccl, const SlotFn& after)
    SB_EXCLUDES(comm.mu);

struct OpState;

// A send or recv posted on the main communicator, not issued yet.
struct PendingP2P {
  bool is_send;
  Tensor tensor;  // keeps the storage alive until issued
  int peer;
  std::shared_ptr<OpState> op;
};

// At most this many sends and recvs wait to be issued (NCCL takes 2048
// calls per group).
constexpr size_t kMaxPostedOps = 512;

// ---------------------------------------------------------------------------
// Group state shared with in-flight Works

struct GroupState {
  std::string name;
  int rank = 0;
  int size = 0;
  Timeout timeout{0};
  std::shared_ptr<Comm> main;  // set once by the constructor

  Mutex mu;
  std::map<std::vector<int>, std::shared_ptr<Comm>> cliques SB_GUARDED_BY(mu);
  std::string broken SB_GUARDED_BY(mu);

  Mutex p2p_mu;  // also held while a batch is being issued
  std::vector<PendingP2P> pending SB_GUARDED_BY(p2p_mu);

  std::vector<std::shared_ptr<Comm>> all_comms() SB_EXCLUDES(mu);

  std::string broken_reason() SB_EXCLUDES(mu);

  // Records why the group is unusable (the first reason wins) and aborts
  // every communicator. Call without any Comm::mu held.
  void break_group(const std::string& why) SB_EXCLUDES(mu);

  // Throws Error(kFailedPrecondition) naming `where` and the first error
  // once the group is broken.
  void require_usable(std::string_view where) SB_EXCLUDES(mu);

  // Issues every posted send and recv as one NCCL group.
  void flush_p2p() SB_EXCLUDES(p2p_mu);
};

// The message of the exception in `error`; "unknown error" for a
// non-std::exception.
std::string message_of(const std::exception_ptr& error);

// Rethrows the exception in flight with `prefix` in front of its message,
// after breaking the group with that message (peers are out of step now).
[[noreturn]] void break_and_rethrow(GroupState& state, const std::string& prefix);

// One op: what wait() needs to judge it.
struct OpState {
  std::string where;
  std::shared_ptr<GroupState> group;
  std::shared_ptr<Comm> comm;
  std::shared_ptr<Events> events;  // null until issued
  Clock::time_point deadline;      // issue time + the group's timeout

  OpState(std::string where_, std::shared_ptr<GroupState> group_,
          std::shared_ptr<Comm> comm_);

  // The Work driver: see "Work" in nccl_process_group.h.
  bool drive(Work::Timeout wait_timeout);
};

// The unique id of a lazily created communicator, as rank 0 broadcasts it
// over the main communicator, with its device count for a check.
struct IdMessage {
  ncclUniqueId id;
  int32_t local_devices;
};

}  // namespace switchboard::collective::nccl_internal
