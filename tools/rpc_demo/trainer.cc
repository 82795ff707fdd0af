// The trainer role of the RPC demo (rank k >= 1, worker "trainer-k").
//
// Each step: the gradient of a minibatch of its own shard at the current
// parameters; push_grad to the ps with rpc_async; once the ps has applied
// the batch holding it, get_params (chained on the push's future with
// then(), so no thread of this trainer waits in between); meanwhile it draws
// the next minibatch. After its last step it calls done, which returns the
// final parameters once every trainer is done. The trainers then form the
// Gloo group "trainers" (rank k - 1 of N - 1, over the launcher's store) and
// check with allreduces that they hold the same parameters.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "collective/groups.h"
#include "collective/tensor.h"
#include "rpc/rpc.h"
#include "tools/rpc_demo/regression.h"
#include "tools/rpc_demo/roles.h"

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

}  // namespace

int run_trainer(const DemoFlags& flags, int rank, int world_size) {
  const std::string name = fmt::format("trainer-{}", rank);
  const int trainers = world_size - 1;
  const int64_t steps = steps_for(flags, rank, trainers);
  const std::vector<float> w_star =
      true_weights(flags.dim, static_cast<uint64_t>(flags.seed));
  const Dataset shard =
      make_dataset(w_star, flags.samples, kNoise, data_seed(flags, rank));

  rpc::init_rpc(name, rank, world_size, demo_rpc_options(flags));
  say(name, "shard of {} rows, {} steps of minibatch {}", shard.rows, steps, flags.batch);
  train(flags, name, rank, steps, shard);

  // The ps replies once the last trainer is done, however long that takes,
  // so this call has no timeout of its own: the ps bounds it (it gives up
  // when no trainer calls for kRpcTimeout), and a ps that goes away fails
  // it with ConnectionError.
  const Tensor final_params = rpc::rpc_sync<Tensor>(
      "ps", "done", rpc::with_timeout(std::chrono::milliseconds(0)), int64_t{rank});

  col::init_collective_group(trainers, rank - 1, "gloo", "trainers", kRpcTimeout);
  const double deviation = max_deviation(final_params);
  col::destroy_collective_group("trainers");
  const bool agree = deviation <= kAgreementTolerance;
  say(name,
      "{} on the final parameters: max |w_i - mean| = {:g} over {} values and {} "
      "trainer{} (allreduce in group \"trainers\"); distance to w* {:.6f}",
      agree ? "trainers agree" : "FAILED: trainers disagree", deviation,
      final_params.numel(), trainers, trainers == 1 ? "" : "s",
      distance(final_params.span<float>(), w_star));
  rpc::shutdown();
  return agree ? 0 : 1;
}

}  // namespace switchboard::rpc_demo
