// NcclProcessGroup: the CUDA ProcessGroup, over NCCL.
//
// STATUS: built against CUDA 13 / NCCL 2.28. Its single-GPU cases
// (tests/collective/nccl_process_group_test.cc) passed on one H100; the
// cases that need two or more GPUs have never run (README, "GPU status").
//
// Devices. Each rank binds one CUDA device, NcclOptions::device, or
// rank % cuda_device_count() when unset (c10d's guess for one process per
// GPU). Every single-device op takes tensors on that device and refuses
// others, naming both. The *_multigpu ops take one tensor per local device
// (any set of distinct devices, in the same count on every rank).
//
// Communicators. The constructor rendezvouses through `store`: rank 0 calls
// ncclGetUniqueId and publishes it under "<group name>/nccl/unique_id", the
// others wait for it (at most `timeout`), and every rank creates the group's
// main communicator on its device (size() NCCL ranks, NCCL rank = rank()).
// The store is used during construction only (GroupInit's store does not
// outlive the factory call), so a communicator the group needs later is
// created lazily and its unique id travels over the main communicator: a
// *_multigpu collective over local devices [d_0, ..., d_k-1] (in the order
// of the tensors) uses one communicator of size() * k NCCL ranks, local
// device i being NCCL rank rank() * k + i (Ray's layout), created on the
// first op over that device set (rank 0 broadcasts the id and its k; a rank
// whose k differs fails with std::invalid_argument). Every rank must come
// to a new device set in the same op. Each communicator has one
// non-blocking CUDA stream per device; its ops first wait for the work
// already issued to that device's legacy default stream (where the copy
// helpers of cuda_allocator.h and most kernels run). Communicators run in
// NCCL's non-blocking mode, so creating them and waiting for them are
// bounded by the timeout. NCCL refuses two ranks of one communicator on one
// GPU: ranks sharing a machine need distinct devices.
//
// Ops. Every ProcessGroup op and every *_multigpu variant is supported, for
// every dtype. bool travels as ncclUint8, with SUM and MAX as ncclMax
// (logical OR) and PRODUCT and MIN as ncclMin (logical AND); AVG is ncclAvg
// (floating dtypes only). allgather and reduce_scatter stage through one
// flat buffer unless the list's tensors are already adjacent in memory;
// gather, scatter and alltoall are grouped ncclSend/ncclRecv. barrier() is
// an allreduce of one element on this rank's device.
//
// Point to point. NCCL has no tags: `tag` is accepted and ignored, and the
// sends and recvs between two ranks match in the order they were posted.
// send and recv are posted, not issued: the posted ones are issued together,
// as one NCCL group, when one of their Works is waited on or the group's
// next op is issued (as batch_isend_irecv does in c10d). So a rank may post
// its send before its recv, as with Gloo, even in a ring; what still
// deadlocks (until the timeout) is waiting on a send before posting the
// recv that the peer's send needs. send_multigpu / recv_multigpu travel the
// same way over the main communicator, staged through a buffer on this
// rank's device when the tensor is on another one; the peer's GPU index is
// only checked to be non-negative (the bytes land in whatever tensor the
// peer's matching recv names). Sending to oneself is refused.
//
// Work. An op enqueues its kernels and returns a Work at once; no thread of
// the group runs it. Work::wait polls the op's CUDA events (sleeping a few
// microseconds to a millisecond between polls) until they completed, the
// wait's timeout passed, or the group's timeout counted from the op's issue
// passed. On a timeout it aborts every communicator of the group
// (ncclCommAbort) and marks the group broken: Work::wait then throws
// TimeoutError naming the op, the group, the rank and the timeout. An
// asynchronous NCCL error (ncclCommGetAsyncError) breaks the group the same
// way and fails the op with ConnectionError (ncclRemoteError,
// ncclSystemError: a peer or the network went away) or Error(kInternal)
// naming the op and NCCL's message. Once broken, every new op throws
// Error(kFailedPrecondition) with the first error's message: destroy the
// group and create a new one (as with c10d). Work that finished on the GPU
// is reported as finished when waited later, unless the group broke first.
//
// Errors while issuing: argument checks throw std::invalid_argument before
// any communication (see nccl_checks below and process_group.h); a CUDA or
// NCCL call that fails while an op is being issued breaks the group and
// throws Error naming the op. The constructor throws Error(kFailedPrecondition)
// when no CUDA device is visible (with cuda_unavailable_reason()) and
// TimeoutError naming the group and rank when rendezvous or communicator
// creation outlasts the timeout.
//
// Ownership: the caller keeps `store` (used during construction only) and
// every tensor passed to an op, which must stay alive and untouched until
// its Work completed. The group owns its communicators, streams and
// temporary buffers. A Work may outlive the group; waiting on one whose op
// had not finished when the group was destroyed throws Error(kCancelled).
//
// Thread safety: as ProcessGroup: ops may be issued from several threads
// (each communicator serializes the calls that use it), but collectives
// must be issued in the same order on every rank. rank(), size(), name(),
// device() are thread-safe. The destructor must not run concurrently with
// an op being issued; it issues what is still posted, waits (at most the
// timeout) for the ops issued, then finalizes the communicators (aborting
// those that do not finalize within the timeout).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "collective/process_group.h"

