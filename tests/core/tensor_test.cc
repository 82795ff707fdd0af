#include "core/tensor.h"

#include <dlpack/dlpack.h>

#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/core/tensor_test_util.h"

namespace {

using Catch::Contains;
using sbtest::flag_owner;
using sbtest::invalid_argument_message;
using switchboard::bfloat16_to_float;
using switchboard::Device;
using switchboard::DType;
using switchboard::dtype_name;
using switchboard::dtype_size;
using switchboard::float_to_bfloat16;
using switchboard::float_to_half;
using switchboard::half_to_float;
using switchboard::kAllDTypes;
using switchboard::parse_dtype;
using switchboard::Tensor;

float make_float(uint32_t bits) { return std::bit_cast<float>(bits); }

// ---------------------------------------------------------------------------
// DTypes

TEST_CASE("every dtype has its size and a name that parses back", "[tensor][dtype]") {
  const std::vector<std::pair<std::string, size_t>> expected = {
      {"float16", 2}, {"bfloat16", 2}, {"float32", 4}, {"float64", 8}, {"int8", 1},
      {"uint8", 1},   {"int32", 4},    {"int64", 8},   {"bool", 1},
  };
  REQUIRE(std::size(kAllDTypes) == expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    DType dtype = kAllDTypes[i];
    CHECK(dtype_name(dtype) == expected[i].first);
    CHECK(dtype_size(dtype) == expected[i].second);
    CHECK(parse_dtype(expected[i].first) == dtype);
  }
}

TEST_CASE("dtype_of maps C++ element types to dtypes", "[tensor][dtype]") {
  STATIC_REQUIRE(switchboard::dtype_of<float>() == DType::kFloat32);
  STATIC_REQUIRE(switchboard::dtype_of<double>() == DType::kFloat64);
  STATIC_REQUIRE(switchboard::dtype_of<int8_t>() == DType::kInt8);
  STATIC_REQUIRE(switchboard::dtype_of<uint8_t>() == DType::kUInt8);
  STATIC_REQUIRE(switchboard::dtype_of<int32_t>() == DType::kInt32);
  STATIC_REQUIRE(switchboard::dtype_of<int64_t>() == DType::kInt64);
  STATIC_REQUIRE(switchboard::dtype_of<bool>() == DType::kBool);
}

TEST_CASE("is_floating is true exactly for the four float dtypes", "[tensor][dtype]") {
  for (DType dtype : kAllDTypes) {
    bool floating = dtype == DType::kFloat16 || dtype == DType::kBFloat16 ||
                    dtype == DType::kFloat32 || dtype == DType::kFloat64;
    CHECK(switchboard::is_floating(dtype) == floating);
  }
}

TEST_CASE("parse_dtype refuses an unknown name, naming it and the valid ones",
          "[tensor][dtype]") {
  auto message = invalid_argument_message([] { parse_dtype("float8"); });
  CHECK_THAT(message, Contains("parse_dtype") && Contains("\"float8\"") &&
                          Contains("bfloat16") && Contains("bool"));
  CHECK_THROWS_AS(parse_dtype("torch.float32"), std::invalid_argument);
  CHECK_THROWS_AS(parse_dtype(""), std::invalid_argument);
}

TEST_CASE("an out-of-range dtype value is refused, not read past the table",
          "[tensor][dtype]") {
  auto bogus = static_cast<DType>(200);
  CHECK_THAT(invalid_argument_message([&] { dtype_size(bogus); }),
             Contains("dtype_size") && Contains("200"));
  CHECK_THROWS_AS(dtype_name(bogus), std::invalid_argument);
}

// ---------------------------------------------------------------------------
// Half and bfloat16

TEST_CASE("half conversions match known bit patterns", "[tensor][conversion]") {
  CHECK(float_to_half(1.0f) == 0x3C00);
  CHECK(half_to_float(0x3C00) == 1.0f);
  CHECK(float_to_half(-2.0f) == 0xC000);
  CHECK(half_to_float(0xC000) == -2.0f);
  CHECK(float_to_half(65504.0f) == 0x7BFF);  // largest finite half
  CHECK(half_to_float(0x7BFF) == 65504.0f);
  CHECK(float_to_half(std::ldexp(1.0f, -14)) == 0x0400);  // smallest normal
  CHECK(half_to_float(0x0400) == std::ldexp(1.0f, -14));
  CHECK(float_to_half(std::ldexp(1.0f, -24)) == 0x0001);  // smallest subnormal
  CHECK(half_to_float(0x0001) == std::ldexp(1.0f, -24));
  CHECK(half_to_float(0x03FF) == std::ldexp(1023.0f, -24));  // largest subnormal
  CHECK(float_to_half(std::ldexp(1023.0f, -24)) == 0x03FF);
  CHECK(float_to_half(0.0f) == 0x0000);
  CHECK(float_to_half(-0.0f) == 0x8000);
  CHECK(std::signbit(half_to_float(0x8000)));
  CHECK(float_to_half(0.1f) == 0x2E66);
  CHECK(float_to_half(std::numeric_limits<float>::infinity()) == 0x7C00);
  CHECK(float_to_half(-std::numeric_limits<float>::infinity()) == 0xFC00);
  CHECK(std::isinf(half_to_float(0x7C00)));
  CHECK(half_to_float(0xFC00) == -std::numeric_limits<float>::infinity());
  CHECK(float_to_half(1e10f) == 0x7C00);  // overflow -> inf
  CHECK(float_to_half(std::numeric_limits<float>::max()) == 0x7C00);
  CHECK(float_to_half(1e-10f) == 0x0000);  // underflow -> zero
  CHECK(float_to_half(-1e-10f) == 0x8000);
}

TEST_CASE("half nan stays nan in both directions", "[tensor][conversion]") {
  uint16_t half_nan = float_to_half(std::numeric_limits<float>::quiet_NaN());
  CHECK((half_nan & 0x7C00) == 0x7C00);
  CHECK((half_nan & 0x03FF) != 0);
  CHECK(std::isnan(half_to_float(0x7E00)));
  CHECK(std::isnan(half_to_float(0x7C01)));  // signaling pattern
  CHECK(std::isnan(half_to_float(0xFE00)));
  // A nan whose payload lives only in the low float bits must not become inf.
  uint16_t low_payload = float_to_half(make_float(0x7F800001));
  CHECK((low_payload & 0x7C00) == 0x7C00);
  CHECK((low_payload & 0x03FF) != 0);
}

TEST_CASE("float_to_half rounds ties to even", "[tensor][conversion]") {
  // Half spacing around 1 is 2^-10: 1 + 2^-11 is a tie between 0x3C00 (even)
  // and 0x3C01; 1 + 3 * 2^-11 is a tie between 0x3C01 and 0x3C02 (even).
  CHECK(float_to_half(1.0f + std::ldexp(1.0f, -11)) == 0x3C00);
  CHECK(float_to_half(1.0f + std::ldexp(3.0f, -11)) == 0x3C02);
  // Just above a tie rounds up, just below rounds down.
  CHECK(float_to_half(make_float(0x3F801001)) == 0x3C01);
  CHECK(float_to_half(make_float(0x3F800FFF)) == 0x3C00);
  // 65520 is the tie between 65504 (odd mantissa) and 65536: rounds to inf.
  CHECK(float_to_half(65519.0f) == 0x7BFF);
  CHECK(float_to_half(65520.0f) == 0x7C00);
  // Mantissa carry into the exponent: 2047/1024 * (1 + tiny) -> 2.0.
  CHECK(float_to_half(make_float(0x3FFFF000)) == 0x4000);
  // Subnormal ties: 2^-25 ties to 0; 3 * 2^-25 ties to 2 * 2^-24.
  CHECK(float_to_half(std::ldexp(1.0f, -25)) == 0x0000);
  CHECK(float_to_half(std::ldexp(1.5f, -25)) == 0x0001);
  CHECK(float_to_half(std::ldexp(3.0f, -25)) == 0x0002);
  CHECK(float_to_half(std::ldexp(5.0f, -25)) == 0x0002);
  // The largest subnormal plus half a step rounds up to the smallest normal.
  CHECK(float_to_half(std::ldexp(2047.0f, -25)) == 0x0400);
}

TEST_CASE("every finite half bit pattern round trips through float exactly",
          "[tensor][conversion]") {
  int mismatches = 0;
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    auto half = static_cast<uint16_t>(bits);
    float value = half_to_float(half);
    if ((half & 0x7C00) == 0x7C00 && (half & 0x03FF) != 0) {
      if (!std::isnan(value)) ++mismatches;
      continue;
    }
    if (float_to_half(value) != half) ++mismatches;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("bfloat16 conversions match known bit patterns", "[tensor][conversion]") {
  CHECK(float_to_bfloat16(1.0f) == 0x3F80);
  CHECK(bfloat16_to_float(0x3F80) == 1.0f);
  CHECK(float_to_bfloat16(-2.0f) == 0xC000);
  CHECK(bfloat16_to_float(0x7F7F) == make_float(0x7F7F0000));  // largest finite
  CHECK(float_to_bfloat16(std::numeric_limits<float>::infinity()) == 0x7F80);
  CHECK(float_to_bfloat16(-std::numeric_limits<float>::infinity()) == 0xFF80);
  CHECK(float_to_bfloat16(std::numeric_limits<float>::max()) == 0x7F80);  // rounds up
  CHECK(float_to_bfloat16(make_float(0x00010000)) == 0x0001);             // subnormal
  CHECK(bfloat16_to_float(0x0001) == make_float(0x00010000));
  CHECK(float_to_bfloat16(-0.0f) == 0x8000);
  uint16_t nan = float_to_bfloat16(std::numeric_limits<float>::quiet_NaN());
  CHECK(std::isnan(bfloat16_to_float(nan)));
  // A nan with only low payload bits must stay nan, not truncate to inf.
  CHECK(std::isnan(bfloat16_to_float(float_to_bfloat16(make_float(0x7F800001)))));
}

TEST_CASE("float_to_bfloat16 rounds ties to even", "[tensor][conversion]") {
  CHECK(float_to_bfloat16(make_float(0x3F808000)) == 0x3F80);  // tie, even below
  CHECK(float_to_bfloat16(make_float(0x3F818000)) == 0x3F82);  // tie, even above
  CHECK(float_to_bfloat16(make_float(0x3F808001)) == 0x3F81);  // above the tie
  CHECK(float_to_bfloat16(make_float(0x3F807FFF)) == 0x3F80);  // below the tie
  CHECK(float_to_bfloat16(make_float(0x3FFF8000)) == 0x4000);  // carry to exponent
}

TEST_CASE("every non-nan bfloat16 bit pattern round trips through float exactly",
          "[tensor][conversion]") {
  int mismatches = 0;
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    auto bf16 = static_cast<uint16_t>(bits);
    float value = bfloat16_to_float(bf16);
    if (std::isnan(value)) {
      if (!std::isnan(bfloat16_to_float(float_to_bfloat16(value)))) ++mismatches;
      continue;
    }
    if (float_to_bfloat16(value) != bf16) ++mismatches;
  }
  CHECK(mismatches == 0);
}

// ---------------------------------------------------------------------------
// Devices and the allocator registry

TEST_CASE("Device::parse accepts cpu, cuda and cuda:N and str() renders them",
          "[tensor][device]") {
  CHECK(Device::parse("cpu") == Device::cpu());
  CHECK(Device::parse("cuda") == Device::cuda(0));
  CHECK(Device::parse("cuda:0") == Device::cuda(0));
  CHECK(Device::parse("cuda:7") == Device::cuda(7));
  CHECK(Device::parse("cuda:12").index == 12);
  CHECK(Device::cpu().str() == "cpu");
  CHECK(Device::cuda(3).str() == "cuda:3");
  CHECK(Device::parse(Device::cuda(5).str()) == Device::cuda(5));
  CHECK(Device::cpu().is_cpu());
  CHECK(Device::cuda(0).is_cuda());
}

TEST_CASE("Device::parse refuses malformed text, naming it", "[tensor][device]") {
  for (const char* text : {"gpu", "cuda:", "cuda:-1", "cuda:1x", "cuda:+1", "CPU",
                           "cuda:99999999999", " cpu", ""}) {
    CAPTURE(text);
    CHECK_THAT(invalid_argument_message([&] { Device::parse(text); }),
               Contains("Device::parse") && Contains(std::string("\"") + text + "\""));
  }
}

TEST_CASE("Tensor::empty on cuda without an allocator throws saying what to link",
          "[tensor][device]") {
  switchboard::set_device_allocator(nullptr);
  CHECK_FALSE(switchboard::has_device_allocator());
  CHECK_THAT(invalid_argument_message(
                 [] { Tensor::empty({2}, DType::kFloat32, Device::cuda(0)); }),
             Contains("no allocator for cuda:0 (link //core:cuda_allocator)"));
  CHECK_THAT(invalid_argument_message(
                 [] { Tensor::empty({2}, DType::kFloat32, Device::cuda(2)); }),
             Contains("no allocator for cuda:2"));
}

TEST_CASE("a registered allocator serves cuda tensors until it is removed",
          "[tensor][device]") {
  // A CPU malloc pretending to be CUDA.
  std::vector<std::pair<size_t, Device>> calls;
  switchboard::set_device_allocator([&calls](size_t nbytes, Device device) {
    calls.emplace_back(nbytes, device);
    return std::shared_ptr<void>(std::malloc(nbytes == 0 ? 1 : nbytes), std::free);
  });
  CHECK(switchboard::has_device_allocator());

  Tensor t = Tensor::empty({2, 3}, DType::kFloat64, Device::cuda(1));
  CHECK(t.device() == Device::cuda(1));
  CHECK(t.device().str() == "cuda:1");
  CHECK(t.describe() == "float64[2, 3] on cuda:1");
  CHECK(t.nbytes() == 48);
  CHECK(t.storage()->nbytes() == 48);
  CHECK(t.data() != nullptr);
  REQUIRE(calls.size() == 1);
  CHECK(calls[0].first == 48);
  CHECK(calls[0].second == Device::cuda(1));

  // CPU-only operations refuse it, naming the device.
  CHECK_THAT(invalid_argument_message([&] { t.clone(); }), Contains("cuda:1"));
  CHECK_THAT(invalid_argument_message([&] { t.span<double>(); }),
             Contains("Tensor::span") && Contains("cuda:1"));

  switchboard::set_device_allocator(nullptr);
  CHECK_FALSE(switchboard::has_device_allocator());
  CHECK_THROWS_AS(Tensor::empty({1}, DType::kFloat32, Device::cuda(1)),
                  std::invalid_argument);
  // The tensor allocated earlier still owns its storage.
  CHECK(t.nbytes() == 48);
}

TEST_CASE("the allocator registry can be used from several threads at once",
          "[tensor][device]") {
  auto allocator = [](size_t nbytes, Device) {
    return std::shared_ptr<void>(std::malloc(nbytes == 0 ? 1 : nbytes), std::free);
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      for (int round = 0; round < 500; ++round) {
        if (i % 2 == 0) {
          switchboard::set_device_allocator(allocator);
        } else {
          (void)switchboard::has_device_allocator();
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(switchboard::has_device_allocator());
  switchboard::set_device_allocator(nullptr);
  CHECK_FALSE(switchboard::has_device_allocator());
}

// ---------------------------------------------------------------------------
// Shapes

TEST_CASE("numel_of multiplies extents and refuses negative ones and overflow",
          "[tensor][shape]") {
  CHECK(Tensor::numel_of({}) == 1);
  CHECK(Tensor::numel_of({2, 3, 4}) == 24);
  CHECK(Tensor::numel_of({5, 0, 7}) == 0);
  CHECK_THAT(invalid_argument_message([] {
               Tensor::numel_of({2, -3});
             }),
             Contains("-3") && Contains("[2, -3]"));
  CHECK_THAT(invalid_argument_message([] {
               Tensor::numel_of({int64_t{1} << 40, int64_t{1} << 40});
             }),
             Contains("overflow"));
  CHECK_THROWS_AS(Tensor::empty({-1}, DType::kFloat32), std::invalid_argument);
  // Fits int64 elements but not size_t bytes.
  CHECK_THROWS_AS(Tensor::empty({int64_t{1} << 62}, DType::kFloat64),
                  std::invalid_argument);
}

TEST_CASE("contiguous_strides are row-major and treat empty dimensions as 1",
          "[tensor][shape]") {
  CHECK(Tensor::contiguous_strides({}).empty());
  CHECK(Tensor::contiguous_strides({5}) == Tensor::Shape{1});
  CHECK(Tensor::contiguous_strides({2, 3, 4}) == Tensor::Shape{12, 4, 1});
  CHECK(Tensor::contiguous_strides({2, 0, 3}) == Tensor::Shape{3, 3, 1});
}

TEST_CASE("shape_str and describe render shapes, dtypes and devices", "[tensor][shape]") {
  CHECK(switchboard::shape_str({}) == "[]");
  CHECK(switchboard::shape_str({2, 3}) == "[2, 3]");
  CHECK(Tensor::empty({2, 3}, DType::kFloat32).describe() == "float32[2, 3] on cpu");
  CHECK(Tensor::empty({}, DType::kBool).describe() == "bool[] on cpu");
  CHECK(Tensor().describe() == "undefined tensor");
}

TEST_CASE("empty allocates contiguous 64-byte aligned CPU storage", "[tensor]") {
  for (DType dtype : kAllDTypes) {
    CAPTURE(dtype_name(dtype));
    Tensor t = Tensor::empty({3, 5}, dtype);
    CHECK(t.defined());
    CHECK(t.dtype() == dtype);
    CHECK(t.shape() == Tensor::Shape{3, 5});
    CHECK(t.strides() == Tensor::Shape{5, 1});
    CHECK(t.dim() == 2);
    CHECK(t.numel() == 15);
    CHECK(t.element_size() == dtype_size(dtype));
    CHECK(t.nbytes() == 15 * dtype_size(dtype));
    CHECK(t.storage()->nbytes() == t.nbytes());
    CHECK(t.storage_offset_bytes() == 0);
    CHECK(t.is_contiguous());
    CHECK(t.device() == Device::cpu());
    CHECK(reinterpret_cast<uintptr_t>(t.data()) % 64 == 0);
  }
}

TEST_CASE("zeros fills every byte with zero", "[tensor]") {
  Tensor t = Tensor::zeros({4, 4}, DType::kInt64);
  for (int64_t v : t.span<int64_t>()) CHECK(v == 0);
  Tensor h = Tensor::zeros({3}, DType::kFloat16);
  for (uint16_t v : h.span<uint16_t>()) CHECK(v == 0);
}

TEST_CASE("zero-element tensors work everywhere", "[tensor][shape]") {
  for (const Tensor::Shape& shape :
       {Tensor::Shape{0}, Tensor::Shape{2, 0, 3}, Tensor::Shape{0, 4}}) {
    CAPTURE(switchboard::shape_str(shape));
    Tensor t = Tensor::zeros(shape, DType::kFloat32);
    CHECK(t.numel() == 0);
    CHECK(t.nbytes() == 0);
    CHECK(t.storage()->nbytes() == 0);
    CHECK(t.is_contiguous());
    CHECK(t.span<float>().empty());
    CHECK(t.to_vector<float>().empty());
    Tensor copy = t.clone();
    CHECK(copy.shape() == shape);
    CHECK(copy.equal(t));
    CHECK(t.reshape({0}).numel() == 0);
    copy.copy_from(t);
    CHECK(t.narrow0(0, 0).numel() == 0);

    DLManagedTensor* managed = t.to_dlpack();
    Tensor back = Tensor::from_dlpack(managed);
    CHECK(back.shape() == shape);
    CHECK(back.numel() == 0);
    CHECK(back.equal(t));
  }
  Tensor rows = Tensor::empty({4, 2}, DType::kInt32);
  CHECK(rows.narrow0(4, 0).shape() == Tensor::Shape{0, 2});
  CHECK(Tensor::from_vector(std::vector<float>{}).shape() == Tensor::Shape{0});
  Tensor blob =
      Tensor::from_blob(nullptr, {0, 3}, DType::kFloat64, Device::cpu(), nullptr);
  CHECK(blob.numel() == 0);
  CHECK(blob.storage()->nbytes() == 0);
}

TEST_CASE("a 0-dim tensor is a scalar with one element", "[tensor][shape]") {
  Tensor t = Tensor::empty({}, DType::kFloat64);
  CHECK(t.dim() == 0);
  CHECK(t.numel() == 1);
  CHECK(t.nbytes() == 8);
  CHECK(t.strides().empty());
  CHECK(t.is_contiguous());
  t.span<double>()[0] = 2.5;
  CHECK(t.clone().to_vector<double>() == std::vector<double>{2.5});
  CHECK(t.reshape({1, 1}).to_vector<double>() == std::vector<double>{2.5});
  CHECK(Tensor::from_vector(std::vector<int32_t>{7}, {}).shape() == Tensor::Shape{1});
  CHECK_THAT(invalid_argument_message([&] { t.narrow0(0, 1); }),
             Contains("Tensor::narrow0") && Contains("float64[] on cpu"));
  Tensor scalar = Tensor::from_vector(std::vector<int64_t>{9}).reshape({});
  CHECK(scalar.dim() == 0);
  Tensor back = Tensor::from_dlpack(scalar.to_dlpack());
  CHECK(back.dim() == 0);
  CHECK(back.to_vector<int64_t>() == std::vector<int64_t>{9});
}

TEST_CASE("is_contiguous ignores the strides of size-1 dimensions", "[tensor][shape]") {
  std::vector<float> bytes(64);
  auto make = [&](Tensor::Shape shape, Tensor::Shape strides) {
    return Tensor::from_blob(bytes.data(), shape, DType::kFloat32, Device::cpu(), nullptr,
                             strides);
  };
  CHECK(make({2, 3}, {3, 1}).is_contiguous());
  CHECK_FALSE(make({2, 3}, {1, 2}).is_contiguous());
  CHECK(make({1, 3}, {99, 1}).is_contiguous());
  CHECK(make({3, 1}, {1, 7}).is_contiguous());
  CHECK(make({1}, {5}).is_contiguous());
  CHECK_FALSE(make({3}, {2}).is_contiguous());
  CHECK(make({0, 3}, {7, 7}).is_contiguous());  // empty: always contiguous
}

// ---------------------------------------------------------------------------
// Aliasing and borrowed storage

TEST_CASE("copies of a tensor alias the same storage", "[tensor][aliasing]") {
  Tensor a = Tensor::from_vector(std::vector<int32_t>{1, 2, 3, 4});
  Tensor b = a;
  CHECK(b.storage() == a.storage());
  CHECK(b.data() == a.data());
  b.span<int32_t>()[2] = 30;
  CHECK(a.to_vector<int32_t>() == std::vector<int32_t>{1, 2, 30, 4});

  Tensor view = a.reshape({2, 2});
  CHECK(view.storage() == a.storage());
  view.span<int32_t>()[0] = 10;
  CHECK(a.to_vector<int32_t>()[0] == 10);

  Tensor copy = a.clone();
  CHECK(copy.storage() != a.storage());
  copy.span<int32_t>()[1] = -1;
  CHECK(a.to_vector<int32_t>()[1] == 2);
  CHECK(copy.equal(Tensor::from_vector(std::vector<int32_t>{10, -1, 30, 4})));
}

TEST_CASE("from_blob borrows bytes and keeps the owner alive until the last tensor dies",
          "[tensor][aliasing]") {
  std::vector<float> values = {1, 2, 3, 4, 5, 6};
  bool released = false;
  {
    Tensor outer;
    {
      Tensor t = Tensor::from_blob(values.data(), {2, 3}, DType::kFloat32, Device::cpu(),
                                   flag_owner(&released));
      CHECK(t.data() == values.data());  // no copy
      CHECK(t.strides() == Tensor::Shape{3, 1});
      CHECK(t.to_vector<float>() == values);
      values[4] = 50;
      CHECK(t.to_vector<float>()[4] == 50);
      outer = t.narrow0(1, 1);
      Tensor another = t;
    }
    CHECK_FALSE(released);  // `outer` still holds the storage
    CHECK(outer.to_vector<float>() == std::vector<float>{4, 50, 6});
  }
  CHECK(released);
}

TEST_CASE("from_blob sizes its storage from the view extent", "[tensor][aliasing]") {
  std::vector<int64_t> bytes(100);
  auto blob = [&](Tensor::Shape shape, Tensor::Shape strides) {
    return Tensor::from_blob(bytes.data(), shape, DType::kInt64, Device::cpu(), nullptr,
                             strides);
  };
  CHECK(blob({2, 3}, {}).storage()->nbytes() == 6 * 8);
  // Last element at offset 1 * 10 + 2 * 3 = 16 elements.
  CHECK(blob({2, 3}, {10, 3}).storage()->nbytes() == 17 * 8);
  CHECK(blob({}, {}).storage()->nbytes() == 8);
  CHECK_THAT(invalid_argument_message([&] {
               blob({2, 3}, {1});
             }),
             Contains("Tensor::from_blob") && Contains("[1]") && Contains("[2, 3]"));
  CHECK_THAT(invalid_argument_message([&] {
               blob({2, 3}, {3, -1});
             }),
             Contains("negative strides [3, -1]"));
  CHECK_THROWS_AS(Tensor::from_blob(nullptr, {2}, DType::kInt64, Device::cpu(), nullptr),
                  std::invalid_argument);
}

TEST_CASE("clone of a strided view is a contiguous copy in row-major order",
          "[tensor][aliasing]") {
  std::vector<int32_t> values = {0, 1, 2, 3, 4, 5};
  // The transpose of a 2x3 row-major matrix.
  Tensor t = Tensor::from_blob(values.data(), {3, 2}, DType::kInt32, Device::cpu(),
                               nullptr, {1, 3});
  CHECK_FALSE(t.is_contiguous());
  Tensor c = t.clone();
  CHECK(c.is_contiguous());
  CHECK(c.strides() == Tensor::Shape{2, 1});
  CHECK(c.to_vector<int32_t>() == std::vector<int32_t>{0, 3, 1, 4, 2, 5});
}

// ---------------------------------------------------------------------------
// Views, copies and comparisons

TEST_CASE("reshape views the same bytes and names both shapes when counts differ",
          "[tensor][shape]") {
  Tensor t = Tensor::from_vector(std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 8}, {3, 3});
  Tensor r = t.reshape({9});
  CHECK(r.data() == t.data());
  CHECK(r.strides() == Tensor::Shape{1});
  CHECK(t.reshape({1, 9, 1}).shape() == Tensor::Shape{1, 9, 1});
  CHECK(invalid_argument_message([&] {
          t.reshape({2, 4});
        }) == "Tensor::reshape: shape [2, 4] has 8 elements, tensor float32[3, 3] has 9");
  CHECK_THROWS_AS(t.reshape({-1, 9}), std::invalid_argument);
  std::vector<float> bytes(9);
  Tensor strided = Tensor::from_blob(bytes.data(), {3, 3}, DType::kFloat32, Device::cpu(),
                                     nullptr, {1, 3});
  CHECK_THAT(invalid_argument_message([&] { strided.reshape({9}); }),
             Contains("contiguous") && Contains("[1, 3]"));
}

TEST_CASE("narrow0 views a range of rows with a byte offset", "[tensor][shape]") {
  Tensor t = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}, {4, 2});
  Tensor rows = t.narrow0(1, 2);
  CHECK(rows.shape() == Tensor::Shape{2, 2});
  CHECK(rows.storage() == t.storage());
  CHECK(rows.storage_offset_bytes() == 2 * 8);
  CHECK(rows.data() == static_cast<char*>(t.data()) + 16);
  CHECK(rows.to_vector<int64_t>() == std::vector<int64_t>{2, 3, 4, 5});
  Tensor nested = rows.narrow0(1, 1);
  CHECK(nested.storage_offset_bytes() == 4 * 8);
  CHECK(nested.to_vector<int64_t>() == std::vector<int64_t>{4, 5});
  CHECK(t.narrow0(0, 4).to_vector<int64_t>() == t.to_vector<int64_t>());

  CHECK_THAT(invalid_argument_message([&] { t.narrow0(3, 2); }),
             Contains("Tensor::narrow0") && Contains("3") && Contains("int64[4, 2]"));
  CHECK_THROWS_AS(t.narrow0(-1, 1), std::invalid_argument);
  CHECK_THROWS_AS(t.narrow0(0, -1), std::invalid_argument);
  CHECK_THROWS_AS(t.narrow0(5, 0), std::invalid_argument);
}

TEST_CASE("copy_from copies the bytes of a tensor of equal dtype and numel", "[tensor]") {
  Tensor src = Tensor::from_vector(std::vector<double>{1.5, 2.5, 3.5, 4.5});
  Tensor dst = Tensor::zeros({2, 2}, DType::kFloat64);
  dst.copy_from(src);
  CHECK(dst.to_vector<double>() == src.to_vector<double>());
  CHECK(dst.storage() != src.storage());

  Tensor wrong_type = Tensor::zeros({4}, DType::kFloat32);
  CHECK_THAT(invalid_argument_message([&] { wrong_type.copy_from(src); }),
             Contains("Tensor::copy_from") && Contains("float64[4] on cpu") &&
                 Contains("float32[4] on cpu"));
  Tensor wrong_size = Tensor::zeros({3}, DType::kFloat64);
  CHECK_THROWS_AS(wrong_size.copy_from(src), std::invalid_argument);
  CHECK_THROWS_AS(dst.copy_from(Tensor()), std::invalid_argument);
}

TEST_CASE("equal compares dtype, shape and element values", "[tensor]") {
  Tensor a = Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2});
  CHECK(a.equal(a.clone()));
  CHECK_FALSE(a.equal(a.reshape({4})));
  CHECK_FALSE(a.equal(Tensor::from_vector(std::vector<double>{1, 2, 3, 4}, {2, 2})));
  CHECK_FALSE(a.equal(Tensor::from_vector(std::vector<float>{1, 2, 3, 5}, {2, 2})));
  // Floats compare by value, as torch.equal does.
  float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor with_nan = Tensor::from_vector(std::vector<float>{nan});
  CHECK_FALSE(with_nan.equal(with_nan));
  CHECK(Tensor::from_vector(std::vector<float>{0.0f})
            .equal(Tensor::from_vector(std::vector<float>{-0.0f})));
  Tensor h1 = Tensor::empty({2}, DType::kFloat16);
  Tensor h2 = Tensor::empty({2}, DType::kFloat16);
  h1.span<uint16_t>()[0] = h2.span<uint16_t>()[0] = float_to_half(1.0f);
  h1.span<uint16_t>()[1] = float_to_half(0.0f);
  h2.span<uint16_t>()[1] = float_to_half(-0.0f);
  CHECK(h1.equal(h2));
  Tensor b1 = Tensor::from_vector(std::vector<uint8_t>{0, 1});
  CHECK(b1.equal(Tensor::from_vector(std::vector<uint8_t>{0, 1})));
}

