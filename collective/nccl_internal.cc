// The internals of the NCCL backend: see nccl_internal.h.
#include "collective/nccl_internal.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <stdexcept>
#include <thread>
#include <utility>

#include "common/check.h"
#include "common/error.h"
#include "common/mutex.h"
#include "core/cuda_allocator.h"

namespace switchboard::collective::nccl_internal {

Clock::time_point deadline_after(Timeout timeout, Clock::time_point from) {
  return timeout.count() == 0 ? Clock::time_point::max() : from + timeout;
}

void Backoff::pause() {
  std::this_thread::sleep_for(delay_);
  delay_ = std::min(delay_ * 2, std::chrono::microseconds(1000));
}

// ---------------------------------------------------------------------------
// Types, reductions and errors

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

NcclOp nccl_op(ReduceOp op, DType dtype) {
  SB_REQUIRE(op != ReduceOp::kAvg || is_floating(dtype),
             "NCCL: AVG needs a floating dtype, got {}", dtype_name(dtype));
  SB_REQUIRE(op != ReduceOp::kBand && op != ReduceOp::kBor && op != ReduceOp::kBxor,
             "NCCL: {} is not supported (NCCL has no bitwise reductions; use a GLOO group)",
             reduce_op_name(op));
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
    default:  // bitwise: refused above
      break;
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

void nccl_enqueued(ncclResult_t result, ncclComm_t comm, std::string_view what) {
  if (result != ncclSuccess && result != ncclInProgress) throw_nccl(result, comm, what);
}

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

void Comm::abort_locked() {
  if (aborted || closed) return;
  aborted = true;
  for (ncclComm_t& comm : comms) {
    if (comm != nullptr) ncclCommAbort(comm);
    comm = nullptr;
  }
}

Comm::~Comm() {
  {
    MutexLock lock(mu);
    abort_locked();  // only reached with live handles if never closed
  }
  for (cudaStream_t stream : streams) cudaStreamDestroy(stream);
  if (!streams.empty()) cudaGetLastError();
}

std::shared_ptr<Comm> create_comm(std::string label, const std::vector<int>& devices,
                                  int nranks, int first_rank, const ncclUniqueId& id,
                                  Clock::time_point deadline, Timeout timeout) {
  auto comm = std::make_shared<Comm>();
  comm->label = std::move(label);
  comm->devices = devices;
  for (int device : devices) {
    CudaDeviceGuard guard(device);
    cudaStream_t stream = nullptr;
    cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
               fmt::format("cudaStreamCreateWithFlags on cuda:{}", device));
    comm->streams.push_back(stream);
  }
  // Nobody else sees `comm` yet; the lock is for `comms`' annotation.
  MutexLock lock(comm->mu);
  comm->comms.assign(devices.size(), nullptr);
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
    comm->abort_locked();
    throw;
  }
  return comm;
}

StreamBuffer::StreamBuffer(size_t nbytes, cudaStream_t stream, int device)
    : stream_(stream) {
  cuda_check(cudaMallocAsync(&data_, std::max<size_t>(nbytes, 1), stream),
             fmt::format("cudaMallocAsync of {} bytes on cuda:{}", nbytes, device));
}

StreamBuffer::~StreamBuffer() {
  if (data_ != nullptr) cudaFreeAsync(data_, stream_);
}

void copy_async(void* dst, const void* src, size_t nbytes, cudaStream_t stream,
                std::string_view what) {
  if (dst == src || nbytes == 0) return;
  cuda_check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream), what);
}

void order_after_legacy(int device, cudaStream_t stream) {
  CudaDeviceGuard guard(device);
  cudaEvent_t event = nullptr;
  cuda_check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
  cudaError_t status = cudaEventRecord(event, cudaStreamLegacy);
  if (status == cudaSuccess) status = cudaStreamWaitEvent(stream, event, 0);
  cudaEventDestroy(event);  // released once the wait no longer needs it
  cuda_check(status, fmt::format("ordering after cuda:{}'s default stream", device));
}

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

Events::~Events() {
  for (cudaEvent_t event : events) cudaEventDestroy(event);
}

bool Events::finished() const {
  for (size_t i = 0; i < events.size(); ++i) {
    const cudaError_t status = cudaEventQuery(events[i]);
    if (status == cudaErrorNotReady) return false;
    cuda_check(status, fmt::format("cudaEventQuery on cuda:{}", devices[i]));
  }
  return true;
}

std::shared_ptr<Events> enqueue(Comm& comm, Clock::time_point deadline, Timeout timeout,
                                const SlotFn& nccl, const SlotFn& after) {
  MutexLock lock(comm.mu);
  if (comm.aborted || comm.closed) {
    throw Error(ErrorCode::kFailedPrecondition, "the communicator was aborted or closed");
  }
  const size_t k = comm.devices.size();
  const auto slot = [&](size_t i) SB_REQUIRES(comm.mu) {
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

// ---------------------------------------------------------------------------
// Group state shared with in-flight Works

std::vector<std::shared_ptr<Comm>> GroupState::all_comms() {
  MutexLock lock(mu);
  std::vector<std::shared_ptr<Comm>> out;
  if (main) out.push_back(main);
  for (const auto& [key, comm] : cliques) out.push_back(comm);
  return out;
}

std::string GroupState::broken_reason() {
  MutexLock lock(mu);
  return broken;
}

void GroupState::break_group(const std::string& why) {
  bool first = false;
  {
    MutexLock lock(mu);
    first = broken.empty();
    if (first) broken = why;
  }
  if (first) {
    spdlog::warn("NCCL group \"{}\" rank {}: aborting its communicators: {}", name, rank,
                 why);
  }
  for (const auto& comm : all_comms()) {
    MutexLock lock(comm->mu);
    comm->abort_locked();
  }
}

void GroupState::require_usable(std::string_view where) {
  const std::string why = broken_reason();
  if (!why.empty()) {
    throw Error(ErrorCode::kFailedPrecondition,
                fmt::format("{}: the group is broken by an earlier error; destroy it and "
                            "create a new one (first error: {})",
                            where, why));
  }
}

void GroupState::flush_p2p() {
  MutexLock lock(p2p_mu);
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

std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

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

OpState::OpState(std::string where_, std::shared_ptr<GroupState> group_,
                 std::shared_ptr<Comm> comm_)
    : where(std::move(where_)),
      group(std::move(group_)),
      comm(std::move(comm_)),
      deadline(deadline_after(group->timeout)) {}

bool OpState::drive(Work::Timeout wait_timeout) {
  const Clock::time_point wait_deadline = deadline_after(wait_timeout);
  Backoff backoff;
  for (;;) {
    bool aborted = false;
    bool closed = false;
    ncclResult_t async = ncclSuccess;
    ncclComm_t failed = nullptr;
    {
      MutexLock lock(comm->mu);
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
          fmt::format("{}: cancelled: the group's communicators were aborted ({})", where,
                      group->broken_reason()));
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

}  // namespace switchboard::collective::nccl_internal
