// Statistics the benchmarks report, computed as their Python counterparts
// (torch_rpc.py, torch_collective.py) compute them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace switchboard::bench {

// Nearest rank: the smallest sample with at least q of the samples <= it.
// `samples` must not be empty.
inline double percentile(std::vector<double> samples, double q) {
  std::sort(samples.begin(), samples.end());
  auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(samples.size())));
  return samples[std::max<size_t>(rank, 1) - 1];
}

// Python's statistics.median. `samples` must not be empty.
inline double median(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  size_t mid = samples.size() / 2;
  return samples.size() % 2 ? samples[mid] : (samples[mid - 1] + samples[mid]) / 2;
}

}  // namespace switchboard::bench
