#include "collective/nccl_process_group.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "collective/cuda_allocator.h"
#include "common/check.h"
#include "common/error.h"
#include "store/store.h"

namespace switchboard::collective {
namespace {

using Clock = std::chrono::steady_clock;
using Timeout = ProcessGroup::Timeout;

Clock::time_point deadline_after(Timeout timeout, Clock::time_point from = Clock::now()) {
  return timeout.count() == 0 ? Clock::time_point::max() : from + timeout;
}

// Sleeps between polls: 5 us at first, doubling up to 1 ms.
class Backoff {
 public:
  void pause() {
    std::this_thread::sleep_for(delay_);
    delay_ = std::min(delay_ * 2, std::chrono::microseconds(1000));
  }

 private:
  std::chrono::microseconds delay_{5};
};

// ---------------------------------------------------------------------------
// Types, reductions and errors

struct NcclType {
  ncclDataType_t type;
  std::string_view name;
};

NcclType nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return {ncclFloat16, "ncclFloat16"};
    case DType::kBFloat16:
      return {ncclBfloat16, "ncclBfloat16"};
    case DType::kFloat32:
      return {ncclFloat32, "ncclFloat32"};
    case DType::kFloat64:
      return {ncclFloat64, "ncclFloat64"};
    case DType::kInt8:
      return {ncclInt8, "ncclInt8"};
    case DType::kUInt8:
      return {ncclUint8, "ncclUint8"};
    case DType::kInt32:
      return {ncclInt32, "ncclInt32"};
    case DType::kInt64:
      return {ncclInt64, "ncclInt64"};
    case DType::kBool:
      return {ncclUint8, "ncclUint8"};
  }
  throw Error(ErrorCode::kInternal,
              fmt::format("unknown dtype {}", static_cast<int>(dtype)));
}

struct NcclOp {
  ncclRedOp_t op;
  std::string_view name;
};

NcclOp nccl_op(ReduceOp op, DType dtype) {
  SB_REQUIRE(op != ReduceOp::kAvg || is_floating(dtype),
             "NCCL: AVG needs a floating dtype, got {}", dtype_name(dtype));
  if (dtype == DType::kBool) {  // 0/1 bytes: OR is max, AND is min
    const bool any = op == ReduceOp::kSum || op == ReduceOp::kMax;
    return any ? NcclOp{ncclMax, "ncclMax"} : NcclOp{ncclMin, "ncclMin"};
  }
  switch (op) {
    case ReduceOp::kSum:
      return {ncclSum, "ncclSum"};
    case ReduceOp::kProduct:
      return {ncclProd, "ncclProd"};
    case ReduceOp::kMin:
      return {ncclMin, "ncclMin"};
    case ReduceOp::kMax:
      return {ncclMax, "ncclMax"};
    case ReduceOp::kAvg:
      return {ncclAvg, "ncclAvg"};
  }
  throw Error(ErrorCode::kInternal,
              fmt::format("unknown reduce op {}", static_cast<int>(op)));
}

std::string_view nccl_result_name(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "ncclSuccess";
    case ncclUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case ncclSystemError:
      return "ncclSystemError";
    case ncclInternalError:
      return "ncclInternalError";
    case ncclInvalidArgument:
      return "ncclInvalidArgument";
    case ncclInvalidUsage:
      return "ncclInvalidUsage";
    case ncclRemoteError:
      return "ncclRemoteError";
    case ncclInProgress:
      return "ncclInProgress";
    default:
      return "ncclResult(unknown)";
  }
}

// A failed NCCL call or asynchronous error: ConnectionError when a peer or
// the network went away, Error(kInternal) otherwise.
[[noreturn]] void throw_nccl(ncclResult_t result, ncclComm_t comm,
                             std::string_view what) {
  const char* last = ncclGetLastError(comm);
  std::string message = fmt::format("{}: {} ({})", what, nccl_result_name(result),
                                    ncclGetErrorString(result));
  if (last != nullptr && *last != '\0') message += fmt::format(": {}", last);
  if (result == ncclRemoteError || result == ncclSystemError)
    throw ConnectionError(message);
  throw Error(ErrorCode::kInternal, message);
}

// Checks the result of a call that enqueues work (ncclInProgress is fine in
// non-blocking mode: await_ready() resolves it).
void nccl_enqueued(ncclResult_t result, ncclComm_t comm, std::string_view what) {
  if (result != ncclSuccess && result != ncclInProgress) throw_nccl(result, comm, what);
}

// Rethrows the exception in flight with `prefix` in front of its message,
// keeping its type.
[[noreturn]] void rethrow_with_context(const std::string& prefix) {
  try {
    throw;
  } catch (const TimeoutError& e) {
    throw TimeoutError(fmt::format("{}: {}", prefix, e.what()));
  } catch (const ConnectionError& e) {
    throw ConnectionError(fmt::format("{}: {}", prefix, e.what()));
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{}: {}", prefix, e.what()));
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("{}: {}", prefix, e.what()));
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kInternal, fmt::format("{}: {}", prefix, e.what()));
  }
}

// Polls non-blocking communicators until none is in progress; throws the
// first asynchronous error, or TimeoutError once `deadline` passed.
void await_ready(const std::vector<ncclComm_t>& comms, Clock::time_point deadline,
                 Timeout timeout, std::string_view what) {
  Backoff backoff;
  for (;;) {
    bool pending = false;
    for (ncclComm_t comm : comms) {
      if (comm == nullptr) continue;
      ncclResult_t state = ncclSuccess;
      const ncclResult_t result = ncclCommGetAsyncError(comm, &state);
      if (result != ncclSuccess) throw_nccl(result, comm, what);
      if (state == ncclInProgress) {
        pending = true;
      } else if (state != ncclSuccess) {
        throw_nccl(state, comm, what);
      }
    }
    if (!pending) return;
    if (Clock::now() >= deadline) {
      throw TimeoutError(fmt::format("{}: timed out after {} ms", what, timeout.count()));
    }
    backoff.pause();
  }
}

std::string devices_str(const std::vector<int>& devices) {
  std::string out = "[";
  for (size_t i = 0; i < devices.size(); ++i) {
    out += fmt::format("{}cuda:{}", i == 0 ? "" : ", ", devices[i]);
  }
  return out + "]";
}

// ---------------------------------------------------------------------------
// Communicators

// One communicator clique of this process: an ncclComm_t and a stream per
// local device. Thread safety: `mu` serializes every use of `comms`
// (enqueue, error query, abort, finalize); the rest is immutable once
// created.
struct Comm {
  std::string label;  // "cuda:0 (NCCL rank 1 of 2)", for messages
  std::vector<int> devices;
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;

  std::mutex mu;
  bool aborted = false;  // GUARDED_BY(mu)
  bool closed = false;   // GUARDED_BY(mu): finalized by the group's destructor

