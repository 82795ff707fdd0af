// Test values for the ProcessGroup suites: small integers that are exact
// in every dtype (float16 and bfloat16 included) and never overflow int8 or
// uint8 for any op and world size up to 4, and the expected results of each
// op folded over the ranks. Shared by the conformance and argument-check
// tests.
#pragma once

#include <fmt/format.h>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "collective/process_group.h"
#include "core/tensor.h"
#include "tests/collective/pg_harness.h"

namespace pgtest {

using namespace switchboard;
using namespace switchboard::collective;
using Shape = Tensor::Shape;

// Element i of the test tensor with `seed`. Signed dtypes get -2..2,
// uint8 0..3 (a product over four ranks stays <= 81), bool every pattern of
// (rank, element) bits once there are 16 elements.
inline double value(DType dtype, int seed, int64_t i) {
  switch (dtype) {
    case DType::kBool:
      return static_cast<double>(((i % 16) >> (seed % 4) & 1) ^ (seed / 4 % 2));
    case DType::kUInt8:
      return static_cast<double>((seed * 7 + i) % 4);
    default:
      return static_cast<double>((seed * 7 + i) % 5 - 2);
  }
}

// Inputs for AVG: their sum over n ranks is n * (i % 5), so the average is
// exact in every floating dtype.
inline double avg_value(int rank, int n, int64_t i) {
  return static_cast<double>(i % 5 + 2 * rank - (n - 1));
}

inline double combine(DType dtype, ReduceOp op, double a, double b) {
  if (dtype == DType::kBool) {
    const bool any = op == ReduceOp::kSum || op == ReduceOp::kMax;
    return any ? (a != 0 || b != 0) : (a != 0 && b != 0);
  }
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return a + b;
    case ReduceOp::kProduct:
      return a * b;
    case ReduceOp::kMin:
      return std::min(a, b);
    case ReduceOp::kMax:
      return std::max(a, b);
  }
  return 0;
}

inline std::vector<ReduceOp> ops_for(DType dtype) {
  std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin,
                               ReduceOp::kMax};
  if (is_floating(dtype)) ops.push_back(ReduceOp::kAvg);
  return ops;
}

// An input of rank q for list entry k (k = 0 for single-tensor ops).
using Input = std::function<double(int q, int k, int64_t i)>;

inline Input input_for(DType dtype, ReduceOp op, int n) {
  if (op == ReduceOp::kAvg)
    return [n](int q, int k, int64_t i) { return avg_value(q, n, i + k); };
  return [dtype, n](int q, int k, int64_t i) { return value(dtype, q * n + k, i); };
}

// Rank q's input for ops whose tensors are seeded(dtype, shape, q).
inline Input by_rank(DType dtype) {
  return [dtype](int q, int, int64_t i) { return value(dtype, q, i); };
}

// op over ranks 0..n-1 of in(q, k, i), for each i < numel.
inline std::vector<double> reduced(DType dtype, ReduceOp op, int n, int k, int64_t numel,
                                   const Input& in) {
  std::vector<double> out(static_cast<size_t>(numel));
  for (int64_t i = 0; i < numel; ++i) {
    double acc = in(0, k, i);
    for (int q = 1; q < n; ++q) acc = combine(dtype, op, acc, in(q, k, i));
    out[i] = op == ReduceOp::kAvg ? acc / n : acc;
  }
  return out;
}

inline std::vector<double> expected_of(DType dtype, const Shape& shape, int seed) {
  std::vector<double> out(static_cast<size_t>(Tensor::numel_of(shape)));
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = value(dtype, seed, static_cast<int64_t>(i));
  return out;
}

inline Tensor seeded(DType dtype, const Shape& shape, int seed) {
  return sbtest::filled(dtype, shape, [=](int64_t i) { return value(dtype, seed, i); });
}

// Outputs start as 3s (or true), so an output the op never wrote shows.
inline Tensor sentinel(DType dtype, const Shape& shape) {
  return sbtest::filled(dtype, shape, [](int64_t) { return 3.0; });
}

inline std::vector<Tensor> sentinels(DType dtype, const Shape& shape, int count) {
  std::vector<Tensor> out;
  for (int k = 0; k < count; ++k) out.push_back(sentinel(dtype, shape));
  return out;
}

// A 19-element vector (not a power of two), an empty one, and a 2-D shape.
inline const std::vector<Shape> kShapes = {{19}, {0}, {3, 5}};

inline std::string describe(std::string_view op, DType dtype, const Shape& shape, int n) {
  return fmt::format("{} {}{} on {} ranks", op, dtype_name(dtype), shape_str(shape), n);
}

}  // namespace pgtest
