#include "collective/process_group.h"

#include <fmt/format.h>

#include <algorithm>
#include <type_traits>
#include <cstring>
#include <stdexcept>

#include "common/check.h"

namespace switchboard::collective {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "SUM";
    case ReduceOp::kProduct:
      return "PRODUCT";
    case ReduceOp::kMin:
      return "MIN";
    case ReduceOp::kMax:
      return "MAX";
    case ReduceOp::kAvg:
      return "AVG";
    case ReduceOp::kBand:
      return "BAND";
    case ReduceOp::kBor:
      return "BOR";
    case ReduceOp::kBxor:
      return "BXOR";
  }
  return "UNKNOWN";
}

namespace detail {
NcclHook& nccl_hook() {
  static NcclHook hook;
  return hook;
}
}  // namespace detail

ProcessGroup::ProcessGroup(int rank, int size, std::string name, Timeout timeout)
    : rank_(rank), size_(size), name_(std::move(name)), timeout_(timeout) {
  SB_REQUIRE(size >= 1, "ProcessGroup \"{}\": size must be >= 1, got {}", name_, size);
  SB_REQUIRE(rank >= 0 && rank < size, "ProcessGroup \"{}\": rank {} is outside [0, {})",
             name_, rank, size);
  SB_REQUIRE(timeout.count() >= 0, "ProcessGroup \"{}\": timeout must be >= 0 ms, got {}",
             name_, timeout.count());
}

ProcessGroup::~ProcessGroup() = default;

Work::Info ProcessGroup::work_info(std::string_view op) const {
  return Work::Info{std::string(op), name_, rank_, timeout_, size_};
}

std::string ProcessGroup::where(std::string_view op) const {
  return fmt::format("{} in group \"{}\" (rank {} of {})", op, name_, rank_, size_);
}

void ProcessGroup::unsupported(std::string_view op) const {
  throw std::invalid_argument(fmt::format("{}: the {} backend does not support this op",
                                          where(op), backend_name()));
}

Work ProcessGroup::allreduce_multigpu(std::vector<Tensor>&, ReduceOp) {
  unsupported("allreduce_multigpu");
}
Work ProcessGroup::broadcast_multigpu(std::vector<Tensor>&, int, int) {
  unsupported("broadcast_multigpu");
}
Work ProcessGroup::reduce_multigpu(std::vector<Tensor>&, int, int, ReduceOp) {
  unsupported("reduce_multigpu");
}
Work ProcessGroup::allgather_multigpu(std::vector<std::vector<Tensor>>&,
                                      const std::vector<Tensor>&) {
  unsupported("allgather_multigpu");
}
Work ProcessGroup::reduce_scatter_multigpu(std::vector<Tensor>&,
                                           const std::vector<std::vector<Tensor>>&,
                                           ReduceOp) {
  unsupported("reduce_scatter_multigpu");
}
Work ProcessGroup::send_multigpu(const Tensor&, int, int, int) {
  unsupported("send_multigpu");
}
Work ProcessGroup::recv_multigpu(Tensor&, int, int, int) { unsupported("recv_multigpu"); }
Work ProcessGroup::recv_any(Tensor&, int) { unsupported("recv_any"); }
Work ProcessGroup::monitored_barrier(std::chrono::milliseconds, bool) {
  unsupported("monitored_barrier");
}