namespace switchboard {
class Store;
}

namespace switchboard::collective {

struct NcclOptions {
  std::string group_name = "default";
  ProcessGroup::Timeout timeout = ProcessGroup::kDefaultTimeout;
  // The CUDA ordinal of this rank's single-device ops; -1: rank %
  // cuda_device_count().
  int device = -1;
};

class NcclProcessGroup final : public ProcessGroup {
 public:
  // Blocks until every rank created the main communicator (see above).
  NcclProcessGroup(Store& store, int rank, int size, NcclOptions options = {});
  ~NcclProcessGroup() override;

  std::string backend_name() const override { return "NCCL"; }
  // The device of this rank's single-device ops, e.g. cuda:1.
  Device device() const;

  Work allreduce(Tensor& tensor, ReduceOp op = ReduceOp::kSum) override;
  Work broadcast(Tensor& tensor, int src_rank) override;
  Work reduce(Tensor& tensor, int dst_rank, ReduceOp op = ReduceOp::kSum) override;
  Work allgather(std::vector<Tensor>& outputs, const Tensor& input) override;
  Work gather(std::vector<Tensor>& outputs, const Tensor& input, int dst_rank) override;
  Work scatter(Tensor& output, const std::vector<Tensor>& inputs, int src_rank) override;
  Work reduce_scatter(Tensor& output, const std::vector<Tensor>& inputs,
                      ReduceOp op = ReduceOp::kSum) override;
  Work alltoall(std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs) override;
  Work alltoall_single(Tensor& output, const Tensor& input) override;
  Work barrier() override;
  // Posted, then issued with the next op or wait; `tag` is ignored (NCCL
  // has no tags). See "Point to point" above.
  Work send(const Tensor& tensor, int dst_rank, int tag = 0) override;
  Work recv(Tensor& tensor, int src_rank, int tag = 0) override;

  Work allreduce_multigpu(std::vector<Tensor>& tensors,
                          ReduceOp op = ReduceOp::kSum) override;
  Work broadcast_multigpu(std::vector<Tensor>& tensors, int src_rank,
                          int src_tensor = 0) override;
  Work reduce_multigpu(std::vector<Tensor>& tensors, int dst_rank, int dst_tensor = 0,
                       ReduceOp op = ReduceOp::kSum) override;
  Work allgather_multigpu(std::vector<std::vector<Tensor>>& outputs,
                          const std::vector<Tensor>& inputs) override;
  Work reduce_scatter_multigpu(std::vector<Tensor>& outputs,
                               const std::vector<std::vector<Tensor>>& inputs,
                               ReduceOp op = ReduceOp::kSum) override;
  // `dst_gpu_index` / `src_gpu_index`: the peer's CUDA ordinal, for the
  // caller's bookkeeping (see "Point to point"). `tag` is ignored.
  Work send_multigpu(const Tensor& tensor, int dst_rank, int dst_gpu_index,
                     int tag = 0) override;
  Work recv_multigpu(Tensor& tensor, int src_rank, int src_gpu_index,
                     int tag = 0) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The backend-specific argument checks every op runs before communicating,
// besides those of process_group.h. Pure functions of their arguments (no
// CUDA call), so they are testable without a GPU. Each throws
// std::invalid_argument whose message starts with `where`.
namespace nccl_checks {
// A single-device op's tensor: defined, contiguous, on CUDA device `device`.
void on_device(std::string_view where, const Tensor& t, Device device,
               std::string_view what = "tensor");
// A *_multigpu op's list: non-empty, contiguous CUDA tensors on distinct
// devices, all of one dtype and shape.
void per_device(std::string_view where, const std::vector<Tensor>& tensors,
                std::string_view what);
}  // namespace nccl_checks

// NCCL's names for what an op sends (for logs and tests): "ncclFloat16",
// ... ("ncclUint8" for bool), and the reduction NCCL runs for `op` on
// `dtype` ("ncclSum", ...; "ncclMax"/"ncclMin" for bool). The latter throws
// std::invalid_argument for AVG on a non-floating dtype.
std::string_view nccl_dtype_name(DType dtype);
std::string_view nccl_reduction_name(ReduceOp op, DType dtype);

}  // namespace switchboard::collective
