// The parameter server role of the RPC demo (rank 0, worker "ps").
//
// It joins the dynamic group, reports every worker that joins or leaves
// (on_join/on_leave), lets the late trainer in once it is halfway (a key in
// the launcher's store), and serves push_grad, get_params, join_training,
// retire and done (roles.h) over a ParameterServer
// (parameter_server.h), prints a progress line every --log-every updates and
// a report once every trainer is done, then shuts down gracefully. It exits
// 1 when the held-out loss did not fall below kMaxLossRatio of its start.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "core/tensor.h"
#include "examples/rpc_demo/parameter_server.h"
#include "examples/rpc_demo/regression.h"
#include "examples/rpc_demo/roles.h"
#include "rendezvous/init_method.h"
#include "rpc/rpc.h"
#include "store/store.h"

namespace switchboard::rpc_demo {

namespace {

using Clock = std::chrono::steady_clock;

// The final held-out loss must be at most this fraction of the initial one.
constexpr double kMaxLossRatio = 0.1;

// Calls served, by function.
struct CallCounts {
  std::atomic<int64_t> push_grad{0};
  std::atomic<int64_t> get_params{0};
  std::atomic<int64_t> done{0};

  int64_t total() const { return push_grad + get_params + done; }
};

// Everything the handlers share; they hold it by shared_ptr because the
// process's function registry keeps them after run_ps() returns.
struct PsState {
  DemoFlags flags;
  int trainers = 0;
  int64_t pushes_per_update = 0;
  int64_t log_every = 0;
  std::vector<float> w_star;
  Dataset held_out;
  CallCounts calls;
  Clock::time_point start = Clock::now();
  std::unique_ptr<ParameterServer> server;
  // The late trainer may join once this many updates are applied.
  int64_t late_join_at = 0;
  std::shared_ptr<Store> store;  // the launcher's, for the late-join signal
  std::atomic<bool> late_join_signaled{false};
};

double held_out_loss(const PsState& ps, const Tensor& params) {
  return loss(ps.held_out, params.span<float>());
}

// The progress line for every --log-every-th update (the hook runs on the
// thread that applied the update, outside the server's lock).
void on_update(PsState& ps, const UpdateEvent& event) {
  if (ps.late_join_at > 0 && event.version >= ps.late_join_at &&
      !ps.late_join_signaled.exchange(true)) {
    say("ps", "halfway ({} updates applied): letting trainer-{} join", ps.late_join_at,
        late_joiner(ps.flags, ps.trainers));
    ps.store->set(kLateJoinKey, Bytes{1});
  }
  if (event.version % ps.log_every != 0) return;
  say("ps",
      "update {:>5}: held-out loss {:10.6f}, batch of {}, {} training, "
      "{} calls so far, {:.1f} s",
      event.version, held_out_loss(ps, event.params), event.batch_size,
      event.still_training, ps.calls.total(), seconds_since(ps.start));
}

// About ten progress lines: the expected number of updates / 10.
int64_t default_log_every(const DemoFlags& flags, int trainers, int64_t k) {
  int64_t pushes = 0;
  for (int t = 1; t <= trainers; ++t) pushes += steps_for(flags, t, trainers);
  const int64_t updates = k >= trainers ? flags.steps : pushes / k;
  return std::max<int64_t>(1, updates / 10);
}

void register_functions(const std::shared_ptr<PsState>& ps) {
  rpc::register_function("push_grad",
                         [ps](int64_t trainer, Tensor grad) -> rpc::Future<int64_t> {
                           ++ps->calls.push_grad;
                           return ps->server->push(trainer, grad);
                         });
  rpc::register_function("get_params", [ps]() -> Tensor {
    ++ps->calls.get_params;
    return ps->server->params();
  });
  rpc::register_function("done", [ps](int64_t trainer) -> rpc::Future<Tensor> {
    ++ps->calls.done;
    return ps->server->done(trainer);
  });
  rpc::register_function("join_training", [ps](int64_t trainer) {
    ++ps->calls.done;
    ps->server->join(trainer);
  });
  // A trainer that leaves: done, without waiting for the end of the run.
  rpc::register_function("retire", [ps](int64_t trainer) {
    ++ps->calls.done;
    (void)ps->server->done(trainer);
  });
  rpc::on_join([](const rpc::WorkerInfo& w) {
    say("ps", "{} joined the group ({} members now)", w.name, rpc::get_worker_infos().size());
  });
  rpc::on_leave([](const rpc::WorkerInfo& w) {
    say("ps", "{} left the group ({} members now)", w.name, rpc::get_worker_infos().size());
  });
}

// The line for each trainer that is done (the done hook: it runs before the
// final parameters are released, so before the report).
void on_done(const DoneEvent& event) {
  say("ps", "trainer-{} is done after {} pushes; {}", event.trainer, event.pushes,
      event.still_training == 0 ? std::string("every trainer is done")
                                : fmt::format("{} still training, batches of {} now",
                                              event.still_training, event.batch_target));
}

// Waits until every trainer called done. Bounded without limiting the run's
// length: it fails when no call at all arrived for kRpcTimeout, naming the
// trainers still training.
Tensor wait_for_trainers(const PsState& ps) {
  rpc::Future<Tensor> finished = ps.server->finished();
  int64_t last_calls = -1;
  Clock::time_point last_change = Clock::now();
  while (!finished.wait_for(std::chrono::seconds(1))) {
    const int64_t calls = ps.calls.total();
    if (calls != last_calls) {
      last_calls = calls;
      last_change = Clock::now();
    } else if (Clock::now() - last_change > kRpcTimeout) {
      throw TimeoutError(fmt::format(
          "ps: no call for {} s after {} calls; trainers still training: {}",
          kRpcTimeout.count(), calls, fmt::join(ps.server->still_training(), ", ")));
    }
  }
  return finished.value();
}

// Prints the report; returns whether the loss went down enough.
bool report(const PsState& ps, double initial_loss, const Tensor& final_params,
            double training_seconds) {
  const double final_loss = held_out_loss(ps, final_params);
  const std::vector<int64_t> steps = ps.server->pushes_by_trainer();
  const std::vector<float> zeros(ps.w_star.size(), 0.0f);
  const auto pushes = ps.calls.push_grad.load();
  const auto total = ps.calls.total();
  say("ps", "report");
  say("ps", "  trainers {} (steps {}), minibatch {}, dim {}, lr {}", ps.trainers,
      fmt::join(steps, "/"), ps.flags.batch, ps.flags.dim, ps.flags.lr);
  say("ps", "  updates {} from {} gradients (batches of up to {})", ps.server->version(),
      pushes, ps.pushes_per_update);
  say("ps", "  held-out loss {:.6f} -> {:.6f} (noise floor ~{:.6f})", initial_loss,
      final_loss, 0.5 * kNoise * kNoise);
  say("ps", "  distance to w*  {:.6f} -> {:.6f}", distance(zeros, ps.w_star),
      distance(final_params.span<float>(), ps.w_star));
  say("ps",
      "  RPC calls served {} (push_grad {}, get_params {}, done/join/retire {}) in "
      "{:.2f} s: {:.0f} calls/s",
      total, pushes, ps.calls.get_params.load(), ps.calls.done.load(), training_seconds,
      total / std::max(training_seconds, 1e-9));
  const bool ok = final_loss <= kMaxLossRatio * initial_loss;
  if (ok) {
    say("ps", "loss went down: {:.6f} -> {:.6f} ({:.0f}x lower)", initial_loss,
        final_loss, initial_loss / std::max(final_loss, 1e-300));
  } else {
    say("ps", "FAILED: loss did not go down enough: {:.6f} -> {:.6f} (needs <= {:.6f})",
        initial_loss, final_loss, kMaxLossRatio * initial_loss);
  }
  return ok;
}

}  // namespace

int run_ps(const DemoFlags& flags, int world_size) {
  auto ps = std::make_shared<PsState>();
  ps->flags = flags;
  ps->trainers = world_size - 1;
  ps->pushes_per_update =
      flags.pushes_per_update > 0 ? flags.pushes_per_update : ps->trainers;
  ps->log_every = flags.log_every > 0
                      ? flags.log_every
                      : default_log_every(flags, ps->trainers, ps->pushes_per_update);
  ps->w_star = true_weights(flags.dim, static_cast<uint64_t>(flags.seed));
  ps->held_out = make_dataset(ps->w_star, flags.held_out, kNoise, data_seed(flags, 0));
  ServerOptions options;
  options.dim = flags.dim;
  options.learning_rate = static_cast<float>(flags.lr);
  options.trainers = ps->trainers;
  options.pushes_per_update =
      static_cast<int>(std::min<int64_t>(ps->pushes_per_update, 1 << 30));
  if (const int64_t late = late_joiner(flags, ps->trainers); late > 0) {
    options.late = {late};
    ps->late_join_at = std::max<int64_t>(1, steps_for(flags, 1, ps->trainers) / 2);
    ps->store = switchboard::rendezvous::rendezvous("env://", 0, std::nullopt, kRpcTimeout).store;
  }
  PsState* raw = ps.get();  // the hook must not keep ps alive (a cycle)
  ps->server = std::make_unique<ParameterServer>(
      options,
      ServerHooks{.on_update = [raw](const UpdateEvent& e) { on_update(*raw, e); },
                  .on_done = on_done});
  const double initial_loss = held_out_loss(*ps, ps->server->params());

  // Functions first: requests may arrive as soon as init_rpc returns.
  register_functions(ps);
  rpc::init_rpc("ps", 0, rpc::kDynamicGroup, demo_rpc_options(flags, 0));
  const Clock::time_point training_start = Clock::now();
  say("ps",
      "serving {} trainers: dim {}, lr {}, one update per {} pushes "
      "(fewer once trainers finish), held-out loss {:.6f} at start",
      ps->trainers, flags.dim, flags.lr, ps->pushes_per_update, initial_loss);

  const Tensor final_params = wait_for_trainers(*ps);
  const bool ok = report(*ps, initial_loss, final_params, seconds_since(training_start));
  report_metrics("ps");
  print_scrape("ps", "switchboard_rpc_requests_served_total");
  rpc::shutdown();  // leaves the group; the trainers finish their check alone
  say("ps", "wall time {:.2f} s", seconds_since(ps->start));
  return ok ? 0 : 1;
}

}  // namespace switchboard::rpc_demo
