// The tensor descriptor codec shared by PIPE and PROCESS_GROUP
// (core/tensor_descriptor.h): the byte layout, round trips of every dtype
// and of 0 to 64 dimensions, and every rule a decoder enforces, each as a
// ProtocolError naming the message, the tensor, the field and its value.
#include "core/tensor_descriptor.h"

#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/error.h"
#include "core/tensor.h"

using namespace switchboard;
using namespace switchboard;
using Catch::Contains;

namespace {

using Bytes = std::vector<uint8_t>;

constexpr DescriptorSource kSource{.label = "test frame", .id = 3};
constexpr DescriptorSource kCpuOnly{
    .label = "test frame", .id = 3, .devices = AllowedDevices::kCpuOnly};

template <typename T>
void append(Bytes& out, T value) {
  const auto* p = reinterpret_cast<const uint8_t*>(&value);  // little-endian host
  out.insert(out.end(), p, p + sizeof value);
}

// One descriptor as a peer could write it, valid or not.
Bytes raw_descriptor(uint8_t dtype, uint8_t device_type, int16_t device_index,
                     const std::vector<int64_t>& extents) {
  Bytes out = {dtype, device_type};
  append<int16_t>(out, device_index);
  append<uint32_t>(out, static_cast<uint32_t>(extents.size()));
  for (int64_t extent : extents) append<int64_t>(out, extent);
  return out;
}

Bytes encode(const std::vector<Tensor>& tensors,
             const std::vector<Device>& devices = {}) {
  Bytes out(descriptors_length(tensors, devices, "test"));
  REQUIRE(encode_descriptors(out.data(), tensors, devices) == out.data() + out.size());
  return out;
}

std::vector<TensorDescriptor> decode(const Bytes& bytes, uint32_t count,
                                     const DescriptorSource& source = kSource) {
  return decode_descriptors(bytes.data(), bytes.size(), count, source);
}

void require_error(const Bytes& bytes, uint32_t count, const std::string& text,
                   const DescriptorSource& source = kSource) {
  try {
    decode(bytes, count, source);
    FAIL("no ProtocolError; expected one containing: " << text);
  } catch (const ProtocolError& e) {
    CHECK_THAT(e.what(), Contains(text));
  }
}

}  // namespace

TEST_CASE("the limits are 64 dimensions and 65,536 tensors, 32.5 MiB of descriptors",
          "[tensor_descriptor]") {
  STATIC_REQUIRE(kMaxTensorDims == 64);
  STATIC_REQUIRE(kMaxTensorsPerMessage == 65536);
  STATIC_REQUIRE(descriptor_size(0) == 8);
  STATIC_REQUIRE(descriptor_size(64) == 520);
  STATIC_REQUIRE(kMaxDescriptorsLength == 34'078'720);
  STATIC_REQUIRE(min_descriptors_length(3) == 24);
  STATIC_REQUIRE(max_descriptors_length(3) == 1560);
}

TEST_CASE("a descriptor is dtype, device type, device index, ndim and extents",
          "[tensor_descriptor]") {
  const Bytes bytes =
      encode({Tensor::empty({2, 3}, DType::kFloat32)}, {Device::cuda(258)});
  const Bytes expected = {2, 1, 2, 1, 2, 0, 0, 0,   // float32, cuda, index 258, ndim 2
                          2, 0, 0, 0, 0, 0, 0, 0,   // extent 2
                          3, 0, 0, 0, 0, 0, 0, 0};  // extent 3
  REQUIRE(bytes == expected);
  // A CPU tensor without a device override names the CPU: the three zero
  // bytes after the dtype in PROCESS_GROUP's original layout.
  REQUIRE(encode({Tensor::empty({}, DType::kBool)}) == Bytes{8, 0, 0, 0, 0, 0, 0, 0});
}

TEST_CASE("every dtype and 0 to 64 dimensions round-trip", "[tensor_descriptor]") {
  std::vector<Tensor> tensors;
  std::vector<Device> devices;
  for (DType dtype : kAllDTypes) {
    for (size_t ndim : {0, 1, 3, 63, 64}) {
      Tensor::Shape shape(ndim, 1);
      if (ndim > 0) shape[ndim / 2] = 5;
      tensors.push_back(Tensor::empty(shape, dtype));
      devices.push_back(ndim % 2 == 0 ? Device::cpu()
                                      : Device::cuda(static_cast<int>(ndim)));
    }
  }
  tensors.push_back(Tensor::empty({4, 0, 7}, DType::kInt64));
  devices.push_back(Device::cuda(32767));

  const Bytes bytes = encode(tensors, devices);
  const auto decoded = decode(bytes, static_cast<uint32_t>(tensors.size()));
  REQUIRE(decoded.size() == tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    INFO("tensor " << i << ": " << tensors[i].describe());
    CHECK(decoded[i].dtype == tensors[i].dtype());
    CHECK(decoded[i].device == devices[i]);
    CHECK(decoded[i].ndim == tensors[i].dim());
    CHECK(decoded[i].shape() == tensors[i].shape());
    CHECK(decoded[i].nbytes == tensors[i].nbytes());
  }
  REQUIRE(decode(Bytes{}, 0).empty());
}