TEST_CASE("span and to_vector check the element type against the dtype", "[tensor]") {
  Tensor f = Tensor::from_vector(std::vector<float>{1, 2});
  CHECK_THAT(invalid_argument_message([&] { f.span<int32_t>(); }),
             Contains("Tensor::data_as") && Contains("int32") && Contains("float32[2]"));
  CHECK_THAT(invalid_argument_message([&] { f.span<uint16_t>(); }),
             Contains("2-byte") && Contains("float32[2]"));
  Tensor bf = Tensor::empty({2}, DType::kBFloat16);
  CHECK(bf.span<uint16_t>().size() == 2);
  Tensor flags = Tensor::empty({3}, DType::kBool);
  CHECK(flags.span<uint8_t>().size() == 3);  // uint8_t reads bool bytes
  CHECK(flags.span<bool>().size() == 3);
  CHECK_THROWS_AS(Tensor::empty({1}, DType::kInt8).span<uint8_t>(),
                  std::invalid_argument);
}

TEST_CASE("from_vector refuses a shape whose element count differs", "[tensor]") {
  CHECK(Tensor::from_vector(std::vector<int8_t>{1, 2, 3, 4, 5, 6}, {2, 3}).shape() ==
        Tensor::Shape{2, 3});
  CHECK(invalid_argument_message([] {
          Tensor::from_vector(std::vector<float>{1, 2, 3}, {2, 2});
        }) == "Tensor::from_vector: shape [2, 2] has 4 elements, got 3 values");
}

