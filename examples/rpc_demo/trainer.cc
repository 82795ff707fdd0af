// The trainer role of the RPC demo (rank k >= 1, worker "trainer-k").
//
// Each step: the gradient of a minibatch of its own shard at the current
// parameters; push_grad to the ps with rpc_async; once the ps has applied
// the batch holding it, get_params (chained on the push's future with
// then(), so no thread of this trainer waits in between); meanwhile it draws
// the next minibatch. After its last step it calls done, which returns the
// final parameters once every trainer is done. The trainers that stayed
// then form the Gloo group "trainers" over the launcher's store and check
// with allreduces that they hold the same parameters.
//
// Membership: every trainer joins the dynamic group and waits until the ps
// is a member (on_join). The late trainer first waits for the ps's signal
// in the store, joins mid-run and calls join_training. The leaver stops
// after a third of its steps, calls retire and leaves the group.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "collective/groups.h"
#include "core/tensor.h"
#include "examples/rpc_demo/regression.h"
#include "examples/rpc_demo/roles.h"
#include "rendezvous/init_method.h"
#include "rpc/rpc.h"
#include "store/store.h"

namespace switchboard::rpc_demo {

namespace {

namespace col = collective;
using Clock = std::chrono::steady_clock;

// Trainers agree when no parameter differs from the trainers' mean by more
// than this (the ps hands each of them the same bytes, so it is 0).
constexpr double kAgreementTolerance = 1e-6;

// Minibatches of `batch` rows of a shard, drawn uniformly with replacement.
class Minibatches {
 public:
  Minibatches(int64_t rows, int64_t batch, uint64_t seed)
      : rng_(seed), pick_(0, rows - 1), rows_(static_cast<size_t>(batch)) {}
  const std::vector<int64_t>& next() {
    for (int64_t& row : rows_) row = pick_(rng_);
    return rows_;
  }

 private:
  std::mt19937_64 rng_;
  std::uniform_int_distribution<int64_t> pick_;
  std::vector<int64_t> rows_;
};

// The steps; returns the parameters after the last one.
Tensor train(const DemoFlags& flags, const std::string& name, int rank, int64_t steps,
             const Dataset& shard) {
  Minibatches minibatches(shard.rows, flags.batch, minibatch_seed(flags, rank));
  std::vector<int64_t> rows = minibatches.next();
  Tensor params = rpc::rpc_sync<Tensor>("ps", "get_params");
  int64_t calls = 1;
  double minibatch_loss = 0;
  const Clock::time_point start = Clock::now();
  for (int64_t step = 0; step < steps; ++step) {
    Tensor grad = Tensor::empty({flags.dim}, DType::kFloat32);
    minibatch_loss = gradient(shard, params.span<float>(), rows, grad.span<float>());
    rpc::Future<int64_t> pushed =
        rpc::rpc_async<int64_t>("ps", "push_grad", int64_t{rank}, grad);
    rpc::Future<Tensor> fresh = pushed.then([](const rpc::Future<int64_t>& applied) {
      applied.value();  // rethrows a failed push
      return rpc::rpc_async<Tensor>("ps", "get_params");
    });
    rows = minibatches.next();  // while the ps batches this push
    params = fresh.value();
    calls += 2;
  }
  const double seconds = seconds_since(start);
  say(name, "{} steps in {:.2f} s: {} calls ({:.0f} calls/s), last minibatch loss {:.6f}",
      steps, seconds, calls, calls / std::max(seconds, 1e-9), minibatch_loss);
  return params;
}

// The largest |w_i - mean_i| over every trainer and parameter, from two
// allreduces in group "trainers": the mean, then the maximum deviation. The
// mean is taken in float64, where n equal floats average back to exactly
// that float, so trainers that agree see 0.
double max_deviation(const Tensor& final_params) {
  const auto mine = final_params.span<float>();
  std::vector<double> values(mine.begin(), mine.end());
  Tensor mean = Tensor::from_vector<double>(values);
  col::allreduce(mean, "trainers", col::ReduceOp::kAvg);
  const auto means = mean.span<double>();
  double deviation = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    deviation = std::max(deviation, std::abs(values[i] - means[i]));
  }
  Tensor worst = Tensor::from_vector<double>({deviation});
  col::allreduce(worst, "trainers", col::ReduceOp::kMax);
  return worst.span<double>()[0];
}

// Waits until the worker `who` is a member of the group: an on_join event
// (registered before init_rpc, so none is missed) or, for a member that was
// there first, get_worker_infos(). TimeoutError after kRpcTimeout.
class MemberWatch {
 public:
  explicit MemberWatch(std::string who) : who_(std::move(who)) {
    rpc::on_join([seen = seen_, who = who_](const rpc::WorkerInfo& w) {
      if (w.name == who) seen.set_value();
    });
  }
  void wait() {
    for (const rpc::WorkerInfo& w : rpc::get_worker_infos()) {
      if (w.name == who_) seen_.set_value();
    }
    if (!seen_.get_future().wait_for(kRpcTimeout)) {
      throw TimeoutError(fmt::format("\"{}\" did not join the group within {} s", who_,
                                     kRpcTimeout.count()));
    }
  }

