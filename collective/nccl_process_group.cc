#include "collective/nccl_process_group.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <set>

#include "collective/nccl_internal.h"
#include "common/check.h"
#include "common/error.h"
#include "common/mutex.h"
#include "core/cuda_allocator.h"
#include "store/store.h"

namespace switchboard::collective {

using namespace nccl_internal;  // this backend's internals: nccl_internal.h

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
  Mutex create_mu;  // serializes lazy communicator creation
  // Pinned; what it points to is used under create_mu.
  IdMessage* host_message SB_PT_GUARDED_BY(create_mu) = nullptr;

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
      MutexLock lock(state->p2p_mu);
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
  IdMessage broadcast_id(const std::string& where, const IdMessage& message)
      SB_REQUIRES(create_mu) {
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
    MutexLock lock(state->mu);
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
    MutexLock create(create_mu);
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
    MutexLock lock(state->mu);
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
      MutexLock lock(comm->mu);
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
