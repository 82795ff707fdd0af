// ProcessGroup: collectives among `size()` ranks, one per process (or
// thread), each holding a ProcessGroup object of the same backend and group
// name.
//
// Every op checks its arguments on the calling rank before any
// communication (dtype, shape, device, contiguity, list lengths, rank
// ranges) and throws std::invalid_argument naming the op, the group, the
// rank and the offending values. Otherwise it returns a Work at once; the
// op runs asynchronously and wait() reports its result (see work.h for the
// timeout rules). All ranks must issue the same collectives in the same
// order, as in every collective library.
//
// Tensors passed to an op must stay alive and untouched until its Work
// completed (the op reads and writes their bytes in place).
//
// Ops (c10d's list, with Ray's names for the free functions in groups.h):
//   allreduce(t, op)                  every rank ends with op over all t
//   broadcast(t, src)                 t of src copied to every rank
//   reduce(t, dst, op)                op over all t into dst's t (only dst's
//                                     t changes)
//   allgather(outs, in)               outs[r] = in of rank r (outs: size())
//   gather(outs, in, dst)             like allgather, outs only on dst
//   scatter(out, ins, src)            out = ins[rank] of src (ins only on src)
//   reduce_scatter(out, ins, op)      out = op over all ranks' ins[rank]
//   alltoall(outs, ins)               outs[r] = ins[rank] of rank r
//   alltoall_single(out, in)          the same on dim-0 chunks of one tensor
//   barrier()
//   send(t, dst, tag) / recv(t, src, tag)   point to point, matched by tag
// and, for one process driving several devices, the *_multigpu variants
// (NCCL; other backends throw std::invalid_argument saying so).
//
// ReduceOp::kAvg is defined for floating dtypes only, and kBand, kBor and
// kBxor for integer and bool dtypes only (std::invalid_argument otherwise).
// For bool tensors SUM, MAX and BOR are logical OR, PRODUCT, MIN and BAND
// logical AND, BXOR exclusive OR. NCCL has no bitwise reductions: its
// groups refuse them.
//
// Thread safety: ops may be issued from several threads, but collectives
// must be issued in the same order on every rank, so issue them from one
// thread per group (as with c10d). rank(), size(), name() are thread-safe.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "collective/work.h"

namespace switchboard {
class Store;
}