namespace checks {

void tensor(std::string_view where, const Tensor& t, Device::Type device) {
  SB_REQUIRE(t.defined(), "{}: the tensor is undefined", where);
  const Device expected{device, t.device().index};
  SB_REQUIRE(t.device() == expected,
             "{}: tensor {} is on {}, this backend needs {} tensors", where, t.describe(),
             t.device().str(), device == Device::Type::kCpu ? "cpu" : "cuda");
  SB_REQUIRE(t.is_contiguous(), "{}: tensor {} is not contiguous", where, t.describe());
}

void same_layout(std::string_view where, const Tensor& expected, const Tensor& actual,
                 std::string_view what) {
  SB_REQUIRE(actual.defined(), "{}: {} is undefined", where, what);
  SB_REQUIRE(actual.dtype() == expected.dtype(), "{}: {} has dtype {}, expected {}",
             where, what, dtype_name(actual.dtype()), dtype_name(expected.dtype()));
  SB_REQUIRE(actual.shape() == expected.shape(), "{}: {} has shape {}, expected {}",
             where, what, shape_str(actual.shape()), shape_str(expected.shape()));
  SB_REQUIRE(actual.device() == expected.device(), "{}: {} is on {}, expected {}", where,
             what, actual.device().str(), expected.device().str());
}

void list(std::string_view where, const std::vector<Tensor>& list, size_t expected_size,
          const Tensor& like, std::string_view what, Device::Type device) {
  SB_REQUIRE(list.size() == expected_size,
             "{}: {} holds {} tensors, expected {} (one per rank)", where, what,
             list.size(), expected_size);
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string item = fmt::format("{}[{}]", what, i);
    SB_REQUIRE(list[i].defined(), "{}: {} is undefined", where, item);
    tensor(where, list[i], device);
    same_layout(where, like, list[i], item);
  }
}

void rank(std::string_view where, int rank, int size, std::string_view what) {
  SB_REQUIRE(rank >= 0 && rank < size, "{}: {} {} is outside [0, {})", where, what, rank,
             size);
}

void reduce_op(std::string_view where, ReduceOp op, DType dtype) {
  SB_REQUIRE(op != ReduceOp::kAvg || is_floating(dtype),
             "{}: AVG needs a floating dtype, the tensor is {}", where,
             dtype_name(dtype));
  const bool bitwise =
      op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
  SB_REQUIRE(!bitwise || !is_floating(dtype),
             "{}: {} needs an integer or bool dtype, the tensor is {}", where,
             reduce_op_name(op), dtype_name(dtype));
}

}  // namespace checks

namespace {

// out[i] = f(a[i], b[i]) for i < n, where `out` may be `a` or `b` itself
// (Gloo reduces in place) but overlaps neither otherwise. Blocks of
// kBlock elements are loaded before any is stored, which is what lets the
// compiler vectorize the loop at -O2 without checking for aliasing at run
// time; a plain loop over out[i] = a[i] + b[i] stays scalar there, and
// made a 64 MiB float32 allreduce about 25% slower than PyTorch's.
template <typename T, typename F>
void elementwise(T* out, const T* a, const T* b, size_t n, F f) {
  constexpr size_t kBlock = 16;
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    T x[kBlock];
    T y[kBlock];
    for (size_t k = 0; k < kBlock; ++k) {
      x[k] = a[i + k];
      y[k] = b[i + k];
    }
    for (size_t k = 0; k < kBlock; ++k) out[i + k] = f(x[k], y[k]);
  }
  for (; i < n; ++i) out[i] = f(a[i], b[i]);
}

template <typename T>
void reduce_typed(ReduceOp op, T* out, const T* a, const T* b, size_t n) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return elementwise(out, a, b, n, [](T x, T y) { return static_cast<T>(x + y); });
    case ReduceOp::kProduct:
      return elementwise(out, a, b, n, [](T x, T y) { return static_cast<T>(x * y); });
    case ReduceOp::kMin:
      return elementwise(out, a, b, n, [](T x, T y) { return std::min(x, y); });
    case ReduceOp::kMax:
      return elementwise(out, a, b, n, [](T x, T y) { return std::max(x, y); });
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor:
      if constexpr (std::is_integral_v<T>) {
        for (size_t i = 0; i < n; ++i) {
          out[i] = static_cast<T>(op == ReduceOp::kBand  ? (a[i] & b[i])
                                  : op == ReduceOp::kBor ? (a[i] | b[i])
                                                         : (a[i] ^ b[i]));
        }
      }
      return;  // floating dtypes: refused by checks::reduce_op()
  }
}

