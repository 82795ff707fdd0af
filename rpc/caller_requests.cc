#include "rpc/caller_requests.h"

namespace switchboard::rpc {

bool CallerRequests::reserve(int caller, bool limited) {
  const size_t limit = limited ? max_per_caller_.load(std::memory_order_relaxed) : 0;
  if (caller >= 0 && static_cast<size_t>(caller) < kSlots) {
    std::atomic<uint32_t>& n = counts_[caller];
    const uint32_t before = n.fetch_add(1, std::memory_order_relaxed);
    if (limit == 0 || before < limit) return true;
    n.fetch_sub(1, std::memory_order_relaxed);
    return false;
  }
  MutexLock lock(mu_);
  size_t& n = far_counts_[caller];
  if (limit != 0 && n >= limit) return false;
  ++n;
  return true;
}

void CallerRequests::release(int caller) {
  if (caller >= 0 && static_cast<size_t>(caller) < kSlots) {
    counts_[caller].fetch_sub(1, std::memory_order_relaxed);
    return;
  }
  MutexLock lock(mu_);
  auto it = far_counts_.find(caller);
  if (it != far_counts_.end() && --it->second == 0) far_counts_.erase(it);
}

const std::atomic<uint32_t>* CallerRequests::epoch_of(int caller) const {
  const size_t slot =
      caller >= 0 && static_cast<size_t>(caller) < kSlots ? static_cast<size_t>(caller) : kSlots;
  return &epochs_[slot];
}

void CallerRequests::cancel_all_of(int caller) {
  const_cast<std::atomic<uint32_t>*>(epoch_of(caller))->fetch_add(1);
}

void CallerRequests::cancel(int caller, uint64_t id) {
  MutexLock lock(mu_);
  if (!cancelled_.insert({caller, id}).second) return;
  cancelled_order_.push_back({caller, id});
  cancelled_count_.fetch_add(1);
  while (cancelled_order_.size() > kKeptCancelled) {
    if (cancelled_.erase(cancelled_order_.front()) > 0) cancelled_count_.fetch_sub(1);
    cancelled_order_.pop_front();
  }
}

bool CallerRequests::request_cancelled(int caller, uint64_t id) const {
  if (everything_cancelled_.load(std::memory_order_relaxed)) return true;
  if (cancelled_count_.load(std::memory_order_relaxed) == 0) return false;
  MutexLock lock(mu_);
  return cancelled_.count({caller, id}) > 0;
}

void CallerRequests::forget(int caller, uint64_t id) {
  if (cancelled_count_.load(std::memory_order_relaxed) == 0) return;
  MutexLock lock(mu_);
  if (cancelled_.erase({caller, id}) > 0) cancelled_count_.fetch_sub(1);
}

}  // namespace switchboard::rpc
