#include "examples/rpc_demo/regression.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "common/check.h"

namespace switchboard::rpc_demo {

namespace {

// x . w over one row.
double dot(const float* x, std::span<const float> w) {
  double sum = 0;
  for (size_t j = 0; j < w.size(); ++j) sum += static_cast<double>(x[j]) * w[j];
  return sum;
}

void require_dim(const Dataset& data, size_t size, const char* what) {
  SB_REQUIRE(static_cast<int64_t>(size) == data.dim,
             "{}: {} weights for a dataset of dimension {}", what, size, data.dim);
}

}  // namespace

std::vector<float> true_weights(int64_t dim, uint64_t seed) {
  SB_REQUIRE(dim > 0, "true_weights: dimension {} is not positive", dim);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(dim));
  for (float& v : w) v = normal(rng);
  return w;
}

float feature_scale(int64_t j, int64_t dim) {
  if (dim <= 1) return 1.0f;
  return static_cast<float>(std::pow(10.0, -static_cast<double>(j) / (dim - 1)));
}

Dataset make_dataset(std::span<const float> w_star, int64_t rows, float noise,
                     uint64_t seed) {
  SB_REQUIRE(rows > 0, "make_dataset: {} rows is not positive", rows);
  Dataset data;
  data.rows = rows;
  data.dim = static_cast<int64_t>(w_star.size());
  data.x.resize(static_cast<size_t>(rows * data.dim));
  data.y.resize(static_cast<size_t>(rows));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> scale(static_cast<size_t>(data.dim));
  for (int64_t j = 0; j < data.dim; ++j) scale[j] = feature_scale(j, data.dim);
  for (int64_t i = 0; i < rows; ++i) {
    float* x = &data.x[static_cast<size_t>(i * data.dim)];
    for (int64_t j = 0; j < data.dim; ++j) x[j] = scale[j] * normal(rng);
    data.y[i] = static_cast<float>(dot(x, w_star)) + noise * normal(rng);
  }
  return data;
}

double loss(const Dataset& data, std::span<const float> w) {
  require_dim(data, w.size(), "loss");
  double sum = 0;
  for (int64_t i = 0; i < data.rows; ++i) {
    const double r = dot(&data.x[static_cast<size_t>(i * data.dim)], w) - data.y[i];
    sum += 0.5 * r * r;
  }
  return sum / static_cast<double>(data.rows);
}

double gradient(const Dataset& data, std::span<const float> w,
                std::span<const int64_t> rows, std::span<float> grad) {
  require_dim(data, w.size(), "gradient");
  require_dim(data, grad.size(), "gradient (output)");
  SB_REQUIRE(!rows.empty(), "gradient: no rows");
  std::vector<double> sum(grad.size(), 0.0);
  double total = 0;
  for (int64_t i : rows) {
    SB_REQUIRE(i >= 0 && i < data.rows, "gradient: row {} outside [0, {})", i, data.rows);
    const float* x = &data.x[static_cast<size_t>(i * data.dim)];
    const double r = dot(x, w) - data.y[i];
    total += 0.5 * r * r;
    for (size_t j = 0; j < sum.size(); ++j) sum[j] += r * x[j];
  }
  const double n = static_cast<double>(rows.size());
  for (size_t j = 0; j < grad.size(); ++j) grad[j] = static_cast<float>(sum[j] / n);
  return total / n;
}

double distance(std::span<const float> a, std::span<const float> b) {
  SB_REQUIRE(a.size() == b.size(), "distance: sizes {} and {} differ", a.size(),
             b.size());
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    sum += d * d;
  }
  return std::sqrt(sum);
}

}  // namespace switchboard::rpc_demo
