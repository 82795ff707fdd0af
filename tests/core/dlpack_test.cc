// DLPack import and export of Tensor (split from tensor_test.cc).
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

#include "core/tensor.h"
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

// ---------------------------------------------------------------------------
// DLPack

// Wraps the deleter of exported tensors to count its calls.
int g_export_deleter_calls = 0;
void (*g_export_deleter)(DLManagedTensor*) = nullptr;

void counting_deleter(DLManagedTensor* self) {
  ++g_export_deleter_calls;
  g_export_deleter(self);
}

DLManagedTensor* spy_on(DLManagedTensor* managed) {
  g_export_deleter = managed->deleter;
  managed->deleter = counting_deleter;
  g_export_deleter_calls = 0;
  return managed;
}

TEST_CASE("to_dlpack describes the view with the storage base and a byte offset",
          "[tensor][dlpack]") {
  Tensor t = Tensor::from_vector(std::vector<int32_t>{0, 1, 2, 3, 4, 5}, {3, 2});
  Tensor rows = t.narrow0(1, 2);
  DLManagedTensor* managed = rows.to_dlpack();
  const DLTensor& dl = managed->dl_tensor;
  CHECK(dl.data == t.data());
  CHECK(dl.byte_offset == 8);
  CHECK(static_cast<char*>(dl.data) + dl.byte_offset == rows.data());
  CHECK(dl.device.device_type == kDLCPU);
  CHECK(dl.device.device_id == 0);
  CHECK(dl.ndim == 2);
  CHECK(dl.dtype.code == kDLInt);
  CHECK(dl.dtype.bits == 32);
  CHECK(dl.dtype.lanes == 1);
  CHECK(std::vector<int64_t>(dl.shape, dl.shape + 2) == std::vector<int64_t>{2, 2});
  REQUIRE(dl.strides != nullptr);
  CHECK(std::vector<int64_t>(dl.strides, dl.strides + 2) == std::vector<int64_t>{2, 1});
  managed->deleter(managed);
}

TEST_CASE("to_dlpack keeps the storage alive until its deleter runs",
          "[tensor][dlpack]") {
  bool released = false;
  std::vector<float> values = {1, 2};
  DLManagedTensor* managed = nullptr;
  {
    Tensor t = Tensor::from_blob(values.data(), {2}, DType::kFloat32, Device::cpu(),
                                 flag_owner(&released));
    managed = t.to_dlpack();
  }
  CHECK_FALSE(released);
  CHECK(static_cast<float*>(managed->dl_tensor.data)[1] == 2);
  managed->deleter(managed);
  CHECK(released);
}

TEST_CASE("dlpack round trips every dtype without copying, offsets included",
          "[tensor][dlpack]") {
  const std::vector<std::pair<uint8_t, uint8_t>> codes = {
      {kDLFloat, 16}, {kDLBfloat, 16}, {kDLFloat, 32}, {kDLFloat, 64}, {kDLInt, 8},
      {kDLUInt, 8},   {kDLInt, 32},    {kDLInt, 64},   {6, 8},  // 6 = kDLBool
  };
  for (size_t i = 0; i < std::size(kAllDTypes); ++i) {
    DType dtype = kAllDTypes[i];
    CAPTURE(dtype_name(dtype));
    {
      Tensor original;
      {
        Tensor full = Tensor::zeros({5, 3}, dtype);
        std::memset(full.data(), 1, full.nbytes());
        original = full.narrow0(2, 3);
      }
      std::weak_ptr<switchboard::Storage> storage = original.storage();
      DLManagedTensor* managed = spy_on(original.to_dlpack());
      CHECK(managed->dl_tensor.dtype.code == codes[i].first);
      CHECK(managed->dl_tensor.dtype.bits == codes[i].second);
      CHECK(managed->dl_tensor.byte_offset == 6 * dtype_size(dtype));

      Tensor imported = Tensor::from_dlpack(managed);
      CHECK(imported.data() == original.data());  // no copy
      CHECK(imported.dtype() == dtype);
      CHECK(imported.shape() == original.shape());
      CHECK(imported.strides() == original.strides());
      CHECK(imported.storage_offset_bytes() == original.storage_offset_bytes());
      CHECK(imported.device() == Device::cpu());
      CHECK(imported.is_contiguous());
      CHECK(imported.equal(original));

      original = Tensor();  // only the DLPack export holds the storage now
      CHECK_FALSE(storage.expired());
      Tensor alias = imported.narrow0(1, 1);
      imported = Tensor();
      CHECK(g_export_deleter_calls == 0);
      CHECK_FALSE(storage.expired());
      alias = Tensor();
      CHECK(g_export_deleter_calls == 1);
      CHECK(storage.expired());
    }
    CHECK(g_export_deleter_calls == 1);
  }
}

// A DLManagedTensor built by hand, as another framework would export it.
struct HandBuilt {
  std::vector<float> values = {0, 1, 2, 3, 4, 5};
  int64_t shape[2] = {3, 2};
  int64_t strides[2] = {1, 3};  // a transposed 2x3 matrix
  int deleter_calls = 0;
  DLManagedTensor managed{};

  HandBuilt() {
    DLTensor& dl = managed.dl_tensor;
    dl.data = values.data();
    dl.device = {kDLCPU, 0};
    dl.ndim = 2;
    dl.dtype = {kDLFloat, 32, 1};
    dl.shape = shape;
    dl.strides = strides;
    dl.byte_offset = 0;
    managed.manager_ctx = &deleter_calls;
    managed.deleter = [](DLManagedTensor* self) {
      ++*static_cast<int*>(self->manager_ctx);
    };
  }
};