  Comm() = default;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  // REQUIRES(mu). Idempotent; never throws.
  void abort_locked() {
    if (aborted || closed) return;
    aborted = true;
    for (ncclComm_t& comm : comms) {
      if (comm != nullptr) ncclCommAbort(comm);
      comm = nullptr;
    }
  }

  ~Comm() {
    {
      std::lock_guard<std::mutex> lock(mu);
      abort_locked();  // only reached with live handles if never closed
    }
    for (cudaStream_t stream : streams) cudaStreamDestroy(stream);
    if (!streams.empty()) cudaGetLastError();
  }
};

// Creates one communicator per device of `devices` (NCCL ranks first_rank,
// first_rank + 1, ...) in non-blocking mode and waits until they are ready.
std::shared_ptr<Comm> create_comm(std::string label, const std::vector<int>& devices,
                                  int nranks, int first_rank, const ncclUniqueId& id,
                                  Clock::time_point deadline, Timeout timeout) {
  auto comm = std::make_shared<Comm>();
  comm->label = std::move(label);
  comm->devices = devices;
  comm->comms.assign(devices.size(), nullptr);
  for (int device : devices) {
    CudaDeviceGuard guard(device);
    cudaStream_t stream = nullptr;
    cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
               fmt::format("cudaStreamCreateWithFlags on cuda:{}", device));
    comm->streams.push_back(stream);
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = comm->label.c_str();
  ncclResult_t first_error = ncclSuccess;
  ncclGroupStart();
  for (size_t i = 0; i < devices.size(); ++i) {
    CudaDeviceGuard guard(devices[i]);  // NCCL binds the current device
    const ncclResult_t result = ncclCommInitRankConfig(
        &comm->comms[i], nranks, id, first_rank + static_cast<int>(i), &config);
    if (result != ncclSuccess && result != ncclInProgress && first_error == ncclSuccess) {
      first_error = result;
    }
  }
  const ncclResult_t ended = ncclGroupEnd();
  if (first_error == ncclSuccess && ended != ncclInProgress) first_error = ended;
  try {
    if (first_error != ncclSuccess) {
      throw_nccl(first_error, comm->comms[0], "ncclCommInitRankConfig");
    }
    await_ready(comm->comms, deadline, timeout, "ncclCommInitRankConfig");
  } catch (...) {
    std::lock_guard<std::mutex> lock(comm->mu);
    comm->abort_locked();
    throw;
  }
  return comm;
}

// Stream-ordered device memory: cudaMallocAsync on a stream, cudaFreeAsync
// on the same stream, so the bytes live until every op queued before the
// free finished.
class StreamBuffer {
 public:
  StreamBuffer(size_t nbytes, cudaStream_t stream, int device) : stream_(stream) {
    cuda_check(cudaMallocAsync(&data_, std::max<size_t>(nbytes, 1), stream),
               fmt::format("cudaMallocAsync of {} bytes on cuda:{}", nbytes, device));
  }
  ~StreamBuffer() {
    if (data_ != nullptr) cudaFreeAsync(data_, stream_);
  }
  StreamBuffer(const StreamBuffer&) = delete;
  StreamBuffer& operator=(const StreamBuffer&) = delete;

  char* data() const { return static_cast<char*>(data_); }

 private:
  void* data_ = nullptr;
  cudaStream_t stream_;
};

void copy_async(void* dst, const void* src, size_t nbytes, cudaStream_t stream,
                std::string_view what) {
  if (dst == src || nbytes == 0) return;
  cuda_check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream), what);
}

// Makes `stream` wait for the work issued so far to the legacy default
// stream of `device` (where the copy helpers and most user kernels run).
void order_after_legacy(int device, cudaStream_t stream) {
  CudaDeviceGuard guard(device);
  cudaEvent_t event = nullptr;
  cuda_check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
  cudaError_t status = cudaEventRecord(event, cudaStreamLegacy);
  if (status == cudaSuccess) status = cudaStreamWaitEvent(stream, event, 0);
  cudaEventDestroy(event);  // released once the wait no longer needs it
  cuda_check(status, fmt::format("ordering after cuda:{}'s default stream", device));
}

// True when list[r] starts where list[r - 1] ends (one flat buffer).
bool adjacent(const std::vector<Tensor>& list) {
  for (size_t r = 1; r < list.size(); ++r) {
    const char* expected =
        static_cast<const char*>(list[r - 1].data()) + list[r - 1].nbytes();
    if (list[r].data() != expected) return false;
  }
  return true;
}

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
  ~Events() {
    for (cudaEvent_t event : events) cudaEventDestroy(event);
  }

  bool finished() const {
    for (size_t i = 0; i < events.size(); ++i) {
      const cudaError_t status = cudaEventQuery(events[i]);
      if (status == cudaErrorNotReady) return false;
      cuda_check(status, fmt::format("cudaEventQuery on cuda:{}", devices[i]));
    }
    return true;
  }
};

// Enqueues one op on `comm`: each stream first waits for its device's legacy
// default stream; `nccl` runs for every device inside one NCCL group; once
// NCCL accepted the group (non-blocking mode), `after` runs for every
// device; then a completion event is recorded per device.
std::shared_ptr<Events> enqueue(Comm& comm, Clock::time_point deadline, Timeout timeout,
                                const SlotFn& nccl, const SlotFn& after) {
  std::lock_guard<std::mutex> lock(comm.mu);
  if (comm.aborted || comm.closed) {
    throw Error(ErrorCode::kFailedPrecondition, "the communicator was aborted or closed");
  }
  const size_t k = comm.devices.size();
  const auto slot = [&](size_t i) {
    return Slot{i, comm.devices[i], comm.comms[i], comm.streams[i]};
  };
  for (size_t i = 0; i < k; ++i) order_after_legacy(comm.devices[i], comm.streams[i]);
  ncclGroupStart();
  try {
    for (size_t i = 0; i < k; ++i) {
      CudaDeviceGuard guard(comm.devices[i]);
      nccl(slot(i));
    }
  } catch (...) {
    ncclGroupEnd();
    throw;
  }
  nccl_enqueued(ncclGroupEnd(), comm.comms[0], "ncclGroupEnd");
  await_ready(comm.comms, deadline, timeout, "waiting for NCCL to accept the op");
  auto events = std::make_shared<Events>();
  for (size_t i = 0; i < k; ++i) {
    CudaDeviceGuard guard(comm.devices[i]);
    if (after) after(slot(i));
    cudaEvent_t event = nullptr;
    cuda_check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
               "cudaEventCreateWithFlags");
    events->devices.push_back(comm.devices[i]);
    events->events.push_back(event);
    cuda_check(cudaEventRecord(event, comm.streams[i]), "cudaEventRecord");
  }
  return events;
}

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

  std::mutex mu;
  std::map<std::vector<int>, std::shared_ptr<Comm>> cliques;  // GUARDED_BY(mu)
  std::string broken;                                         // GUARDED_BY(mu)

  std::mutex p2p_mu;                // also held while a batch is being issued
  std::vector<PendingP2P> pending;  // GUARDED_BY(p2p_mu)

  std::vector<std::shared_ptr<Comm>> all_comms() {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<std::shared_ptr<Comm>> out;
    if (main) out.push_back(main);
    for (const auto& [key, comm] : cliques) out.push_back(comm);
    return out;
  }

  std::string broken_reason() {
    std::lock_guard<std::mutex> lock(mu);
    return broken;
  }

  // Records why the group is unusable (the first reason wins) and aborts
  // every communicator. Call without any Comm::mu held.
  void break_group(const std::string& why) {
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      first = broken.empty();
      if (first) broken = why;
    }
    if (first) {
      spdlog::warn("NCCL group \"{}\" rank {}: aborting its communicators: {}", name,
                   rank, why);
    }
    for (const auto& comm : all_comms()) {
      std::lock_guard<std::mutex> lock(comm->mu);
      comm->abort_locked();
    }
  }

  void require_usable(std::string_view where) {
    const std::string why = broken_reason();
    if (!why.empty()) {
      throw Error(
          ErrorCode::kFailedPrecondition,
          fmt::format("{}: the group is broken by an earlier error; destroy it and "
                      "create a new one (first error: {})",
                      where, why));
    }
  }

  // Issues every posted send and recv as one NCCL group (defined below).
  void flush_p2p();
};

