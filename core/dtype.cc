// DTypes (core/tensor.h): the table of names, sizes and kinds, parsing, and
// the float16 and bfloat16 conversions.
#include <bit>
#include <cstring>
#include <iterator>

#include "common/check.h"
#include "core/tensor.h"
#include "core/tensor_internal.h"

namespace switchboard {
namespace {

struct DTypeInfo {
  std::string_view name;
  size_t size;
  bool floating;
};

// Indexed by the enum's value; keep in declaration order.
constexpr DTypeInfo kDTypeInfo[] = {
    {"float16", 2, true}, {"bfloat16", 2, true}, {"float32", 4, true},
    {"float64", 8, true}, {"int8", 1, false},    {"uint8", 1, false},
    {"int32", 4, false},  {"int64", 8, false},   {"bool", 1, false},
};
static_assert(std::size(kDTypeInfo) == std::size(kAllDTypes));

const DTypeInfo& dtype_info(DType dtype, const char* what) {
  auto index = static_cast<size_t>(dtype);
  SB_REQUIRE(index < std::size(kDTypeInfo), "{}: invalid dtype value {}", what, index);
  return kDTypeInfo[index];
}

}  // namespace

size_t tensor_internal::element_size(DType dtype, const char* what) {
  return dtype_info(dtype, what).size;
}

// ---------------------------------------------------------------------------
// DTypes and conversions

size_t dtype_size(DType dtype) { return dtype_info(dtype, "dtype_size").size; }

std::string_view dtype_name(DType dtype) { return dtype_info(dtype, "dtype_name").name; }

bool is_floating(DType dtype) { return dtype_info(dtype, "is_floating").floating; }

DType parse_dtype(std::string_view name) {
  for (DType dtype : kAllDTypes) {
    if (dtype_name(dtype) == name) return dtype;
  }
  std::vector<std::string_view> names;
  for (DType dtype : kAllDTypes) names.push_back(dtype_name(dtype));
  SB_REQUIRE(false, "parse_dtype: unknown dtype \"{}\" (expected one of {})", name,
             fmt::join(names, ", "));
  return DType::kFloat32;  // unreachable
}

float half_to_float(uint16_t bits) {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1Fu;
  uint32_t mantissa = bits & 0x3FFu;
  uint32_t out = 0;
  if (exponent == 0x1F) {  // inf or nan (payload kept)
    out = sign | 0x7F800000u | (mantissa << 13);
  } else if (exponent != 0) {  // normal: rebias 15 -> 127
    out = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {  // signed zero
    out = sign;
  } else {             // subnormal: value = mantissa * 2^-24; normalize
    uint32_t e = 113;  // biased float exponent of 2^-14
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --e;
    }
    out = sign | (e << 23) | ((mantissa & 0x3FFu) << 13);
  }
  return std::bit_cast<float>(out);
}

uint16_t float_to_half(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) {  // nan: keep the top payload bits, force quiet
    return static_cast<uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));
  }
  // 65520 (0x477FF000) is halfway between 65504 and 2^16 and rounds to even,
  // i.e. up to infinity; so does everything above it.
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);
  uint32_t half = 0;
  if (abs >= 0x38800000u) {                 // normal half: >= 2^-14
    uint32_t rebiased = abs - 0x38000000u;  // exponent 127 -> 15
    half = rebiased >> 13;
    uint32_t rest = rebiased & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // may carry
  } else if (abs > 0x33000000u) {  // subnormal half: > 2^-25 (2^-25 ties to 0)
    uint32_t mantissa = (abs & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 126 - (abs >> 23);  // 14..24: units of 2^-24
    half = mantissa >> shift;
    uint32_t rest = mantissa & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
  }
  return static_cast<uint16_t>(sign | half);
}

float bfloat16_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

uint16_t float_to_bfloat16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {  // nan: truncate, force quiet
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  // Round to nearest even; a carry out of the mantissa bumps the exponent,
  // which turns values past the largest bfloat16 into infinity.
  uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

}  // namespace switchboard