namespace switchboard::collective {

// kBand, kBor, kBxor: bitwise AND, OR and XOR (torch's BAND, BOR, BXOR),
// for integer and bool tensors only.
enum class ReduceOp : uint8_t { kSum, kProduct, kMin, kMax, kAvg, kBand, kBor, kBxor };

// "SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR".
std::string_view reduce_op_name(ReduceOp op);

class ProcessGroup;

// What a backend factory gets to build one rank's ProcessGroup (see
// registry.h). `store` is already namespaced for the group (a PrefixStore);
// it outlives the factory call only.
struct GroupInit {
  Store& store;
  int rank = 0;
  int size = 0;
  std::string group_name;
  std::chrono::milliseconds timeout{300'000};
};

namespace detail {
// The NCCL backend lives in its own target (//collective:nccl) so that
// GPU-free binaries never link CUDA. When linked, it fills this hook from a
// static initializer; registry.cc's built-in list consults it. Empty
// functions mean "not linked".
struct NcclHook {
  std::function<std::unique_ptr<ProcessGroup>(const GroupInit&)> create;
  // True when usable here; otherwise sets *why_not (e.g. "no CUDA device").
  std::function<bool(std::string* why_not)> available;
};
NcclHook& nccl_hook();
}  // namespace detail

class ProcessGroup {
 public:
  using Timeout = std::chrono::milliseconds;
  static constexpr Timeout kDefaultTimeout{300'000};  // c10d's default too

  ProcessGroup(int rank, int size, std::string name, Timeout timeout);
  virtual ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  Timeout timeout() const { return timeout_; }
  // "GLOO", "NCCL", or a registered backend's name.
  virtual std::string backend_name() const = 0;

  virtual Work allreduce(Tensor& tensor, ReduceOp op = ReduceOp::kSum) = 0;
  virtual Work broadcast(Tensor& tensor, int src_rank) = 0;
  virtual Work reduce(Tensor& tensor, int dst_rank, ReduceOp op = ReduceOp::kSum) = 0;
  virtual Work allgather(std::vector<Tensor>& outputs, const Tensor& input) = 0;
  // `outputs` must hold size() tensors on dst_rank and is ignored elsewhere.
  virtual Work gather(std::vector<Tensor>& outputs, const Tensor& input,
                      int dst_rank) = 0;
  // `inputs` must hold size() tensors on src_rank and is ignored elsewhere.
  virtual Work scatter(Tensor& output, const std::vector<Tensor>& inputs,
                       int src_rank) = 0;
  virtual Work reduce_scatter(Tensor& output, const std::vector<Tensor>& inputs,
                              ReduceOp op = ReduceOp::kSum) = 0;
  // outputs and inputs hold size() tensors, all of one dtype and shape.
  virtual Work alltoall(std::vector<Tensor>& outputs,
                        const std::vector<Tensor>& inputs) = 0;
  // `input` and `output` have equal dtype and numel, and a dim 0 divisible
  // by size(): chunk r of input goes to rank r, chunk r of output comes
  // from rank r.
  virtual Work alltoall_single(Tensor& output, const Tensor& input) = 0;
  virtual Work barrier() = 0;
  // A barrier that names who did not come (torch's monitored_barrier):
  // rank 0 waits `timeout` for every other rank, then lets them go; when
  // some did not arrive, rank 0 and every rank that did fail with
  // TimeoutError naming them (every one with `wait_all_ranks`, else the
  // first). The group is unusable after a failure. The default throws
  // std::invalid_argument naming the backend (GLOO has it, NCCL not).
  virtual Work monitored_barrier(std::chrono::milliseconds timeout,
                                 bool wait_all_ranks = false);
  // Point to point. A send matches the recv on dst with the same tag.
  virtual Work send(const Tensor& tensor, int dst_rank, int tag = 0) = 0;
  virtual Work recv(Tensor& tensor, int src_rank, int tag = 0) = 0;
  // A recv from whichever rank sends first with `tag` (torch's
  // recv(src=None)); Work::source_rank() then names it. The default throws
  // std::invalid_argument naming the backend (NCCL cannot).
  virtual Work recv_any(Tensor& tensor, int tag = 0);

  // Multi-device variants (one process, several GPUs): each rank passes one
  // tensor per local device. The defaults throw std::invalid_argument
  // naming the backend; NCCL implements them.
  virtual Work allreduce_multigpu(std::vector<Tensor>& tensors,
                                  ReduceOp op = ReduceOp::kSum);
  virtual Work broadcast_multigpu(std::vector<Tensor>& tensors, int src_rank,
                                  int src_tensor = 0);
  virtual Work reduce_multigpu(std::vector<Tensor>& tensors, int dst_rank,
                               int dst_tensor = 0, ReduceOp op = ReduceOp::kSum);
  // outputs[i] holds size() * tensors.size() tensors for local device i.
  virtual Work allgather_multigpu(std::vector<std::vector<Tensor>>& outputs,
                                  const std::vector<Tensor>& inputs);
  // inputs[i] holds size() * inputs.size() tensors for local device i.
  virtual Work reduce_scatter_multigpu(std::vector<Tensor>& outputs,
                                       const std::vector<std::vector<Tensor>>& inputs,
                                       ReduceOp op = ReduceOp::kSum);
  virtual Work send_multigpu(const Tensor& tensor, int dst_rank, int dst_gpu_index,
                             int tag = 0);
  virtual Work recv_multigpu(Tensor& tensor, int src_rank, int src_gpu_index,
                             int tag = 0);

 protected:
  Work::Info work_info(std::string_view op) const;
  // "allreduce in group "g" (rank 1 of 4)" for error messages.
  std::string where(std::string_view op) const;
  [[noreturn]] void unsupported(std::string_view op) const;

 private:
  const int rank_;
  const int size_;
  const std::string name_;
  const Timeout timeout_;
};

// Argument checks shared by backends; each throws std::invalid_argument
// whose message starts with `where` (see ProcessGroup::where). They check
// only what can be checked locally; `device` is the backend's device kind.
namespace checks {
void tensor(std::string_view where, const Tensor& t, Device::Type device);
void same_layout(std::string_view where, const Tensor& expected, const Tensor& actual,
                 std::string_view what);
void list(std::string_view where, const std::vector<Tensor>& list, size_t expected_size,
          const Tensor& like, std::string_view what, Device::Type device);
void rank(std::string_view where, int rank, int size, std::string_view what);
void reduce_op(std::string_view where, ReduceOp op, DType dtype);
}  // namespace checks

// Element-wise reduction over raw bytes: out[i] = op(a[i], b[i]) for n
// elements of `dtype` (AVG reduces as SUM; the caller divides). Handles
// float16/bfloat16 through float, bool as logical ops. `out` may alias a.
void reduce_elements(ReduceOp op, DType dtype, void* out, const void* a, const void* b,
                     size_t n);
// Divides n elements in place by `divisor` (floating dtypes; for AVG).
void divide_elements(DType dtype, void* data, size_t n, int divisor);

}  // namespace switchboard::collective