TEST_CASE("the encoder refuses what a descriptor cannot describe",
          "[tensor_descriptor]") {
  const Tensor ok = Tensor::empty({2}, DType::kInt8);
  const Tensor too_many_dims = Tensor::empty(Tensor::Shape(65, 1), DType::kInt8);
  REQUIRE_THROWS_WITH(
      descriptors_length({ok, too_many_dims}, {}, "enc"),
      Contains("enc: tensor 1 (") && Contains("has 65 dimensions (the limit is 64)"));
  REQUIRE_THROWS_WITH(descriptors_length({ok}, {Device::cuda(32768)}, "enc"),
                      Contains("enc: tensor 0: device (type 1, index 32768) cannot be "
                               "sent (cpu index 0, cuda index 0 to 32767)"));
  REQUIRE_THROWS_WITH(descriptors_length({ok}, {Device::cuda(-1)}, "enc"),
                      Contains("device (type 1, index -1) cannot be sent"));
  REQUIRE_THROWS_WITH(descriptors_length({ok}, {Device{Device::Type::kCpu, 1}}, "enc"),
                      Contains("device (type 0, index 1) cannot be sent"));
  REQUIRE_THROWS_WITH(descriptors_length({ok}, {Device::cpu(), Device::cpu()}, "enc"),
                      Contains("enc: 2 devices for 1 tensors"));
  const std::vector<Tensor> too_many(kMaxTensorsPerMessage + 1, ok);
  REQUIRE_THROWS_WITH(descriptors_length(too_many, {}, "enc"),
                      Contains("enc: 65537 tensors exceed the limit 65536 per message"));
  REQUIRE(descriptors_length(std::vector<Tensor>(kMaxTensorsPerMessage, ok), {}, "enc") ==
          kMaxTensorsPerMessage * descriptor_size(1));
}

TEST_CASE("ndim over 64 is refused, naming the tensor, the value and the limit",
          "[tensor_descriptor]") {
  Bytes bytes = raw_descriptor(0, 0, 0, {});
  const Bytes wide = raw_descriptor(0, 0, 0, std::vector<int64_t>(65, 1));
  bytes.insert(bytes.end(), wide.begin(), wide.end());
  require_error(bytes, 2, "test frame 3 tensor 1: ndim 65 exceeds the limit 64");

  // Refused before its extents are looked for.
  Bytes huge = raw_descriptor(0, 0, 0, {});
  huge[4] = 0xff;
  require_error(huge, 1, "test frame 3 tensor 0: ndim 255 exceeds the limit 64");
  const Bytes most = raw_descriptor(0, 0, 0, std::vector<int64_t>(64, 1));
  REQUIRE(decode(most, 1)[0].ndim == 64);
}

TEST_CASE("unknown dtypes and devices are refused", "[tensor_descriptor]") {
  require_error(raw_descriptor(9, 0, 0, {1}), 1,
                "test frame 3 tensor 0: dtype 9 is not a dtype (0 to 8)");
  require_error(raw_descriptor(255, 0, 0, {1}), 1, "dtype 255 is not a dtype (0 to 8)");
  require_error(
      raw_descriptor(2, 2, 0, {1}), 1,
      "test frame 3 tensor 0: device type 2 is not a device type (0 cpu, 1 cuda)");
  require_error(raw_descriptor(2, 0, 1, {1}), 1,
                "test frame 3 tensor 0: device index 1 for cpu (must be 0)");
  require_error(raw_descriptor(2, 1, -1, {1}), 1,
                "test frame 3 tensor 0: device index -1 for cuda is negative");
  const Bytes cuda = raw_descriptor(2, 1, 0, {1});
  REQUIRE(decode(cuda, 1)[0].device == Device::cuda(0));
  require_error(cuda, 1,
                "test frame 3 tensor 0: device type 1 (cuda) is not allowed (this format "
                "carries cpu tensors only: device type 0)",
                kCpuOnly);
  REQUIRE(decode(raw_descriptor(2, 0, 0, {1}), 1, kCpuOnly)[0].device == Device::cpu());
}

