// The RPC demo's learning problem: linear regression on synthetic data,
// y = X w* + noise, with plain loops over float vectors.
//
//   std::vector<float> w_star = true_weights(128, seed);
//   Dataset shard = make_dataset(w_star, 4096, 0.1f, seed + rank);
//   double l = gradient(shard, w, rows, grad);   // minibatch loss, grad filled
//   double held_out = loss(held_out_set, w);
//
// Every function is deterministic in its seed (std::mt19937_64 and
// libstdc++'s normal distribution), so processes running the same binary
// agree on w* without sending it.
//
// Thread safety: plain functions over values; a Dataset is immutable after
// make_dataset() and may be read from any number of threads.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace switchboard::rpc_demo {

// `rows` samples of `dim` features, row-major, and their targets.
struct Dataset {
  int64_t rows = 0;
  int64_t dim = 0;
  std::vector<float> x;  // rows * dim
  std::vector<float> y;  // rows
};

// w*: `dim` weights drawn from N(0, 1).
std::vector<float> true_weights(int64_t dim, uint64_t seed);

// The standard deviation of feature j of `dim`: log-spaced from 1 (j = 0)
// down to 0.1 (j = dim - 1). The loss's curvature therefore spans a factor
// of 100, so SGD keeps improving over thousands of steps instead of
// reaching the noise floor after a few hundred.
float feature_scale(int64_t j, int64_t dim);

// `rows` samples with x_j ~ N(0, feature_scale(j)^2) and
// y = x . w_star + N(0, noise^2).
Dataset make_dataset(std::span<const float> w_star, int64_t rows, float noise,
                     uint64_t seed);

// Mean over every row of 0.5 * (x . w - y)^2. `w` has data.dim elements.
double loss(const Dataset& data, std::span<const float> w);

// The gradient of the same loss over the rows listed in `rows` (indices into
// `data`), written to `grad` (data.dim elements, overwritten); returns the
// loss over those rows.
double gradient(const Dataset& data, std::span<const float> w,
                std::span<const int64_t> rows, std::span<float> grad);

// sqrt(sum (a_i - b_i)^2); throws std::invalid_argument for unequal sizes.
double distance(std::span<const float> a, std::span<const float> b);

}  // namespace switchboard::rpc_demo
