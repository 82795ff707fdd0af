#include "examples/rpc_demo/parameter_server.h"

#include <algorithm>
#include <utility>

#include "common/check.h"

namespace switchboard::rpc_demo {

ParameterServer::ParameterServer(ServerOptions options, ServerHooks hooks)
    : options_(options), hooks_(std::move(hooks)) {
  SB_REQUIRE(options_.dim > 0, "ParameterServer: dim {} is not positive", options_.dim);
  SB_REQUIRE(options_.learning_rate > 0,
             "ParameterServer: learning rate {} is not positive", options_.learning_rate);
  SB_REQUIRE(options_.trainers > 0, "ParameterServer: {} trainers is not positive",
             options_.trainers);
  SB_REQUIRE(options_.pushes_per_update > 0,
             "ParameterServer: {} pushes per update is not positive",
             options_.pushes_per_update);
  params_ = Tensor::zeros({options_.dim}, DType::kFloat32);
  sum_.assign(static_cast<size_t>(options_.dim), 0.0);
  phase_.assign(static_cast<size_t>(options_.trainers), Phase::kTraining);
  pushes_.assign(static_cast<size_t>(options_.trainers), 0);
  still_training_ = options_.trainers;
  for (int64_t trainer : options_.late) {
    check_trainer(trainer, "ParameterServer: a late trainer");
    SB_REQUIRE(phase_[trainer - 1] == Phase::kTraining,
               "ParameterServer: late trainer {} is listed twice", trainer);
    phase_[trainer - 1] = Phase::kLate;
    --still_training_;
  }
}

void ParameterServer::join(int64_t trainer) {
  check_trainer(trainer, "join");
  MutexLock lock(mu_);
  SB_REQUIRE(phase_[trainer - 1] == Phase::kLate,
             "join: trainer {} is not a late trainer waiting to join ({})", trainer,
             phase_[trainer - 1] == Phase::kDone ? "it is done" : "it is training");
  phase_[trainer - 1] = Phase::kTraining;
  ++still_training_;
}

void ParameterServer::check_trainer(int64_t trainer, const char* what) const {
  SB_REQUIRE(trainer >= 1 && trainer <= options_.trainers,
             "{}: trainer {} is not one of 1..{}", what, trainer, options_.trainers);
}

rpc::Future<int64_t> ParameterServer::push(int64_t trainer, const Tensor& grad) {
  check_trainer(trainer, "push_grad");
  SB_REQUIRE(
      grad.defined() && grad.dtype() == DType::kFloat32 && grad.numel() == options_.dim &&
          grad.device().is_cpu() && grad.is_contiguous(),
      "push_grad from trainer {}: expected a contiguous float32[{}] on cpu, got {}",
      trainer, options_.dim, grad.describe());
  const auto values = grad.span<float>();
  rpc::Promise<int64_t> promise;
  Released released;
  {
    MutexLock lock(mu_);
    SB_REQUIRE(phase_[trainer - 1] == Phase::kTraining, "push_grad: trainer {} {}", trainer,
               phase_[trainer - 1] == Phase::kDone ? "already called done"
                                                   : "is a late trainer that has not joined");
    for (size_t j = 0; j < sum_.size(); ++j) sum_[j] += values[j];
    pending_.push_back(promise);
    ++pushes_[trainer - 1];
    released = maybe_update_locked(/*flush_all=*/false);
  }
  rpc::Future<int64_t> result = promise.get_future();
  release(std::move(released));
  return result;
}

rpc::Future<Tensor> ParameterServer::done(int64_t trainer) {
  check_trainer(trainer, "done");
  Released released;
  DoneEvent event;
  Tensor final_params;
  {
    MutexLock lock(mu_);
    SB_REQUIRE(phase_[trainer - 1] != Phase::kDone, "done: trainer {} called done twice",
               trainer);
    if (phase_[trainer - 1] == Phase::kTraining) --still_training_;
    phase_[trainer - 1] = Phase::kDone;
    ++done_count_;
    released = maybe_update_locked(/*flush_all=*/still_training_ == 0);
    event = {trainer, pushes_[trainer - 1], still_training_,
             std::min(options_.pushes_per_update, still_training_)};
    if (done_count_ == options_.trainers) final_params = params_;
  }
  release(std::move(released));
  if (hooks_.on_done) hooks_.on_done(event);
  if (final_params.defined()) finished_.set_value(final_params);
  return finished_.get_future();
}

ParameterServer::Released ParameterServer::maybe_update_locked(bool flush_all) {
  Released released;
  const int pending = static_cast<int>(pending_.size());
  const int target = std::min(options_.pushes_per_update, still_training_);
  if (pending == 0 || (!flush_all && pending < target)) return released;

  // Parameters are never written after they were published: a new tensor.
  Tensor next = Tensor::empty({options_.dim}, DType::kFloat32);
  const auto old_values = params_.span<float>();
  const auto new_values = next.span<float>();
  const double scale = options_.learning_rate / pending;
  for (size_t j = 0; j < sum_.size(); ++j) {
    new_values[j] = static_cast<float>(old_values[j] - scale * sum_[j]);
    sum_[j] = 0.0;
  }
  params_ = next;
  ++version_;
  released.pushes.swap(pending_);
  released.event = {version_, next, pending, still_training_};
  released.applied = true;
  return released;
}

void ParameterServer::release(Released released) {
  if (!released.applied) return;
  // The hook first, so that its progress line comes before anything the
  // released trainers cause (their next pushes, their done()).
  if (hooks_.on_update) hooks_.on_update(released.event);
  for (const auto& promise : released.pushes) promise.set_value(released.event.version);
}

Tensor ParameterServer::params() const {
  MutexLock lock(mu_);
  return params_;
}

int64_t ParameterServer::version() const {
  MutexLock lock(mu_);
  return version_;
}

std::vector<int64_t> ParameterServer::still_training() const {
  MutexLock lock(mu_);
  std::vector<int64_t> trainers;
  for (size_t i = 0; i < phase_.size(); ++i) {
    if (phase_[i] != Phase::kDone) trainers.push_back(static_cast<int64_t>(i) + 1);
  }
  return trainers;
}

std::vector<int64_t> ParameterServer::pushes_by_trainer() const {
  MutexLock lock(mu_);
  return pushes_;
}

}  // namespace switchboard::rpc_demo
