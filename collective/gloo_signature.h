// OpSignature: what a rank is about to do in a collective (the op, the
// dtype, the elements each rank contributes, the root, the reduction).
// Ranks that disagree would hand Gloo buffers of different sizes, and Gloo
// throws on its I/O thread, which ends the process. Here the signature
// picks the op's Gloo tag (op_tag), so disagreeing ranks never exchange the
// op's bytes, and a SignatureWatch compares the signatures beside the op and
// fails it on every rank, naming each side. Internal to //collective:gloo.
#pragma once

#include <chrono>
#include <exception>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "collective/process_group.h"
#include "core/tensor.h"

namespace gloo::rendezvous {
class Context;
}

namespace switchboard::collective {

struct OpSignature {
  std::string op;        // "allreduce", ...
  DType dtype = DType::kUInt8;
  int64_t numel = 0;     // the elements of each rank's chunk
  Tensor::Shape shape;   // for the error (the chunk's shape)
  int root = -1;         // broadcast, reduce, gather, scatter; else -1
  int reduce_op = -1;    // ReduceOp for reductions; else -1

  // The signature of a tensor op.
  static OpSignature of(std::string op, const Tensor& chunk, int root = -1,
                        std::optional<ReduceOp> reduce = std::nullopt);
  // "allreduce(SUM) of float32[10]", "broadcast from rank 0 of int64[2, 3]".
  std::string describe() const;
};

// The Gloo tag of op number `sequence` with signature `s`: the same on
// every rank that agrees, and (but for a 2^-32 chance) different on a rank
// that does not, so that the op's own messages of disagreeing ranks never
// meet (Gloo would throw on its I/O thread when their sizes differ).
uint32_t op_tag(uint64_t sequence, const OpSignature& s);

// The Gloo slot of a send or recv: its tag, and a hash of its dtype and
// byte count, so that a send and a recv that disagree never meet (Gloo would
// throw on its I/O thread, ending the process); they time out instead. The
// top bit keeps these slots apart from the collectives'.
uint64_t p2p_slot(int tag, const Tensor& tensor);

// Watches the op that runs and, when it has run for longer than
// `suspicion`, exchanges its signature with every peer: a disagreement
// (whose ranks are stuck, since their op_tag()s differ) then fails the op
// on every rank at once with an error naming each side; an op that is
// merely slow is left alone. Ops that finish within `suspicion` cost an
// atomic store and a lock on each side: no message, no wake-up.
//
// The exchange takes the peers' signatures in the order they come, so a
// peer that already left the op (it had what it needed) holds nothing up,
// and the first that differs decides. Before it fails the op, a rank that
// found a disagreement waits until each peer it heard from has its
// signature too (so that every side can name the others, however the
// threads are scheduled). When the ranks disagree, or when a
// peer's connection has failed (it died while the op waited on others), the
// watcher makes Gloo fail every connection of the context (what Gloo itself
// does when a wait times out), which ends the op with that error; the group
// is then unusable, as after a timeout. Nothing it meets ends the process.
//
// Thread safety: begin() and end() on the group's op thread, one op at a
// time; the watcher thread is this object's.
class SignatureWatch {
 public:
  static constexpr std::chrono::milliseconds kDefaultSuspicion{1000};

  // `where(op)` names an op for the error ("allreduce in group ..."),
  // called only when an exchange starts.
  SignatureWatch(std::shared_ptr<gloo::rendezvous::Context> context,
                 std::function<std::string(std::string_view)> where,
                 std::chrono::milliseconds suspicion = kDefaultSuspicion);
  // Stops the watcher (aborting what it waits for) and joins it.
  ~SignatureWatch();
  SignatureWatch(const SignatureWatch&) = delete;
  SignatureWatch& operator=(const SignatureWatch&) = delete;

  // The op `sequence` with signature `mine` starts; `mine` must stay valid
  // until end(). No allocation, one uncontended lock.
  void begin(uint64_t sequence, const OpSignature& mine, std::chrono::milliseconds timeout);
  // It ended (returned or threw): throws Error(kFailedPrecondition) naming
  // the sides when the watcher found that the ranks disagree, and
  // ConnectionError naming the rank when it found that a peer's connection
  // failed (the peer died) while the op waited.
  void end();
  // Whether the watcher has failed the running op (end() will throw): an
  // op that waits outside Gloo (gloo_same_host.h) looks at it while it
  // waits. One uncontended lock.
  bool failed() const;

 private:
  struct Op;
  void run();
  void exchange(const std::shared_ptr<Op>& op);
  // Records `failure` for end() to throw and wakes the op (it fails every
  // connection of the context).
  void fail_op(const std::shared_ptr<Op>& op, std::exception_ptr failure);

  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace switchboard::collective
