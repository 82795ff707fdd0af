// The metrics core: a monotonic Counter and a LatencyHistogram with fixed
// buckets that reports quantiles (p50, p99). Both are updated with relaxed
// atomic adds (no lock, no allocation), so they are cheap on a call path;
// readers take a snapshot, which is a plain value. Code that already holds
// a lock where it counts keeps a HistogramSnapshot under that lock and
// record()s into it instead (no atomic at all).
//
//   LatencyHistogram h;
//   h.record(std::chrono::microseconds(120));
//   HistogramSnapshot s = h.snapshot();
//   double p99 = s.quantile(0.99);  // seconds
//
// Thread safety: Counter and LatencyHistogram may be updated and read from
// any thread at once. A snapshot taken while others record sees each bucket
// at some moment, not all buckets at one moment (count and sum may differ
// by the samples recorded meanwhile). Snapshots are values.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace switchboard {

class Counter {
 public:
  void add(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// The histograms' bucket upper bounds, in seconds: 50 us to 60 s, then +Inf.
// Fixed, so that histograms of every worker and every function can be
// summed bucket by bucket.
inline constexpr std::array<double, 19> kLatencyBucketBounds = {
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1,     0.25,   0.5,     1.0,    2.5,   5.0,    10.0,  30.0, 60.0};
// One bucket per bound, plus the last one (+Inf).
inline constexpr size_t kLatencyBuckets = kLatencyBucketBounds.size() + 1;

struct HistogramSnapshot {
  // counts[i]: samples in bucket i alone (not cumulative): above bound i-1
  // and at most bound i; the last bucket has no upper bound.
  std::array<uint64_t, kLatencyBuckets> counts{};
  uint64_t count = 0;        // samples in all buckets
  double sum_seconds = 0.0;  // of every sample

  // The q-quantile (0 <= q <= 1) in seconds, as Prometheus'
  // histogram_quantile() estimates it: linear within the bucket that holds
  // the rank q * count (from 0 for the first bucket). A rank in the last
  // bucket reports the largest finite bound. 0 when there are no samples.
  double quantile(double q) const;
  // Adds `other`'s samples to these (same buckets everywhere).
  void merge(const HistogramSnapshot& other);
  // Adds one sample (negative durations count as 0). Not atomic: for a
  // histogram its owner keeps under a lock.
  void record(std::chrono::nanoseconds latency);
};

// The bucket of a sample of `ns` nanoseconds (>= 0): the first bound at or
// above it (a sample equal to a bound belongs to its bucket).
size_t latency_bucket(int64_t ns);

class LatencyHistogram {
 public:
  // Negative durations count as 0.
  void record(std::chrono::nanoseconds latency);
  HistogramSnapshot snapshot() const;

 private:
  std::array<std::atomic<uint64_t>, kLatencyBuckets> counts_{};
  std::atomic<uint64_t> sum_ns_{0};
};

}  // namespace switchboard