std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

// Rethrows the exception in flight with `prefix` in front of its message,
// after breaking the group with that message (peers are out of step now).
[[noreturn]] void break_and_rethrow(GroupState& state, const std::string& prefix) {
  std::exception_ptr wrapped;
  try {
    rethrow_with_context(prefix);
  } catch (...) {
    wrapped = std::current_exception();
  }
  state.break_group(message_of(wrapped));
  std::rethrow_exception(wrapped);
}

// One op: what wait() needs to judge it.
struct OpState {
  std::string where;
  std::shared_ptr<GroupState> group;
  std::shared_ptr<Comm> comm;
  std::shared_ptr<Events> events;  // null until issued
  Clock::time_point deadline;      // issue time + the group's timeout

  OpState(std::string where_, std::shared_ptr<GroupState> group_,
          std::shared_ptr<Comm> comm_)
      : where(std::move(where_)),
        group(std::move(group_)),
        comm(std::move(comm_)),
        deadline(deadline_after(group->timeout)) {}

  // The Work driver: see "Work" in the header.
  bool drive(Work::Timeout wait_timeout) {
    const Clock::time_point wait_deadline = deadline_after(wait_timeout);
    Backoff backoff;
    for (;;) {
      bool aborted = false;
      bool closed = false;
      ncclResult_t async = ncclSuccess;
      ncclComm_t failed = nullptr;
      {
        std::lock_guard<std::mutex> lock(comm->mu);
        aborted = comm->aborted;
        closed = comm->closed;
        for (ncclComm_t c : comm->comms) {
          if (aborted || closed || c == nullptr) break;
          ncclResult_t state = ncclSuccess;
          if (ncclCommGetAsyncError(c, &state) == ncclSuccess && state != ncclSuccess &&
              state != ncclInProgress) {
            async = state;
            failed = c;
            break;
          }
        }
      }
      if (aborted) {
        throw Error(
            ErrorCode::kCancelled,
            fmt::format("{}: cancelled: the group's communicators were aborted ({})",
                        where, group->broken_reason()));
      }
      try {
        if (events && events->finished()) return true;
        if (async != ncclSuccess)
          throw_nccl(async, failed, "NCCL reported an asynchronous error");
      } catch (...) {
        break_and_rethrow(*group, fmt::format("{} on {}", where, comm->label));
      }
      if (closed) {
        throw Error(
            ErrorCode::kCancelled,
            fmt::format("{}: the group was destroyed before the op finished", where));
      }
      const Clock::time_point now = Clock::now();
      if (now >= deadline) {
        const std::string message = fmt::format(
            "{}: timed out after {} ms waiting for NCCL on {}; the group's communicators "
            "were aborted",
            where, group->timeout.count(), comm->label);
        group->break_group(message);
        throw TimeoutError(message);
      }
      if (now >= wait_deadline) {
        group->break_group(
            fmt::format("{}: wait() timed out after {} ms", where, wait_timeout.count()));
        return false;
      }
      backoff.pause();
    }
  }
};

void GroupState::flush_p2p() {
  std::lock_guard<std::mutex> lock(p2p_mu);
  if (pending.empty()) return;
  std::vector<PendingP2P> batch;
  batch.swap(pending);
  const std::string where =
      fmt::format("{} posted sends/recvs in group \"{}\" (rank {} of {})", batch.size(),
                  name, rank, size);
  require_usable(where);
  std::vector<std::unique_ptr<StreamBuffer>> staging(batch.size());
  const Clock::time_point deadline = deadline_after(timeout);
  std::shared_ptr<Events> events;
  try {
    events = enqueue(
        *main, deadline, timeout,
        [&](const Slot& s) {
          for (size_t j = 0; j < batch.size(); ++j) {
            const PendingP2P& p = batch[j];
            const NcclType type = nccl_type(p.tensor.dtype());
            void* data = p.tensor.data();
            const int device = p.tensor.device().index;
            if (device != s.device) {  // a *_multigpu op: stage on this rank's device
              staging[j] =
                  std::make_unique<StreamBuffer>(p.tensor.nbytes(), s.stream, s.device);
              order_after_legacy(device, s.stream);
              if (p.is_send) {
                copy_async(staging[j]->data(), data, p.tensor.nbytes(), s.stream,
                           "cudaMemcpyAsync into the staging buffer");
              }
              data = staging[j]->data();
            }
            if (p.is_send) {
              nccl_enqueued(
                  ncclSend(data, p.tensor.numel(), type.type, p.peer, s.comm, s.stream),
                  s.comm, "ncclSend");
            } else {
              nccl_enqueued(
                  ncclRecv(data, p.tensor.numel(), type.type, p.peer, s.comm, s.stream),
                  s.comm, "ncclRecv");
            }
          }
        },
        [&](const Slot& s) {
          for (size_t j = 0; j < batch.size(); ++j) {
            if (!staging[j] || batch[j].is_send) continue;
            copy_async(batch[j].tensor.data(), staging[j]->data(),
                       batch[j].tensor.nbytes(), s.stream,
                       "cudaMemcpyAsync out of the staging buffer");
          }
        });
  } catch (...) {
    break_and_rethrow(*this, fmt::format("{} on {}", where, main->label));
  }
  for (PendingP2P& p : batch) {
    p.op->events = events;
    p.op->deadline = deadline;
  }
}

