#include "common/metrics.h"

#include <algorithm>
#include <cstdint>

namespace switchboard {
namespace {

// The bounds in nanoseconds, for record()'s search.
constexpr std::array<int64_t, kLatencyBucketBounds.size()> bounds_ns() {
  std::array<int64_t, kLatencyBucketBounds.size()> out{};
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<int64_t>(kLatencyBucketBounds[i] * 1e9 + 0.5);
  }
  return out;
}
constexpr auto kBoundsNs = bounds_ns();

}  // namespace

size_t latency_bucket(int64_t ns) {
  return static_cast<size_t>(std::lower_bound(kBoundsNs.begin(), kBoundsNs.end(), ns) -
                             kBoundsNs.begin());
}

void LatencyHistogram::record(std::chrono::nanoseconds latency) {
  const int64_t ns = std::max<int64_t>(latency.count(), 0);
  counts_[latency_bucket(ns)].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<uint64_t>(ns), std::memory_order_relaxed);
}

void HistogramSnapshot::record(std::chrono::nanoseconds latency) {
  const int64_t ns = std::max<int64_t>(latency.count(), 0);
  ++counts[latency_bucket(ns)];
  ++count;
  sum_seconds += static_cast<double>(ns) / 1e9;
}

HistogramSnapshot LatencyHistogram::snapshot() const {
  HistogramSnapshot s;
  for (size_t i = 0; i < kLatencyBuckets; ++i) {
    s.counts[i] = counts_[i].load(std::memory_order_relaxed);
    s.count += s.counts[i];
  }
  s.sum_seconds = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9;
  return s;
}

double HistogramSnapshot::quantile(double q) const {
  if (count == 0) return 0.0;
  q = std::clamp(q, 0.0, 1.0);
  const double rank = q * static_cast<double>(count);
  uint64_t below = 0;  // samples in the buckets before i
  for (size_t i = 0; i < kLatencyBuckets; ++i) {
    if (counts[i] == 0 || static_cast<double>(below + counts[i]) < rank) {
      below += counts[i];
      continue;
    }
    if (i == kLatencyBucketBounds.size()) return kLatencyBucketBounds.back();
    const double lower = i == 0 ? 0.0 : kLatencyBucketBounds[i - 1];
    const double upper = kLatencyBucketBounds[i];
    const double within = (rank - static_cast<double>(below)) / static_cast<double>(counts[i]);
    return lower + (upper - lower) * within;
  }
  return kLatencyBucketBounds.back();
}

void HistogramSnapshot::merge(const HistogramSnapshot& other) {
  for (size_t i = 0; i < kLatencyBuckets; ++i) counts[i] += other.counts[i];
  count += other.count;
  sum_seconds += other.sum_seconds;
}

}  // namespace switchboard