TEST_CASE("an undefined tensor throws from every accessor but defined and describe",
          "[tensor]") {
  Tensor t;
  CHECK_FALSE(t.defined());
  CHECK(t.describe() == "undefined tensor");
  CHECK_THAT(invalid_argument_message([&] { t.dtype(); }),
             Contains("Tensor::dtype: undefined tensor"));
  CHECK_THROWS_AS(t.shape(), std::invalid_argument);
  CHECK_THROWS_AS(t.strides(), std::invalid_argument);
  CHECK_THROWS_AS(t.dim(), std::invalid_argument);
  CHECK_THROWS_AS(t.device(), std::invalid_argument);
  CHECK_THROWS_AS(t.numel(), std::invalid_argument);
  CHECK_THROWS_AS(t.element_size(), std::invalid_argument);
  CHECK_THROWS_AS(t.nbytes(), std::invalid_argument);
  CHECK_THROWS_AS(t.is_contiguous(), std::invalid_argument);
  CHECK_THROWS_AS(t.data(), std::invalid_argument);
  CHECK_THROWS_AS(t.storage(), std::invalid_argument);
  CHECK_THROWS_AS(t.storage_offset_bytes(), std::invalid_argument);
  CHECK_THROWS_AS(t.clone(), std::invalid_argument);
  CHECK_THROWS_AS(t.reshape({1}), std::invalid_argument);
  CHECK_THROWS_AS(t.narrow0(0, 0), std::invalid_argument);
  CHECK_THROWS_AS(t.span<float>(), std::invalid_argument);
  CHECK_THROWS_AS(t.to_dlpack(), std::invalid_argument);
  CHECK_THROWS_AS(t.equal(t), std::invalid_argument);
}

}  // namespace