// The unique id of a lazily created communicator, as rank 0 broadcasts it
// over the main communicator, with its device count for a check.
struct IdMessage {
  ncclUniqueId id;
  int32_t local_devices;
};

}  // namespace

// ---------------------------------------------------------------------------
// Public checks and names

namespace nccl_checks {

void on_device(std::string_view where, const Tensor& t, Device device,
               std::string_view what) {
  SB_REQUIRE(t.defined(), "{}: {} is undefined", where, what);
  SB_REQUIRE(t.device().is_cuda(),
             "{}: {} {} is on {}; the NCCL backend needs CUDA tensors on {}", where, what,
             t.describe(), t.device().str(), device.str());
  SB_REQUIRE(t.device() == device,
             "{}: {} {} is on {}, but this rank's NCCL group runs on {} "
             "(NcclOptions::device)",
             where, what, t.describe(), t.device().str(), device.str());
  SB_REQUIRE(t.is_contiguous(), "{}: {} {} is not contiguous", where, what, t.describe());
}

void per_device(std::string_view where, const std::vector<Tensor>& tensors,
                std::string_view what) {
  SB_REQUIRE(!tensors.empty(), "{}: {} is empty; pass one tensor per local device", where,
             what);
  std::set<int> seen;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    const std::string item = fmt::format("{}[{}]", what, i);
    SB_REQUIRE(t.defined(), "{}: {} is undefined", where, item);
    SB_REQUIRE(t.device().is_cuda(),
               "{}: {} {} is on {}; the NCCL backend needs CUDA tensors", where, item,
               t.describe(), t.device().str());
    SB_REQUIRE(t.is_contiguous(), "{}: {} {} is not contiguous", where, item,
               t.describe());
    SB_REQUIRE(seen.insert(t.device().index).second,
               "{}: {} is on {} like an earlier tensor; pass one tensor per device",
               where, item, t.device().str());
    SB_REQUIRE(t.dtype() == tensors[0].dtype() && t.shape() == tensors[0].shape(),
               "{}: {} is {}, but {}[0] is {}; every device's tensor needs one dtype and "
               "shape",
               where, item, t.describe(), what, tensors[0].describe());
  }
}

}  // namespace nccl_checks

std::string_view nccl_dtype_name(DType dtype) { return nccl_type(dtype).name; }

std::string_view nccl_reduction_name(ReduceOp op, DType dtype) {
  return nccl_op(op, dtype).name;
}

// ---------------------------------------------------------------------------
// NcclProcessGroup::Impl

struct NcclProcessGroup::Impl {
  std::shared_ptr<GroupState> state = std::make_shared<GroupState>();
  Device device;
  int device_count = 0;
  IdMessage* host_message = nullptr;  // pinned; used under create_mu
  std::mutex create_mu;               // serializes lazy communicator creation

  ~Impl() { shutdown(); }

  // Issues an op on `comm`, after the posted sends and recvs, and returns
  // its Work.
  Work launch(Work::Info info, const std::string& where,
              const std::shared_ptr<Comm>& comm, const SlotFn& nccl,
              const SlotFn& after = {}) {
    state->flush_p2p();
    state->require_usable(where);
    auto op = std::make_shared<OpState>(where, state, comm);
    try {
      op->events = enqueue(*comm, op->deadline, state->timeout, nccl, after);
    } catch (...) {
      break_and_rethrow(*state, fmt::format("{} on {}", where, comm->label));
    }
    return Work(std::move(info),
                [op](Work::Timeout timeout) { return op->drive(timeout); });
  }

  // Posts a send or recv on the main communicator; it is issued with the
  // other posted ones when one of them is waited on or the next op is
  // issued (see the header).
  Work post(Work::Info info, const std::string& where, bool is_send, const Tensor& tensor,
            int peer) {
    state->require_usable(where);
    auto op = std::make_shared<OpState>(where, state, state->main);
    bool full = false;
    {
      std::lock_guard<std::mutex> lock(state->p2p_mu);
      state->pending.push_back(PendingP2P{is_send, tensor, peer, op});
      full = state->pending.size() >= kMaxPostedOps;
    }
    if (full) state->flush_p2p();
    return Work(std::move(info), [op](Work::Timeout timeout) {
      op->group->flush_p2p();
      return op->drive(timeout);
    });
  }

  // Broadcasts `message` from rank 0 over the main communicator and waits
  // for it (at most the group's timeout).
  IdMessage broadcast_id(const std::string& where, const IdMessage& message) {
    const bool root = state->rank == 0;
    if (root) *host_message = message;
    std::unique_ptr<StreamBuffer> buffer;
    const size_t n = sizeof(IdMessage);
    Work work = launch(
        Work::Info{"communicator setup", state->name, state->rank, state->timeout},
        where + ": broadcasting a new communicator's unique id", state->main,
        [&](const Slot& s) {
          buffer = std::make_unique<StreamBuffer>(n, s.stream, s.device);
          if (root)
            copy_async(buffer->data(), host_message, n, s.stream, "cudaMemcpyAsync");
          nccl_enqueued(ncclBroadcast(buffer->data(), buffer->data(), n, ncclUint8, 0,
                                      s.comm, s.stream),
                        s.comm, "ncclBroadcast");
        },
        [&](const Slot& s) {
          if (!root)
            copy_async(host_message, buffer->data(), n, s.stream, "cudaMemcpyAsync");
        });
    buffer.reset();               // freed in stream order, after the copy
    work.wait(Work::kNoTimeout);  // bounded by the group's timeout
    return *host_message;
  }

  std::shared_ptr<Comm> find(const std::vector<int>& devices) {
    std::lock_guard<std::mutex> lock(state->mu);
    auto it = state->cliques.find(devices);
    return it == state->cliques.end() ? nullptr : it->second;
  }

  void require_devices(const std::string& where, const std::vector<int>& devices) {
    for (int d : devices) {
      SB_REQUIRE(d >= 0 && d < device_count,
                 "{}: cuda:{} does not exist ({} CUDA devices visible)", where, d,
                 device_count);
    }
  }