 private:
  std::string who_;
  rpc::Promise<void> seen_;
};

// The trainers that stay to the end (all but the leaver), in rank order.
std::vector<int> finishers(const DemoFlags& flags, int trainers) {
  std::vector<int> out;
  for (int t = 1; t <= trainers; ++t) {
    if (t != leaver(flags, trainers)) out.push_back(t);
  }
  return out;
}

}  // namespace

int run_trainer(const DemoFlags& flags, int rank, int world_size) {
  const std::string name = fmt::format("trainer-{}", rank);
  const int trainers = world_size - 1;
  const bool late = late_joiner(flags, trainers) == rank;
  const bool leaving = leaver(flags, trainers) == rank;
  const int64_t steps =
      leaving ? std::max<int64_t>(1, steps_for(flags, rank, trainers) / 3)
              : steps_for(flags, rank, trainers);
  const std::vector<float> w_star =
      true_weights(flags.dim, static_cast<uint64_t>(flags.seed));
  const Dataset shard =
      make_dataset(w_star, flags.samples, kNoise, data_seed(flags, rank));

  if (late) {
    say(name, "waiting for the ps to be halfway before joining the group");
    std::shared_ptr<Store> store =
        switchboard::rendezvous::rendezvous("env://", rank, std::nullopt, kRpcTimeout).store;
    store->wait({kLateJoinKey}, std::chrono::duration_cast<std::chrono::milliseconds>(
                                    std::chrono::minutes(10)));
  }
  MemberWatch ps("ps");
  rpc::init_rpc(name, rank, rpc::kDynamicGroup, demo_rpc_options(flags, rank));
  ps.wait();
  if (late) {
    rpc::rpc_sync("ps", "join_training", int64_t{rank});
    say(name, "joined the group mid-run ({} members)", rpc::get_worker_infos().size());
  }
  say(name, "shard of {} rows, {} steps of minibatch {}{}", shard.rows, steps, flags.batch,
      leaving ? " (then it leaves the group)" : "");
  train(flags, name, rank, steps, shard);

  if (leaving) {
    rpc::rpc_sync("ps", "retire", int64_t{rank});
    say(name, "leaving the group after {} of {} steps", steps,
        steps_for(flags, rank, trainers));
    rpc::shutdown();  // graceful: leaves the dynamic group
    return 0;
  }

  // The ps replies once the last trainer is done, however long that takes,
  // so this call has no timeout of its own: the ps bounds it (it gives up
  // when no trainer calls for kRpcTimeout), and a ps that goes away fails
  // it with ConnectionError.
  const Tensor final_params = rpc::rpc_sync<Tensor>(
      "ps", "done", rpc::with_timeout(std::chrono::milliseconds(0)), int64_t{rank});

  const std::vector<int> stay = finishers(flags, trainers);
  const int group_rank =
      static_cast<int>(std::find(stay.begin(), stay.end(), rank) - stay.begin());
  col::init_collective_group(static_cast<int>(stay.size()), group_rank, "gloo", "trainers",
                             kRpcTimeout);
  const double deviation = max_deviation(final_params);
  col::destroy_collective_group("trainers");
  const bool agree = deviation <= kAgreementTolerance;
  report_metrics(name);
  say(name,
      "{} on the final parameters: max |w_i - mean| = {:g} over {} values and {} "
      "trainer{} (allreduce in group \"trainers\"); distance to w* {:.6f}",
      agree ? "trainers agree" : "FAILED: trainers disagree", deviation,
      final_params.numel(), stay.size(), stay.size() == 1 ? "" : "s",
      distance(final_params.span<float>(), w_star));
  rpc::shutdown();
  return agree ? 0 : 1;
}

}  // namespace switchboard::rpc_demo
