// reduce_elements(): the element-wise reductions every Gloo reduce runs, on
// lengths around its block size (whole blocks and a tail) and in place, as
// Gloo calls it (the output is one of the inputs).
#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "collective/process_group.h"
#include "core/tensor.h"

using namespace switchboard;
using namespace switchboard::collective;

namespace {

template <typename T>
std::vector<T> expected(ReduceOp op, const std::vector<T>& a, const std::vector<T>& b) {
  std::vector<T> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    switch (op) {
      case ReduceOp::kProduct: out[i] = static_cast<T>(a[i] * b[i]); break;
      case ReduceOp::kMin: out[i] = a[i] < b[i] ? a[i] : b[i]; break;
      case ReduceOp::kMax: out[i] = a[i] < b[i] ? b[i] : a[i]; break;
      default: out[i] = static_cast<T>(a[i] + b[i]); break;
    }
  }
  return out;
}

template <typename T>
void check(DType dtype) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax}) {
    for (size_t n : {0, 1, 15, 16, 17, 37, 1000}) {
      std::vector<T> a(n), b(n);
      for (size_t i = 0; i < n; ++i) {
        a[i] = static_cast<T>((i * 7) % 11);
        b[i] = static_cast<T>((i * 5) % 13);
      }
      const std::vector<T> want = expected(op, a, b);
      INFO("op " << reduce_op_name(op) << ", n " << n);
      std::vector<T> out(n);
      reduce_elements(op, dtype, out.data(), a.data(), b.data(), n);
      CHECK(out == want);
      std::vector<T> in_a = a;  // out is a
      reduce_elements(op, dtype, in_a.data(), in_a.data(), b.data(), n);
      CHECK(in_a == want);
      std::vector<T> in_b = b;  // out is b
      reduce_elements(op, dtype, in_b.data(), a.data(), in_b.data(), n);
      CHECK(in_b == want);
    }
  }
}

}  // namespace

TEST_CASE("reduce_elements is exact on whole blocks, tails and in place", "[collective]") {
  SECTION("float32") { check<float>(DType::kFloat32); }
  SECTION("float64") { check<double>(DType::kFloat64); }
  SECTION("int32") { check<int32_t>(DType::kInt32); }
  SECTION("uint8") { check<uint8_t>(DType::kUInt8); }
}