  // The communicator of a *_multigpu collective over the tensors' devices
  // (in order); created on first use.
  std::shared_ptr<Comm> clique(const std::string& where,
                               const std::vector<Tensor>& tensors) {
    std::vector<int> devices;
    for (const Tensor& t : tensors) devices.push_back(t.device().index);
    require_devices(where, devices);
    state->require_usable(where);
    if (auto comm = find(devices)) return comm;
    std::lock_guard<std::mutex> create(create_mu);
    if (auto comm = find(devices)) return comm;
    const int k = static_cast<int>(devices.size());
    IdMessage mine{};
    mine.local_devices = k;
    if (state->rank == 0) {
      const ncclResult_t result = ncclGetUniqueId(&mine.id);
      if (result != ncclSuccess) {
        try {
          throw_nccl(result, nullptr, "ncclGetUniqueId");
        } catch (...) {
          break_and_rethrow(*state, where);
        }
      }
    }
    const IdMessage got = broadcast_id(where, mine);
    if (got.local_devices != k) {
      const std::string message = fmt::format(
          "{}: rank 0 passes {} tensors (one per local device), this rank {}; every rank "
          "must drive the same number of devices",
          where, got.local_devices, k);
      state->break_group(message);
      throw std::invalid_argument(message);
    }
    const std::string label =
        fmt::format("{} (NCCL ranks {}..{} of {})", devices_str(devices), state->rank * k,
                    state->rank * k + k - 1, state->size * k);
    std::shared_ptr<Comm> comm;
    try {
      comm = create_comm(label, devices, state->size * k, state->rank * k, got.id,
                         deadline_after(state->timeout), state->timeout);
    } catch (...) {
      break_and_rethrow(
          *state, fmt::format("{}: creating the communicator for {}", where, label));
    }
    spdlog::info("NCCL group \"{}\" rank {}: created the communicator for {}",
                 state->name, state->rank, label);
    std::lock_guard<std::mutex> lock(state->mu);
    state->cliques[devices] = comm;
    return comm;
  }

  // Issues what is still posted, waits (at most the timeout) for the ops
  // issued, then finalizes and destroys every communicator, aborting those
  // that do not finalize in time.
  void shutdown() {
    try {
      state->flush_p2p();
    } catch (const std::exception& e) {
      spdlog::warn("NCCL group \"{}\" rank {}: {}", state->name, state->rank, e.what());
    }
    const Clock::time_point deadline = deadline_after(state->timeout);
    for (const auto& comm : state->all_comms()) {
      std::lock_guard<std::mutex> lock(comm->mu);
      if (comm->aborted || comm->closed) continue;
      bool clean = true;
      try {
        for (size_t i = 0; i < comm->streams.size() && clean; ++i) {
          Backoff backoff;
          while (cudaStreamQuery(comm->streams[i]) == cudaErrorNotReady) {
            if (Clock::now() >= deadline) {
              clean = false;
              break;
            }
            backoff.pause();
          }
        }
        if (clean) {
          ncclGroupStart();
          for (ncclComm_t c : comm->comms) ncclCommFinalize(c);
          ncclGroupEnd();
          await_ready(comm->comms, deadline, state->timeout, "ncclCommFinalize");
          for (ncclComm_t& c : comm->comms) {
            ncclCommDestroy(c);
            c = nullptr;
          }
        }
      } catch (const std::exception& e) {
        spdlog::warn("NCCL group \"{}\" rank {}: closing {}: {}", state->name,
                     state->rank, comm->label, e.what());
        clean = false;
      }
      if (!clean) comm->abort_locked();
      comm->closed = true;
    }
    if (host_message != nullptr) {
      cudaFreeHost(host_message);
      cudaGetLastError();
    }
    host_message = nullptr;
  }
};

// ---------------------------------------------------------------------------
// Construction

