// CallerRequests: what a call table keeps per caller about the requests it
// serves: how many each caller has waiting or running (the limit per
// caller), each caller's epoch (moved on when the caller is gone, so that
// its requests see CallContext::cancelled()), and the requests their
// callers cancelled one by one. Internal to //rpc:call_table.
//
// Thread safety: every method is thread-safe. The counts and epochs of
// callers below kSlots are atomics (no lock on a call's path); callers
// past them, and the cancelled requests, take the object's own mutex.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <set>
#include <unordered_map>
#include <utility>

#include "common/mutex.h"
#include "rpc/call_context.h"

namespace switchboard::rpc {

class CallerRequests final : public CancellationSource {
 public:
  explicit CallerRequests(size_t max_per_caller) : max_per_caller_(max_per_caller) {}

  void set_limit(size_t max_per_caller) { max_per_caller_.store(max_per_caller); }
  size_t limit() const { return max_per_caller_.load(std::memory_order_relaxed); }

  // Counts a request of `caller` in, unless it has the limit (non-zero)
  // already: false then. `limited` false: counted in whatever the count
  // (the library's own bookkeeping requests).
  bool reserve(int caller, bool limited = true) SB_EXCLUDES(mu_);
  // Counts it out.
  void release(int caller) SB_EXCLUDES(mu_);

  // The caller's epoch; cancel_all_of() moves it on.
  const std::atomic<uint32_t>* epoch_of(int caller) const;
  void cancel_all_of(int caller);

  // `caller` cancelled its request `id` (kept until forget(), or until
  // kKeptCancelled later cancellations for one that had ended already).
  void cancel(int caller, uint64_t id) SB_EXCLUDES(mu_);
  bool request_cancelled(int caller, uint64_t id) const override SB_EXCLUDES(mu_);
  // Every request, running or to come, counts as cancelled from now on
  // (the table was closed: no reply will be sent).
  void cancel_everything() { everything_cancelled_.store(true); }
  // The request is over.
  void forget(int caller, uint64_t id) SB_EXCLUDES(mu_);

 private:
  static constexpr size_t kSlots = 4096;
  static constexpr size_t kKeptCancelled = 4096;

  std::atomic<size_t> max_per_caller_;
  std::array<std::atomic<uint32_t>, kSlots> counts_{};
  // Callers past the array share the last epoch (a cancellation there
  // reaches them all).
  std::array<std::atomic<uint32_t>, kSlots + 1> epochs_{};

  mutable Mutex mu_;
  std::unordered_map<int, size_t> far_counts_ SB_GUARDED_BY(mu_);
  std::set<std::pair<int, uint64_t>> cancelled_ SB_GUARDED_BY(mu_);
  std::deque<std::pair<int, uint64_t>> cancelled_order_ SB_GUARDED_BY(mu_);
  std::atomic<size_t> cancelled_count_{0};  // cancelled_.size(), read without mu_
  std::atomic<bool> everything_cancelled_{false};
};

}  // namespace switchboard::rpc
