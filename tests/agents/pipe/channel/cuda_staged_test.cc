// The cuda_staged channel's two ends (agents/pipe/channel/cuda_staged/
// staging.h) over a stand-in CUDA runtime (host memory tagged cuda:N, a
// copier that counts its copies): a staged tensor copied off the device
// chunk by chunk as the connection takes it, a small tensor landing in a
// padded buffer copied whole, a large one copied to the device chunk by
// chunk as its bytes arrive, and copies that fail on the way.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "agents/pipe/channel/cuda_staged/staging.h"
#include "common/error.h"
#include "core/tensor.h"

using namespace switchboard;
using namespace switchboard::agents::pipe;
using Catch::Contains;

namespace {

// Device memory for the stand-in: Tensor::empty on cuda:N is host memory.
const bool kAllocator = [] {
  set_device_allocator([](size_t nbytes, Device) -> std::shared_ptr<void> {
    return std::shared_ptr<void>(std::malloc(std::max<size_t>(nbytes, 1)), std::free);
  });
  return true;
}();

// A device "tensor" of the stand-in runtime: host memory tagged cuda:0.
Tensor device_tensor(int64_t n, float first) {
  Tensor t = Tensor::empty({n}, DType::kFloat32, Device::cuda(0));
  auto* p = static_cast<float*>(t.data());
  for (int64_t i = 0; i < n; ++i) p[i] = first + static_cast<float>(i);
  return t;
}

}  // namespace

TEST_CASE(
    "a staged CUDA tensor is copied chunk by chunk, each copy making the next bytes "
    "ready",
    "[cuda_staged]") {
  int copies = 0;
  set_device_copier([&](const Tensor& dst, const Tensor& src) {
    ++copies;
    std::memcpy(dst.data(), src.data(), src.nbytes());
  });
  const Tensor device = device_tensor(int64_t{10} << 18, 3);  // 10 MiB of floats
  const Tensor host = Tensor::empty({int64_t{10} << 18}, DType::kFloat32);
  channel::DeviceStager stager(device, host, size_t{4} << 20);
  CHECK(stager.size() == size_t{10} << 20);
  CHECK(stager.ready() == 0);
  stager.advance();
  CHECK(stager.ready() == size_t{4} << 20);
  stager.advance();
  stager.advance();
  CHECK(stager.ready() == size_t{10} << 20);
  stager.advance();  // nothing left: no copy
  CHECK(copies == 3);
  CHECK(std::memcmp(stager.data(), device.data(), device.nbytes()) == 0);
  // A copy that fails reaches the writer (which then fails the connection).
  set_device_copier([](const Tensor&, const Tensor&) {
    throw Error(ErrorCode::kFailedPrecondition, "fake copy failed");
  });
  channel::DeviceStager failing(device, host);
  CHECK_THROWS_WITH(failing.advance(), Contains("fake copy failed"));
  CHECK(failing.ready() == 0);
  set_device_copier(nullptr);
}

TEST_CASE(
    "a small tensor bound for a CUDA device lands in a padded buffer copied whole in "
    "one copy of kMinCopyBytes",
    "[cuda_staged]") {
  std::vector<size_t> copied;
  set_device_copier([&](const Tensor& dst, const Tensor& src) {
    copied.push_back(src.nbytes());
    std::memcpy(dst.data(), src.data(), src.nbytes());
  });
  constexpr size_t kSpan = channel::DeviceLanding::kMinCopyBytes;
  const Tensor pattern = device_tensor(1000, 7);  // 4000 bytes of floats
  Tensor host = channel::DeviceLanding::receive_padded(
      Tensor::empty({static_cast<int64_t>(kSpan)}, DType::kUInt8), {10, 100},
      DType::kFloat32, Device::cuda(1));
  CHECK(host.device() == Device::cpu());
  CHECK(host.shape() == Tensor::Shape{10, 100});
  std::memcpy(host.data(), pattern.data(), pattern.nbytes());
  channel::DeviceLanding* landing = channel::DeviceLanding::of(host);
  REQUIRE(landing != nullptr);
  landing->arrived(pattern.nbytes());
  CHECK(copied.empty());  // nothing before the frame is complete
  const Tensor on_device = landing->finish();
  CHECK(copied == std::vector<size_t>{kSpan});
  CHECK(on_device.device() == Device::cuda(1));
  CHECK(on_device.dtype() == DType::kFloat32);
  CHECK(on_device.shape() == Tensor::Shape{10, 100});
  CHECK(on_device.storage()->nbytes() >= pattern.nbytes());
  CHECK(std::memcmp(on_device.data(), pattern.data(), pattern.nbytes()) == 0);
  CHECK_THROWS_WITH(
      channel::DeviceLanding::receive_padded(Tensor::empty({16}, DType::kUInt8), {5},
                                             DType::kFloat32, Device::cuda(0)),
      Contains("cannot hold"));
  set_device_copier(nullptr);
}

TEST_CASE(
    "a tensor bound for a CUDA device is copied there chunk by chunk as its bytes "
    "arrive, the rest when all did",
    "[cuda_staged]") {
  int copies = 0;
  set_device_copier([&](const Tensor& dst, const Tensor& src) {
    ++copies;
    std::memcpy(dst.data(), src.data(), src.nbytes());
  });
  const Tensor pattern =
      device_tensor(int64_t{10} << 18, 5);  // 10 MiB of floats, the bytes to arrive
  Tensor host = channel::DeviceLanding::receive_into(
      Tensor::empty({int64_t{10} << 18}, DType::kFloat32), Device::cuda(1),
      size_t{4} << 20);
  channel::DeviceLanding* landing = channel::DeviceLanding::of(host);
  REQUIRE(landing != nullptr);
  CHECK(channel::DeviceLanding::of(Tensor::empty({4}, DType::kFloat32)) == nullptr);
  CHECK(channel::DeviceLanding::of(Tensor()) == nullptr);
  // The bytes arrive in pieces that do not fall on chunk boundaries.
  size_t filled = 0;
  for (size_t piece :
       {size_t{3} << 20, size_t{2} << 20, size_t{4} << 20, size_t{1} << 20}) {
    std::memcpy(static_cast<uint8_t*>(host.data()) + filled,
                static_cast<const uint8_t*>(pattern.data()) + filled, piece);
    filled += piece;
    landing->arrived(filled);
  }
  CHECK(copies == 2);  // the two whole chunks: 0-4 and 4-8 MiB
  const Tensor on_device = landing->finish();
  CHECK(copies == 3);  // the last 2 MiB
  CHECK(on_device.device() == Device::cuda(1));
  CHECK(std::memcmp(on_device.data(), pattern.data(), pattern.nbytes()) == 0);

  SECTION(
      "a copy that fails on the way is made anew by finish(), which throws what it "
      "throws") {
    set_device_copier([](const Tensor&, const Tensor&) {
      throw Error(ErrorCode::kFailedPrecondition, "fake copy failed");
    });
    Tensor again = channel::DeviceLanding::receive_into(
        Tensor::empty({int64_t{10} << 18}, DType::kFloat32), Device::cuda(0),
        size_t{4} << 20);
    channel::DeviceLanding::of(again)->arrived(size_t{10} << 20);  // does not throw
    CHECK_THROWS_WITH(channel::DeviceLanding::of(again)->finish(),
                      Contains("fake copy failed"));
  }
  set_device_copier(nullptr);
}
