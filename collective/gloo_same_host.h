// SameHostMemory: allreduce, reduce, reduce_scatter, broadcast, allgather
// and barrier through
// memory the ranks share, for a Gloo group whose ranks all run on one host
// (the same kernel, and network, IPC and PID namespaces: common/host_key.h).
// The bytes move by memcpy through a shared segment instead of through the
// loopback's sockets, and the ranks meet at futex barriers in it. NCCL and
// oneCCL do the same within a node. Internal to //collective:gloo.
//
// The segment (common/shared_memory.h): rank 0 makes it while the group
// forms and publishes its name in the group's store; every rank maps it and
// says so in the store, and only when every rank could does the group use
// it (else it keeps to Gloo's TCP, and says why in the log). Layout: a
// header (the barrier's words, a rank that gave up and why), one record per
// rank (its barrier count, its pid, the op it is in), then two sets of
// `slot_bytes` per rank (sets alternate chunk by chunk, so that the writes
// of one chunk never meet the reads of the one before).
//
// Each op moves the tensor in chunks of at most slot_bytes per rank:
//   allreduce  each rank copies its chunk into its slot; barrier; each
//              reduces its share of the chunk across every slot; barrier;
//              each copies the reduced chunk out (reduce: the root only).
//   reduce_scatter  each rank copies its input for every rank into its
//              slot, a piece each; barrier; each reduces its own pieces
//              straight into its output.
//   broadcast  the root copies a chunk in (every slot of the set); barrier;
//              the others copy it out.
//   allgather  each rank copies its chunk into its slot; barrier; each
//              copies every slot out.
//   barrier    a barrier.
// At the op's first barrier every rank checks the others' records: ranks
// whose ops disagree fail it at once, every one with Error(kFailedPrecondition)
// naming each side, as the SignatureWatch words it (gloo_signature.h).
//
// Errors (each makes the group unusable: the next op here fails at once,
// naming the first failure):
//   - a peer process that exited while this rank waited for it:
//     PeerExited (a ConnectionError) naming the rank and its pid;
//   - the op timeout passed: TimeoutError naming the ranks that had not
//     arrived and the timeout;
//   - another rank gave up on the op (one of the above, or its watch):
//     ConnectionError naming that rank and its reason;
//   - `stop()` says the op must end (the group's SignatureWatch found
//     disagreeing ranks or a lost peer): Error(kCancelled); the watch's own
//     error replaces it (gloo_process_group.cc).
// A rank that gives up marks the segment, so that the others waiting on it
// fail at once instead of at their timeout.
//
// Trust: the segment is shared only with the group's ranks, which proved
// the job secret to the store; still, nothing read from it is used as an
// index or a size (the layout is computed from the group's size here, and
// checked against the header once, when mapped), and the peers' texts are
// read within their bounds.
//
// Thread safety: the ops run on the group's op thread, one at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "collective/process_group.h"
#include "common/error.h"
#include "core/tensor.h"

namespace switchboard {
class Store;
}

namespace switchboard::collective {

struct OpSignature;

// A peer process ended while this rank waited for it in an op.
class PeerExited : public ConnectionError {
 public:
  using ConnectionError::ConnectionError;
};

// The op that runs, as the group's op thread knows it.
struct SameHostOp {
  std::string_view op;  // "allreduce", ...
  uint64_t sequence = 0;
  uint32_t tag = 0;  // op_tag(sequence, *signature)
  const OpSignature* signature = nullptr;
  std::chrono::milliseconds timeout{0};
  // True when the op must end now (the group's SignatureWatch failed it).
  const std::function<bool()>* stop = nullptr;
};

class SameHostMemory {
 public:
  // Each rank's slot, in bytes, for a group of `size`: 8 MiB in all per
  // set, within [256 KiB, 4 MiB] per rank.
  static size_t slot_bytes_for(int size);

  // The largest group that shares memory (each rank's slot must hold a
  // piece for every rank).
  static constexpr int kMaxRanks = 1024;

  // Run by every rank of the group while it forms, after Gloo connected:
  // null when some rank is on another host (or in other namespaces), did
  // not want shared memory (`wanted` false), or could not map the segment,
  // and for groups of more than kMaxRanks;
  // the log says which and why. Store calls are bounded by `timeout`
  // (TimeoutError naming the ranks missing). `where(op)` names an op for
  // errors.
  static std::unique_ptr<SameHostMemory> connect(
      Store& store, const std::string& prefix, int rank, int size, bool wanted,
      std::chrono::milliseconds timeout,
      std::function<std::string(std::string_view)> where);

  ~SameHostMemory();
  SameHostMemory(const SameHostMemory&) = delete;
  SameHostMemory& operator=(const SameHostMemory&) = delete;

  // In place, on every rank (AVG sums; the caller divides).
  void allreduce(Tensor& tensor, ReduceOp op, const SameHostOp& run);
  // In place on `root` only; the others' tensors are left as they are.
  void reduce(Tensor& tensor, ReduceOp op, int root, const SameHostOp& run);
  // output = op over every rank's inputs[rank] (each as large as output).
  void reduce_scatter(Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op,
                      const SameHostOp& run);
  void broadcast(Tensor& tensor, int root, const SameHostOp& run);
  // `outputs[r]` receives rank r's `input` (each as large as `input`).
  void allgather(const std::vector<Tensor>& outputs, const Tensor& input,
                 const SameHostOp& run);
  void barrier(const SameHostOp& run);

  // "shared memory <name> (N MiB)", for logs.
  std::string describe() const;

 private:
  struct Impl;
  explicit SameHostMemory(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace switchboard::collective