// float16 / bfloat16: compute in float, round once per element.
template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void reduce_half(ReduceOp op, uint16_t* out, const uint16_t* a, const uint16_t* b,
                 size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float x = ToFloat(a[i]);
    const float y = ToFloat(b[i]);
    float r = 0;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        r = x + y;
        break;
      case ReduceOp::kProduct:
        r = x * y;
        break;
      case ReduceOp::kMin:
        r = std::min(x, y);
        break;
      case ReduceOp::kMax:
        r = std::max(x, y);
        break;
      default:  // bitwise: refused by checks::reduce_op()
        break;
    }
    out[i] = FromFloat(r);
  }
}

void reduce_bool(ReduceOp op, uint8_t* out, const uint8_t* a, const uint8_t* b,
                 size_t n) {
  if (op == ReduceOp::kBxor) {
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>((a[i] != 0) != (b[i] != 0));
    return;
  }
  const bool any = op == ReduceOp::kSum || op == ReduceOp::kMax || op == ReduceOp::kAvg ||
                   op == ReduceOp::kBor;
  for (size_t i = 0; i < n; ++i) {
    out[i] = any ? static_cast<uint8_t>(a[i] != 0 || b[i] != 0)
                 : static_cast<uint8_t>(a[i] != 0 && b[i] != 0);
  }
}

template <typename T>
void divide_typed(T* data, size_t n, int divisor) {
  for (size_t i = 0; i < n; ++i) data[i] = static_cast<T>(data[i] / divisor);
}

}  // namespace

void reduce_elements(ReduceOp op, DType dtype, void* out, const void* a, const void* b,
                     size_t n) {
  switch (dtype) {
    case DType::kFloat16:
      return reduce_half<half_to_float, float_to_half>(
          op, static_cast<uint16_t*>(out), static_cast<const uint16_t*>(a),
          static_cast<const uint16_t*>(b), n);
    case DType::kBFloat16:
      return reduce_half<bfloat16_to_float, float_to_bfloat16>(
          op, static_cast<uint16_t*>(out), static_cast<const uint16_t*>(a),
          static_cast<const uint16_t*>(b), n);
    case DType::kFloat32:
      return reduce_typed(op, static_cast<float*>(out), static_cast<const float*>(a),
                          static_cast<const float*>(b), n);
    case DType::kFloat64:
      return reduce_typed(op, static_cast<double*>(out), static_cast<const double*>(a),
                          static_cast<const double*>(b), n);
    case DType::kInt8:
      return reduce_typed(op, static_cast<int8_t*>(out), static_cast<const int8_t*>(a),
                          static_cast<const int8_t*>(b), n);
    case DType::kUInt8:
      return reduce_typed(op, static_cast<uint8_t*>(out), static_cast<const uint8_t*>(a),
                          static_cast<const uint8_t*>(b), n);
    case DType::kInt32:
      return reduce_typed(op, static_cast<int32_t*>(out), static_cast<const int32_t*>(a),
                          static_cast<const int32_t*>(b), n);
    case DType::kInt64:
      return reduce_typed(op, static_cast<int64_t*>(out), static_cast<const int64_t*>(a),
                          static_cast<const int64_t*>(b), n);
    case DType::kBool:
      return reduce_bool(op, static_cast<uint8_t*>(out), static_cast<const uint8_t*>(a),
                         static_cast<const uint8_t*>(b), n);
  }
}

void divide_elements(DType dtype, void* data, size_t n, int divisor) {
  switch (dtype) {
    case DType::kFloat32:
      return divide_typed(static_cast<float*>(data), n, divisor);
    case DType::kFloat64:
      return divide_typed(static_cast<double*>(data), n, divisor);
    case DType::kFloat16:
    case DType::kBFloat16: {
      const bool half = dtype == DType::kFloat16;
      auto* bits = static_cast<uint16_t*>(data);
      for (size_t i = 0; i < n; ++i) {
        const float v = (half ? half_to_float(bits[i]) : bfloat16_to_float(bits[i])) /
                        static_cast<float>(divisor);
        bits[i] = half ? float_to_half(v) : float_to_bfloat16(v);
      }
      return;
    }
    default:
      SB_ASSERT(false, "divide_elements called for {}", dtype_name(dtype));
  }
}

}  // namespace switchboard::collective