NcclProcessGroup::NcclProcessGroup(Store& store, int rank, int size, NcclOptions options)
    : ProcessGroup(rank, size, options.group_name, options.timeout),
      impl_(std::make_unique<Impl>()) {
  const std::string w = where("NcclProcessGroup");
  const int count = cuda_device_count();
  if (count == 0) {
    throw Error(ErrorCode::kFailedPrecondition,
                fmt::format("{}: cannot create an NCCL process group: {}", w,
                            cuda_unavailable_reason()));
  }
  const int device = options.device >= 0 ? options.device : rank % count;
  SB_REQUIRE(options.device >= -1 && device < count,
             "{}: NcclOptions::device {} is not a CUDA device here ({} visible)", w,
             options.device, count);
  GroupState& state = *impl_->state;
  state.name = name();
  state.rank = rank;
  state.size = size;
  state.timeout = timeout();
  impl_->device = Device::cuda(device);
  impl_->device_count = count;

  const Clock::time_point deadline = deadline_after(timeout());
  const std::string key = fmt::format("{}/nccl/unique_id", name());
  ncclUniqueId id{};
  try {
    if (rank == 0) {
      const ncclResult_t result = ncclGetUniqueId(&id);
      if (result != ncclSuccess) throw_nccl(result, nullptr, "ncclGetUniqueId");
      const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
      store.set(key, Bytes(bytes, bytes + sizeof(id)));
    } else {
      store.wait({key}, timeout());
      const Bytes bytes = store.get(key);
      if (bytes.size() != sizeof(id)) {
        throw Error(
            ErrorCode::kFailedPrecondition,
            fmt::format("store key \"{}\" holds {} bytes, not an NCCL unique id ({})",
                        key, bytes.size(), sizeof(id)));
      }
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
  } catch (...) {
    rethrow_with_context(fmt::format("{}: exchanging the NCCL unique id", w));
  }
  const std::string label =
      fmt::format("cuda:{} (NCCL rank {} of {})", device, rank, size);
  try {
    state.main = create_comm(label, {device}, size, rank, id, deadline, timeout());
    CudaDeviceGuard guard(device);
    void* pinned = nullptr;
    cuda_check(cudaHostAlloc(&pinned, sizeof(IdMessage), cudaHostAllocDefault),
               "cudaHostAlloc");
    impl_->host_message = static_cast<IdMessage*>(pinned);
  } catch (...) {
    rethrow_with_context(fmt::format("{}: creating the communicator for {}", w, label));
  }
  spdlog::info("NCCL group \"{}\" rank {}: ready on {}", name(), rank, label);
}

NcclProcessGroup::~NcclProcessGroup() = default;

Device NcclProcessGroup::device() const { return impl_->device; }

// ---------------------------------------------------------------------------
// Single-device collectives

Work NcclProcessGroup::allreduce(Tensor& tensor, ReduceOp op) {
  const std::string w = where("allreduce");
  nccl_checks::on_device(w, tensor, impl_->device);
  checks::reduce_op(w, op, tensor.dtype());
  const NcclType type = nccl_type(tensor.dtype());
  const NcclOp red = nccl_op(op, tensor.dtype());
  void* data = tensor.data();
  const size_t count = tensor.numel();
  return impl_->launch(work_info("allreduce"), w, impl_->state->main, [&](const Slot& s) {
    nccl_enqueued(ncclAllReduce(data, data, count, type.type, red.op, s.comm, s.stream),
                  s.comm, "ncclAllReduce");
  });
}

Work NcclProcessGroup::broadcast(Tensor& tensor, int src_rank) {
  const std::string w = where("broadcast");
  nccl_checks::on_device(w, tensor, impl_->device);
  checks::rank(w, src_rank, size(), "src_rank");
  const NcclType type = nccl_type(tensor.dtype());
  void* data = tensor.data();
  const size_t count = tensor.numel();
  return impl_->launch(work_info("broadcast"), w, impl_->state->main, [&](const Slot& s) {
    nccl_enqueued(ncclBroadcast(data, data, count, type.type, src_rank, s.comm, s.stream),
                  s.comm, "ncclBroadcast");
  });
}

Work NcclProcessGroup::reduce(Tensor& tensor, int dst_rank, ReduceOp op) {
  const std::string w = where("reduce");
  nccl_checks::on_device(w, tensor, impl_->device);
  checks::rank(w, dst_rank, size(), "dst_rank");
  checks::reduce_op(w, op, tensor.dtype());
  const NcclType type = nccl_type(tensor.dtype());
  const NcclOp red = nccl_op(op, tensor.dtype());
  void* data = tensor.data();
  const size_t count = tensor.numel();
  return impl_->launch(work_info("reduce"), w, impl_->state->main, [&](const Slot& s) {
    nccl_enqueued(
        ncclReduce(data, data, count, type.type, red.op, dst_rank, s.comm, s.stream),
        s.comm, "ncclReduce");
  });
}

Work NcclProcessGroup::allgather(std::vector<Tensor>& outputs, const Tensor& input) {
  const std::string w = where("allgather");
  nccl_checks::on_device(w, input, impl_->device, "input");
  checks::list(w, outputs, size(), input, "outputs", Device::Type::kCuda);
  const NcclType type = nccl_type(input.dtype());
  const size_t nbytes = input.nbytes();
  const bool flat = adjacent(outputs);
  std::unique_ptr<StreamBuffer> staging;
  return impl_->launch(
      work_info("allgather"), w, impl_->state->main,
      [&](const Slot& s) {
        char* dst = static_cast<char*>(outputs[0].data());
        if (!flat) {
          staging = std::make_unique<StreamBuffer>(nbytes * size(), s.stream, s.device);
          dst = staging->data();
        }
        nccl_enqueued(
            ncclAllGather(input.data(), dst, input.numel(), type.type, s.comm, s.stream),
            s.comm, "ncclAllGather");
      },
      [&](const Slot& s) {
        if (flat) return;
        for (int r = 0; r < size(); ++r) {
          copy_async(outputs[r].data(), staging->data() + r * nbytes, nbytes, s.stream,
                     "cudaMemcpyAsync out of the allgather buffer");
        }
      });
}

Work NcclProcessGroup::gather(std::vector<Tensor>& outputs, const Tensor& input,
                              int dst_rank) {
  const std::string w = where("gather");
  nccl_checks::on_device(w, input, impl_->device, "input");
  checks::rank(w, dst_rank, size(), "dst_rank");
  const bool root = rank() == dst_rank;
  if (root) checks::list(w, outputs, size(), input, "outputs", Device::Type::kCuda);
  const NcclType type = nccl_type(input.dtype());
  const size_t count = input.numel();
  return impl_->launch(
      work_info("gather"), w, impl_->state->main,
      [&](const Slot& s) {
        if (!root) {
          nccl_enqueued(
              ncclSend(input.data(), count, type.type, dst_rank, s.comm, s.stream),
              s.comm, "ncclSend");
          return;
        }
        for (int r = 0; r < size(); ++r) {
          if (r == rank()) continue;
          nccl_enqueued(
              ncclRecv(outputs[r].data(), count, type.type, r, s.comm, s.stream), s.comm,
              "ncclRecv");
        }
      },
      [&](const Slot& s) {
        if (root) {
          copy_async(outputs[rank()].data(), input.data(), input.nbytes(), s.stream,
                     "cudaMemcpyAsync of the root's own input");
        }
      });
}

Work NcclProcessGroup::scatter(Tensor& output, const std::vector<Tensor>& inputs,
                               int src_rank) {
  const std::string w = where("scatter");
  nccl_checks::on_device(w, output, impl_->device, "output");
  checks::rank(w, src_rank, size(), "src_rank");
  const bool root = rank() == src_rank;
  if (root) checks::list(w, inputs, size(), output, "inputs", Device::Type::kCuda);
  const NcclType type = nccl_type(output.dtype());
  const size_t count = output.numel();
  return impl_->launch(
      work_info("scatter"), w, impl_->state->main,
      [&](const Slot& s) {
        if (!root) {
          nccl_enqueued(
              ncclRecv(output.data(), count, type.type, src_rank, s.comm, s.stream),
              s.comm, "ncclRecv");
          return;
        }
        for (int r = 0; r < size(); ++r) {
          if (r == rank()) continue;
          nccl_enqueued(ncclSend(inputs[r].data(), count, type.type, r, s.comm, s.stream),
                        s.comm, "ncclSend");
        }
      },
      [&](const Slot& s) {
        if (root) {
          copy_async(output.data(), inputs[rank()].data(), output.nbytes(), s.stream,
                     "cudaMemcpyAsync of the root's own input");
        }
      });
}

Work NcclProcessGroup::reduce_scatter(Tensor& output, const std::vector<Tensor>& inputs,
                                      ReduceOp op) {
  const std::string w = where("reduce_scatter");
  nccl_checks::on_device(w, output, impl_->device, "output");
  checks::list(w, inputs, size(), output, "inputs", Device::Type::kCuda);
  checks::reduce_op(w, op, output.dtype());
  const NcclType type = nccl_type(output.dtype());
  const NcclOp red = nccl_op(op, output.dtype());
  const size_t nbytes = output.nbytes();
  const bool flat = adjacent(inputs);
  std::unique_ptr<StreamBuffer> staging;
  return impl_->launch(
      work_info("reduce_scatter"), w, impl_->state->main, [&](const Slot& s) {
        const char* src = static_cast<const char*>(inputs[0].data());
        if (!flat) {
          staging = std::make_unique<StreamBuffer>(nbytes * size(), s.stream, s.device);
          for (int r = 0; r < size(); ++r) {
            copy_async(staging->data() + r * nbytes, inputs[r].data(), nbytes, s.stream,
                       "cudaMemcpyAsync into the reduce_scatter buffer");
          }
          src = staging->data();
        }
        nccl_enqueued(ncclReduceScatter(src, output.data(), output.numel(), type.type,
                                        red.op, s.comm, s.stream),
                      s.comm, "ncclReduceScatter");
      });
}

Work NcclProcessGroup::alltoall(std::vector<Tensor>& outputs,
                                const std::vector<Tensor>& inputs) {
  const std::string w = where("alltoall");
  SB_REQUIRE(static_cast<int>(inputs.size()) == size(),
             "{}: inputs holds {} tensors, expected {} (one per rank)", w, inputs.size(),
             size());
  nccl_checks::on_device(w, inputs[0], impl_->device, "inputs[0]");
  checks::list(w, inputs, size(), inputs[0], "inputs", Device::Type::kCuda);
  checks::list(w, outputs, size(), inputs[0], "outputs", Device::Type::kCuda);
  const NcclType type = nccl_type(inputs[0].dtype());
  const size_t count = inputs[0].numel();
  return impl_->launch(
      work_info("alltoall"), w, impl_->state->main,
      [&](const Slot& s) {
        for (int r = 0; r < size(); ++r) {
          if (r == rank()) continue;
          nccl_enqueued(ncclSend(inputs[r].data(), count, type.type, r, s.comm, s.stream),
                        s.comm, "ncclSend");
          nccl_enqueued(
              ncclRecv(outputs[r].data(), count, type.type, r, s.comm, s.stream), s.comm,
              "ncclRecv");
        }
      },
      [&](const Slot& s) {
        copy_async(outputs[rank()].data(), inputs[rank()].data(), inputs[0].nbytes(),
                   s.stream, "cudaMemcpyAsync of this rank's own chunk");
      });
}

Work NcclProcessGroup::alltoall_single(Tensor& output, const Tensor& input) {
  const std::string w = where("alltoall_single");
  nccl_checks::on_device(w, input, impl_->device, "input");
  nccl_checks::on_device(w, output, impl_->device, "output");
  SB_REQUIRE(output.dtype() == input.dtype() && output.numel() == input.numel(),
             "{}: output {} and input {} need equal dtype and element count", w,
             output.describe(), input.describe());
  SB_REQUIRE(input.dim() >= 1 && input.shape()[0] % size() == 0 && output.dim() >= 1 &&
                 output.shape()[0] % size() == 0,
             "{}: dim 0 of input {} and output {} must be divisible by the group size {}",
             w, input.describe(), output.describe(), size());
  const char* in = static_cast<const char*>(input.data());
  char* out = static_cast<char*>(output.data());
  const size_t nbytes = input.nbytes();
  const auto in_at = reinterpret_cast<uintptr_t>(in);
  const auto out_at = reinterpret_cast<uintptr_t>(out);
  SB_REQUIRE(out_at + nbytes <= in_at || in_at + nbytes <= out_at,
             "{}: output and input share memory; alltoall_single needs separate buffers",
             w);
  const NcclType type = nccl_type(input.dtype());
  const size_t chunk_count = input.numel() / size();
  const size_t chunk = nbytes / size();
  return impl_->launch(
      work_info("alltoall_single"), w, impl_->state->main,
      [&](const Slot& s) {
        for (int r = 0; r < size(); ++r) {
          if (r == rank()) continue;
          nccl_enqueued(
              ncclSend(in + r * chunk, chunk_count, type.type, r, s.comm, s.stream),
              s.comm, "ncclSend");
          nccl_enqueued(
              ncclRecv(out + r * chunk, chunk_count, type.type, r, s.comm, s.stream),
              s.comm, "ncclRecv");
        }
      },
      [&](const Slot& s) {
        copy_async(out + rank() * chunk, in + rank() * chunk, chunk, s.stream,
                   "cudaMemcpyAsync of this rank's own chunk");
      });
}

Work NcclProcessGroup::barrier() {
  const std::string w = where("barrier");
  std::unique_ptr<StreamBuffer> one;
  return impl_->launch(work_info("barrier"), w, impl_->state->main, [&](const Slot& s) {
    one = std::make_unique<StreamBuffer>(sizeof(float), s.stream, s.device);
    cuda_check(cudaMemsetAsync(one->data(), 0, sizeof(float), s.stream),
               "cudaMemsetAsync");
    nccl_enqueued(ncclAllReduce(one->data(), one->data(), 1, ncclFloat32, ncclSum, s.comm,
                                s.stream),
                  s.comm, "ncclAllReduce");
  });
}

Work NcclProcessGroup::send(const Tensor& tensor, int dst_rank, int /*tag*/) {
  const std::string w = where("send");
  nccl_checks::on_device(w, tensor, impl_->device);
  checks::rank(w, dst_rank, size(), "dst_rank");
  SB_REQUIRE(dst_rank != rank(),
             "{}: dst_rank {} is this rank; NCCL cannot send to itself", w, dst_rank);
  return impl_->post(work_info("send"), w, /*is_send=*/true, tensor, dst_rank);
}

Work NcclProcessGroup::recv(Tensor& tensor, int src_rank, int /*tag*/) {
  const std::string w = where("recv");
  nccl_checks::on_device(w, tensor, impl_->device);
  checks::rank(w, src_rank, size(), "src_rank");
  SB_REQUIRE(src_rank != rank(),
             "{}: src_rank {} is this rank; NCCL cannot receive from itself", w,
             src_rank);
  return impl_->post(work_info("recv"), w, /*is_send=*/false, tensor, src_rank);
}

// ---------------------------------------------------------------------------
// Multi-device variants

Work NcclProcessGroup::allreduce_multigpu(std::vector<Tensor>& tensors, ReduceOp op) {
  const std::string w = where("allreduce_multigpu");
  nccl_checks::per_device(w, tensors, "tensors");
  checks::reduce_op(w, op, tensors[0].dtype());
  const NcclType type = nccl_type(tensors[0].dtype());
  const NcclOp red = nccl_op(op, tensors[0].dtype());
  auto comm = impl_->clique(w, tensors);
  return impl_->launch(work_info("allreduce_multigpu"), w, comm, [&](const Slot& s) {
    const Tensor& t = tensors[s.index];
    nccl_enqueued(
        ncclAllReduce(t.data(), t.data(), t.numel(), type.type, red.op, s.comm, s.stream),
        s.comm, "ncclAllReduce");
  });
}

Work NcclProcessGroup::broadcast_multigpu(std::vector<Tensor>& tensors, int src_rank,
                                          int src_tensor) {
  const std::string w = where("broadcast_multigpu");
  nccl_checks::per_device(w, tensors, "tensors");
  checks::rank(w, src_rank, size(), "src_rank");
  const int k = static_cast<int>(tensors.size());
  SB_REQUIRE(src_tensor >= 0 && src_tensor < k, "{}: src_tensor {} is outside [0, {})", w,
             src_tensor, k);
  const NcclType type = nccl_type(tensors[0].dtype());
  const int root = src_rank * k + src_tensor;
  auto comm = impl_->clique(w, tensors);
  return impl_->launch(work_info("broadcast_multigpu"), w, comm, [&](const Slot& s) {
    const Tensor& t = tensors[s.index];
    nccl_enqueued(
        ncclBroadcast(t.data(), t.data(), t.numel(), type.type, root, s.comm, s.stream),
        s.comm, "ncclBroadcast");
  });
}

Work NcclProcessGroup::reduce_multigpu(std::vector<Tensor>& tensors, int dst_rank,
                                       int dst_tensor, ReduceOp op) {
  const std::string w = where("reduce_multigpu");
  nccl_checks::per_device(w, tensors, "tensors");
  checks::rank(w, dst_rank, size(), "dst_rank");
  checks::reduce_op(w, op, tensors[0].dtype());
  const int k = static_cast<int>(tensors.size());
  SB_REQUIRE(dst_tensor >= 0 && dst_tensor < k, "{}: dst_tensor {} is outside [0, {})", w,
             dst_tensor, k);
  const NcclType type = nccl_type(tensors[0].dtype());
  const NcclOp red = nccl_op(op, tensors[0].dtype());
  const int root = dst_rank * k + dst_tensor;
  auto comm = impl_->clique(w, tensors);
  return impl_->launch(work_info("reduce_multigpu"), w, comm, [&](const Slot& s) {
    const Tensor& t = tensors[s.index];
    nccl_enqueued(ncclReduce(t.data(), t.data(), t.numel(), type.type, red.op, root,
                             s.comm, s.stream),
                  s.comm, "ncclReduce");
  });
}

Work NcclProcessGroup::allgather_multigpu(std::vector<std::vector<Tensor>>& outputs,
                                          const std::vector<Tensor>& inputs) {
  const std::string w = where("allgather_multigpu");
  nccl_checks::per_device(w, inputs, "inputs");
  const size_t k = inputs.size();
  SB_REQUIRE(outputs.size() == k,
             "{}: outputs holds {} lists, expected {} (one per input)", w, outputs.size(),
             k);
  const size_t total = static_cast<size_t>(size()) * k;
  for (size_t i = 0; i < k; ++i) {
    checks::list(w, outputs[i], total, inputs[i], fmt::format("outputs[{}]", i),
                 Device::Type::kCuda);
  }
  const NcclType type = nccl_type(inputs[0].dtype());
  const size_t nbytes = inputs[0].nbytes();
  std::vector<std::unique_ptr<StreamBuffer>> staging(k);
  auto comm = impl_->clique(w, inputs);
  return impl_->launch(
      work_info("allgather_multigpu"), w, comm,
      [&](const Slot& s) {
        char* dst = static_cast<char*>(outputs[s.index][0].data());
        if (!adjacent(outputs[s.index])) {
          staging[s.index] =
              std::make_unique<StreamBuffer>(nbytes * total, s.stream, s.device);
          dst = staging[s.index]->data();
        }
        const Tensor& in = inputs[s.index];
        nccl_enqueued(
            ncclAllGather(in.data(), dst, in.numel(), type.type, s.comm, s.stream),
            s.comm, "ncclAllGather");
      },
      [&](const Slot& s) {
        if (!staging[s.index]) return;
        for (size_t r = 0; r < total; ++r) {
          copy_async(outputs[s.index][r].data(), staging[s.index]->data() + r * nbytes,
                     nbytes, s.stream, "cudaMemcpyAsync out of the allgather buffer");
        }
      });
}

Work NcclProcessGroup::reduce_scatter_multigpu(
    std::vector<Tensor>& outputs, const std::vector<std::vector<Tensor>>& inputs,
    ReduceOp op) {
  const std::string w = where("reduce_scatter_multigpu");
  nccl_checks::per_device(w, outputs, "outputs");
  const size_t k = outputs.size();
  SB_REQUIRE(inputs.size() == k,
             "{}: inputs holds {} lists, expected {} (one per output)", w, inputs.size(),
             k);
  const size_t total = static_cast<size_t>(size()) * k;
  for (size_t i = 0; i < k; ++i) {
    checks::list(w, inputs[i], total, outputs[i], fmt::format("inputs[{}]", i),
                 Device::Type::kCuda);
  }
  checks::reduce_op(w, op, outputs[0].dtype());
  const NcclType type = nccl_type(outputs[0].dtype());
  const NcclOp red = nccl_op(op, outputs[0].dtype());
  const size_t nbytes = outputs[0].nbytes();
  std::vector<std::unique_ptr<StreamBuffer>> staging(k);
  auto comm = impl_->clique(w, outputs);
  return impl_->launch(work_info("reduce_scatter_multigpu"), w, comm, [&](const Slot& s) {
    const std::vector<Tensor>& list = inputs[s.index];
    const char* src = static_cast<const char*>(list[0].data());
    if (!adjacent(list)) {
      staging[s.index] =
          std::make_unique<StreamBuffer>(nbytes * total, s.stream, s.device);
      for (size_t r = 0; r < total; ++r) {
        copy_async(staging[s.index]->data() + r * nbytes, list[r].data(), nbytes,
                   s.stream, "cudaMemcpyAsync into the reduce_scatter buffer");
      }
      src = staging[s.index]->data();
    }
    const Tensor& out = outputs[s.index];
    nccl_enqueued(ncclReduceScatter(src, out.data(), out.numel(), type.type, red.op,
                                    s.comm, s.stream),
                  s.comm, "ncclReduceScatter");
  });
}

Work NcclProcessGroup::send_multigpu(const Tensor& tensor, int dst_rank,
                                     int dst_gpu_index, int /*tag*/) {
  const std::string w = where("send_multigpu");
  checks::tensor(w, tensor, Device::Type::kCuda);
  impl_->require_devices(w, {tensor.device().index});
  checks::rank(w, dst_rank, size(), "dst_rank");
  SB_REQUIRE(dst_rank != rank(),
             "{}: dst_rank {} is this rank; NCCL cannot send to itself", w, dst_rank);
  SB_REQUIRE(dst_gpu_index >= 0, "{}: dst_gpu_index {} is negative", w, dst_gpu_index);
  return impl_->post(work_info("send_multigpu"), w, /*is_send=*/true, tensor, dst_rank);
}

Work NcclProcessGroup::recv_multigpu(Tensor& tensor, int src_rank, int src_gpu_index,
                                     int /*tag*/) {
  const std::string w = where("recv_multigpu");
  checks::tensor(w, tensor, Device::Type::kCuda);
  impl_->require_devices(w, {tensor.device().index});
  checks::rank(w, src_rank, size(), "src_rank");
  SB_REQUIRE(src_rank != rank(),
             "{}: src_rank {} is this rank; NCCL cannot receive from itself", w,
             src_rank);
  SB_REQUIRE(src_gpu_index >= 0, "{}: src_gpu_index {} is negative", w, src_gpu_index);
  return impl_->post(work_info("recv_multigpu"), w, /*is_send=*/false, tensor, src_rank);
}

// ---------------------------------------------------------------------------
// The registry hook (see process_group.h): filled when this target is linked.

namespace {

const bool kHookInstalled = [] {
  detail::NcclHook& hook = detail::nccl_hook();
  hook.create = [](const GroupInit& init) -> std::unique_ptr<ProcessGroup> {
    NcclOptions options;
    options.group_name = init.group_name;
    options.timeout = init.timeout;
    return std::make_unique<NcclProcessGroup>(init.store, init.rank, init.size, options);
  };
  hook.available = [](std::string* why_not) {
    if (cuda_device_count() > 0) return true;
    if (why_not != nullptr) *why_not = cuda_unavailable_reason();
    return false;
  };
  return true;
}();

}  // namespace

}  // namespace switchboard::collective