TEST_CASE("negative extents are refused", "[tensor_descriptor]") {
  require_error(raw_descriptor(2, 0, 0, {3, -1}), 1,
                "test frame 3 tensor 0: extent -1 in dimension 1 is negative");
  require_error(raw_descriptor(2, 0, 0, {std::numeric_limits<int64_t>::min()}), 1,
                "extent -9223372036854775808 in dimension 0 is negative");
}

TEST_CASE("element counts, strides and byte counts that overflow are refused",
          "[tensor_descriptor]") {
  const int64_t big = int64_t{1} << 40;
  require_error(raw_descriptor(4, 0, 0, {big, big}), 1,
                "test frame 3 tensor 0: numel of shape [1099511627776, 1099511627776] "
                "overflows int64");
  // No elements, but the contiguous strides overflow.
  require_error(raw_descriptor(4, 0, 0, {0, big, big}), 1,
                "test frame 3 tensor 0: the strides of shape [0, 1099511627776, "
                "1099511627776] overflow int64");
  // numel fits int64, numel x 8 bytes does not.
  require_error(raw_descriptor(7, 0, 0, {int64_t{1} << 62}), 1,
                "test frame 3 tensor 0: nbytes of int64[4611686018427387904] overflows");
  // At the edge: int8 numel 2^62 is representable (nothing is allocated here).
  REQUIRE(decode(raw_descriptor(4, 0, 0, {int64_t{1} << 62}), 1)[0].nbytes == size_t{1}
                                                                                  << 62);
  REQUIRE(decode(raw_descriptor(4, 0, 0, {0, big, 1 << 20}), 1)[0].nbytes == 0);
}

TEST_CASE("input cut at every byte offset is refused as too short",
          "[tensor_descriptor]") {
  const Bytes full =
      encode({Tensor::empty({2, 3}, DType::kFloat32), Tensor::empty({}, DType::kInt8),
              Tensor::empty({4}, DType::kInt64)});
  REQUIRE(full.size() == 24 + 8 + 16);
  REQUIRE(decode(full, 3).size() == 3);
  for (size_t cut = 0; cut < full.size(); ++cut) {
    INFO("cut at " << cut);
    const Bytes part(full.begin(), full.begin() + static_cast<ptrdiff_t>(cut));
    require_error(part, 3,
                  fmt::format("test frame 3: descriptors_length {} is too short", cut));
  }
  // The messages say what was missing.
  require_error(Bytes(full.begin(), full.begin() + 23), 3,
                "descriptors_length 23 is too short for tensor 0's 2 extents (its "
                "descriptor starts at byte 0)");
  require_error(Bytes(full.begin(), full.begin() + 35), 3,
                "descriptors_length 35 is too short for tensor_count 3 (tensor 2's "
                "descriptor starts at byte 32)");
}

TEST_CASE("bytes after the last descriptor and too many tensors are refused",
          "[tensor_descriptor]") {
  Bytes longer = encode({Tensor::empty({2}, DType::kInt8)});
  longer.push_back(0);
  require_error(longer, 1,
                "test frame 3: descriptors_length 17 does not match the 16 bytes of the "
                "descriptors of its 1 tensors");
  const Bytes scalars(size_t{kMaxTensorsPerMessage + 1} * descriptor_size(0), 0);
  require_error(scalars, kMaxTensorsPerMessage + 1,
                "test frame 3: tensor_count 65537 exceeds the limit 65536");
  const Bytes most(size_t{kMaxTensorsPerMessage} * descriptor_size(0), 0);
  REQUIRE(decode(most, kMaxTensorsPerMessage).size() == kMaxTensorsPerMessage);
}

TEST_CASE("a header's descriptors_length is checked against its tensor_count",
          "[tensor_descriptor]") {
  // The bounds are inclusive: 8 bytes per tensor at least, 8 + 8 * 64 at most.
  CHECK_NOTHROW(check_descriptors_length(0, 0, "f"));
  CHECK_NOTHROW(check_descriptors_length(16, 2, "f"));
  CHECK_NOTHROW(check_descriptors_length(2 * descriptor_size(kMaxTensorDims), 2, "f"));
  CHECK_THROWS_MATCHES(
      check_descriptors_length(15, 2, "pipe frame"), ProtocolError,
      Catch::Message("pipe frame: descriptors_length 15 is out of range for tensor_count 2 "
                     "(must be between 16 and 1040)"));
  CHECK_THROWS_MATCHES(
      check_descriptors_length(1041, 2, "message 7"), ProtocolError,
      Catch::Message("message 7: descriptors_length 1041 is out of range for tensor_count 2 "
                     "(must be between 16 and 1040)"));
  CHECK_THROWS_AS(check_descriptors_length(8, 0, "f"), ProtocolError);
}