TEST_CASE("from_dlpack imports a strided view as a non-contiguous tensor",
          "[tensor][dlpack]") {
  HandBuilt hand;
  {
    Tensor t = Tensor::from_dlpack(&hand.managed);
    CHECK(t.data() == hand.values.data());
    CHECK(t.shape() == Tensor::Shape{3, 2});
    CHECK(t.strides() == Tensor::Shape{1, 3});
    CHECK_FALSE(t.is_contiguous());
    CHECK(t.storage()->nbytes() == 6 * sizeof(float));
    CHECK(t.clone().to_vector<float>() == std::vector<float>{0, 3, 1, 4, 2, 5});
    CHECK_THAT(invalid_argument_message([&] { t.span<float>(); }),
               Contains("Tensor::span") && Contains("contiguous") && Contains("[1, 3]"));
    CHECK(hand.deleter_calls == 0);
  }
  CHECK(hand.deleter_calls == 1);
}

TEST_CASE("from_dlpack treats null strides as contiguous and honours byte_offset",
          "[tensor][dlpack]") {
  HandBuilt hand;
  hand.managed.dl_tensor.strides = nullptr;
  hand.managed.dl_tensor.byte_offset = 2 * sizeof(float);
  hand.shape[0] = 2;
  {
    Tensor t = Tensor::from_dlpack(&hand.managed);
    CHECK(t.is_contiguous());
    CHECK(t.strides() == Tensor::Shape{2, 1});
    CHECK(t.to_vector<float>() == std::vector<float>{2, 3, 4, 5});
    CHECK(t.storage()->data() == hand.values.data());
    CHECK(t.storage()->nbytes() == 6 * sizeof(float));
  }
  CHECK(hand.deleter_calls == 1);
}

TEST_CASE("from_dlpack imports cuda tensors without an allocator", "[tensor][dlpack]") {
  HandBuilt hand;
  hand.managed.dl_tensor.device = {kDLCUDA, 3};
  {
    Tensor t = Tensor::from_dlpack(&hand.managed);
    CHECK(t.device() == Device::cuda(3));
    DLManagedTensor* back = t.to_dlpack();
    CHECK(back->dl_tensor.device.device_type == kDLCUDA);
    CHECK(back->dl_tensor.device.device_id == 3);
    back->deleter(back);
  }
  CHECK(hand.deleter_calls == 1);
}

TEST_CASE("from_dlpack refuses what Switchboard cannot hold and still frees the import",
          "[tensor][dlpack]") {
  struct Case {
    const char* name;
    void (*edit)(HandBuilt&);
    const char* message;
  };
  const Case cases[] = {
      {"complex dtype",
       [](HandBuilt& h) {
         h.managed.dl_tensor.dtype = {kDLComplex, 64, 1};
       },
       "unsupported DLPack dtype (code 5, bits 64)"},
      {"int16",
       [](HandBuilt& h) {
         h.managed.dl_tensor.dtype = {kDLInt, 16, 1};
       },
       "(code 0, bits 16)"},
      {"uint32",
       [](HandBuilt& h) {
         h.managed.dl_tensor.dtype = {kDLUInt, 32, 1};
       },
       "(code 1, bits 32)"},
      {"bfloat32",
       [](HandBuilt& h) {
         h.managed.dl_tensor.dtype = {kDLBfloat, 32, 1};
       },
       "(code 4, bits 32)"},
      {"bool 1 bit",
       [](HandBuilt& h) {
         h.managed.dl_tensor.dtype = {6, 1, 1};
       },
       "(code 6, bits 1)"},
      {"vector lanes",
       [](HandBuilt& h) {
         h.managed.dl_tensor.dtype = {kDLFloat, 32, 4};
       },
       "4 lanes"},
      {"cuda host device",
       [](HandBuilt& h) {
         h.managed.dl_tensor.device = {kDLCUDAHost, 0};
       },
       "unsupported DLPack device type 3"},
      {"rocm device",
       [](HandBuilt& h) {
         h.managed.dl_tensor.device = {kDLROCM, 0};
       },
       "device type 10"},
      {"negative ndim", [](HandBuilt& h) { h.managed.dl_tensor.ndim = -1; },
       "negative ndim -1"},
      {"negative extent", [](HandBuilt& h) { h.shape[1] = -2; }, "[3, -2]"},
      {"negative stride", [](HandBuilt& h) { h.strides[0] = -1; }, "[-1, 3]"},
      {"null data", [](HandBuilt& h) { h.managed.dl_tensor.data = nullptr; },
       "null data"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    HandBuilt hand;
    c.edit(hand);
    CHECK_THAT(invalid_argument_message([&] { Tensor::from_dlpack(&hand.managed); }),
               Contains("Tensor::from_dlpack") && Contains(c.message));
    CHECK(hand.deleter_calls == 1);
  }
}

TEST_CASE("from_dlpack accepts a null deleter and refuses a null pointer",
          "[tensor][dlpack]") {
  HandBuilt hand;
  hand.managed.deleter = nullptr;
  { CHECK(Tensor::from_dlpack(&hand.managed).numel() == 6); }
  CHECK(hand.deleter_calls == 0);
  hand.managed.dl_tensor.dtype.lanes = 2;
  CHECK_THROWS_AS(Tensor::from_dlpack(&hand.managed), std::invalid_argument);
  CHECK_THROWS_AS(Tensor::from_dlpack(nullptr), std::invalid_argument);
}

}  // namespace