TEST_CASE("a zero-element shape whose strides overflow is refused, not wrapped",
          "[tensor][shape]") {
  // numel is 0, but the contiguous strides multiply the other extents.
  const int64_t huge = int64_t{1} << 40;
  CHECK_THROWS_WITH(Tensor::empty({0, huge, huge}, DType::kFloat32),
                    Catch::Contains("overflow"));
  CHECK_THROWS_AS(Tensor::contiguous_strides({2, huge, huge}), std::invalid_argument);
  // Large but representable strides are fine.
  CHECK(Tensor::contiguous_strides({0, int64_t{1} << 31, int64_t{1} << 31}) ==
        Tensor::Shape{int64_t{1} << 62, int64_t{1} << 31, 1});
}

TEST_CASE("Tensor::to copies to the CPU without hooks and through the registered copier "
          "for devices",
          "[tensor][device]") {
  using switchboard::set_device_allocator;
  using switchboard::set_device_copier;
  using switchboard::set_device_counter;
  const Tensor cpu = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3});
  // CPU to CPU: a copy with its own storage.
  Tensor copy = cpu.to(Device::cpu());
  CHECK(copy.equal(cpu));
  CHECK(copy.data() != cpu.data());
  copy.span<float>()[0] = 9;
  CHECK(cpu.span<float>()[0] == 1);
  // No copier registered: the error names both devices and what to link.
  CHECK(switchboard::registered_cuda_device_count() == 0);
  CHECK_THAT(invalid_argument_message([&] { cpu.to(Device::cuda(0)); }),
             Contains("float32[3] on cpu") && Contains("cuda:0") &&
                 Contains("//core:cuda_allocator"));
  // A stand-in runtime: host memory tagged as cuda, copies counted.
  int copies = 0;
  set_device_allocator([](size_t nbytes, Device) {
    return std::shared_ptr<void>(std::malloc(nbytes == 0 ? 1 : nbytes), std::free);
  });
  set_device_copier([&copies](const Tensor& dst, const Tensor& src) {
    ++copies;
    std::memcpy(dst.data(), src.data(), src.nbytes());
  });
  set_device_counter([] { return 3; });
  CHECK(switchboard::has_device_copier());
  CHECK(switchboard::registered_cuda_device_count() == 3);
  const Tensor on_device = cpu.to(Device::cuda(2));
  CHECK(on_device.device() == Device::cuda(2));
  CHECK(on_device.shape() == cpu.shape());
  const Tensor back = on_device.to(Device::cpu());
  CHECK(back.device() == Device::cpu());
  CHECK(back.equal(cpu));
  CHECK(copies == 2);
  // A counter that throws counts as none.
  set_device_counter([]() -> int { throw std::runtime_error("driver gone"); });
  CHECK(switchboard::registered_cuda_device_count() == 0);
  set_device_counter(nullptr);
  set_device_copier(nullptr);
  set_device_allocator(nullptr);
  CHECK_FALSE(switchboard::has_device_copier());
  CHECK(switchboard::registered_cuda_device_count() == 0);
}

// Regression: span<const T>() named dtype_of<const T>, which is declared
// but never defined, so reading a tensor through a const span failed to
// link.
TEST_CASE("span<const T> reads a tensor of T and refuses other dtypes", "[tensor]") {
  const Tensor t = Tensor::from_vector(std::vector<float>{1.5f, 2.5f});
  const std::span<const float> values = t.span<const float>();
  REQUIRE(values.size() == 2);
  CHECK(values[1] == 2.5f);
  CHECK_THROWS_AS(t.span<const int32_t>(), std::invalid_argument);
}
