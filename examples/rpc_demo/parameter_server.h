// The RPC demo's parameter server: the model's parameters and the rule that
// batches the trainers' gradient pushes into SGD updates. No RPC in here:
// main.cc serves push() and done() as async handlers (they return futures,
// so no RPC thread waits while a push sits in a batch), and the test drives
// this class directly.
//
// Batching rule. Pushes wait here until
//
//     pending pushes >= target = min(pushes_per_update, trainers still training)
//
// where a trainer is training from the start (or, for a late trainer, from
// its join()) until its done() arrived. The rule is
// checked after every push() and every done(). When it holds, the pending
// gradients are averaged, one step w -= learning_rate * mean is applied, the
// version goes up by one, and every pending push's future completes with
// that version. When no trainer is training, whatever is still pending is
// applied; when every trainer is done, every done() future completes with
// the final parameters.
// With pushes_per_update = number of trainers this is synchronous SGD: one
// update per round, every trainer's gradient in it.
//
// Why it never deadlocks, with no timeout: a trainer that waits has a push
// pending here, or has called done(). If every trainer still training is
// waiting, then pending >= trainers still training >= target, so the push
// that arrived last applied an update and released them. A trainer that
// finishes early (or leaves) lowers the target when its done() arrives,
// which releases a partial batch the others wait on; the last done()
// flushes everything. A late trainer counts only from its join(), when it
// is about to push, so waiting for it never holds a batch back.
//
// Thread safety: every method may be called from any thread. The hooks run,
// and then the futures complete, outside the lock, on the thread whose
// push() or done() caused them (see ServerHooks).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/tensor.h"
#include "common/mutex.h"
#include "rpc/future.h"

namespace switchboard::rpc_demo {

struct ServerOptions {
  int64_t dim = 0;             // parameters (> 0)
  float learning_rate = 0.1f;  // the SGD step size (> 0)
  int trainers = 0;            // trainers numbered 1..trainers (> 0)
  int pushes_per_update = 0;   // the batch size K (> 0)
  // Trainers that join later (a dynamic group): they count as training only
  // from their join().
  std::vector<int64_t> late;
};

// What an update did, for progress lines.
struct UpdateEvent {
  int64_t version = 0;     // updates applied so far, this one included
  Tensor params;           // the parameters after it (never written again)
  int batch_size = 0;      // pushes averaged into it
  int still_training = 0;  // trainers that had not called done() then
};

// What a done() did, for progress lines.
struct DoneEvent {
  int64_t trainer = 0;     // who called done()
  int64_t pushes = 0;      // its pushes, all of them applied or in a batch
  int still_training = 0;  // trainers that have not called done()
  int batch_target = 0;    // min(pushes_per_update, still_training)
};

// Callbacks for progress lines; either may be empty. Both run outside the
// lock, on the thread of the push() or done() that caused them.
struct ServerHooks {
  // After every update, before its pushes' futures complete.
  std::function<void(const UpdateEvent&)> on_update;
  // After a done() was counted (and the update it released, if any),
  // before the done() futures complete.
  std::function<void(const DoneEvent&)> on_done;
};

class ParameterServer {
 public:
  // Starts with every parameter 0 at version 0. Throws std::invalid_argument
  // for options out of range, naming them.
  explicit ParameterServer(ServerOptions options, ServerHooks hooks = {});
  ParameterServer(const ParameterServer&) = delete;
  ParameterServer& operator=(const ParameterServer&) = delete;

  // Trainer `trainer` (1..trainers) pushes `grad` (float32, `dim` elements;
  // read before push() returns, not kept). The future completes with the
  // version of the update that applied it. Throws std::invalid_argument for
  // an unknown trainer, a trainer that called done(), or a gradient of
  // another dtype or size, naming what it got.
  rpc::Future<int64_t> push(int64_t trainer, const Tensor& grad) SB_EXCLUDES(mu_);

  // Late trainer `trainer` starts training: from now on it counts in the
  // batching rule. Throws std::invalid_argument for a trainer that is not
  // late, or that joined or called done() already.
  void join(int64_t trainer) SB_EXCLUDES(mu_);

  // Trainer `trainer` pushes no more (a late trainer may call it without
  // having joined). The future (the same one for every
  // trainer) completes with the final parameters once every trainer called
  // done(). Throws std::invalid_argument for an unknown trainer or a second
  // done() from one trainer.
  rpc::Future<Tensor> done(int64_t trainer) SB_EXCLUDES(mu_);

  // Completes like done()'s future; never throws.
  rpc::Future<Tensor> finished() const { return finished_.get_future(); }

  // The current parameters: a float32 tensor of `dim` elements that updates
  // replace and never write to, so the caller may keep and send it.
  Tensor params() const SB_EXCLUDES(mu_);
  int64_t version() const SB_EXCLUDES(mu_);
  // The trainers (1..trainers) that have not called done() (late ones
  // included, joined or not), in order.
  std::vector<int64_t> still_training() const SB_EXCLUDES(mu_);
  // Pushes received so far from each trainer (index 0 is trainer 1).
  std::vector<int64_t> pushes_by_trainer() const SB_EXCLUDES(mu_);

 private:
  // What an update hands from inside the lock to the code after it.
  struct Released {
    std::vector<rpc::Promise<int64_t>> pushes;
    UpdateEvent event;
    bool applied = false;
  };

  void check_trainer(int64_t trainer, const char* what) const;
  // Applies an update when the batching rule holds (or `flush_all` and
  // anything is pending).
  Released maybe_update_locked(bool flush_all) SB_REQUIRES(mu_);
  // Runs the hook, then completes the released pushes.
  void release(Released released) SB_EXCLUDES(mu_);

  const ServerOptions options_;
  const ServerHooks hooks_;
  const rpc::Promise<Tensor> finished_;

  mutable Mutex mu_;
  Tensor params_ SB_GUARDED_BY(mu_);
  int64_t version_ SB_GUARDED_BY(mu_) = 0;
  std::vector<double> sum_ SB_GUARDED_BY(mu_);  // pending gradients
  std::vector<rpc::Promise<int64_t>> pending_ SB_GUARDED_BY(mu_);
  enum class Phase : uint8_t { kLate, kTraining, kDone };
  std::vector<Phase> phase_ SB_GUARDED_BY(mu_);  // by trainer - 1
  int done_count_ SB_GUARDED_BY(mu_) = 0;
  std::vector<int64_t> pushes_ SB_GUARDED_BY(mu_);  // by trainer - 1
  int still_training_ SB_GUARDED_BY(mu_) = 0;
};

}  // namespace switchboard::rpc_demo
