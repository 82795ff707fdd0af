#include "agents/pipe/channel/cuda_staged/cuda_staged.h"

#include <fmt/format.h>

#include <stdexcept>

#include "agents/pipe/channel/cuda_staged/staging.h"
#include "common/check.h"

namespace switchboard::agents::pipe::channel {

std::string CudaStagedChannel::reason(const Ends& ends) const {
  if (!carries(ends)) return "CPU to CPU";
  if (ends.src.is_cpu() || ends.dst.is_cpu()) return "one end is the CPU";
  return "CUDA to CUDA through host memory";
}

std::optional<wire::TensorRoute> CudaStagedChannel::send(
    transport::Connection& connection, Tensor& t, Device dst) {
  (void)connection;
  (void)dst;
  if (t.device().is_cpu()) {
    if (!t.is_contiguous()) t = t.clone();  // contiguous is what travels
    return wire::TensorRoute{};
  }
  try {
    SB_REQUIRE(t.is_contiguous(), "{} is not contiguous", t.describe());
    SB_REQUIRE(has_device_copier(),
               "no device copier is registered (link //core:cuda_allocator)");
    Tensor staged = buffers_->empty(t.shape(), t.dtype(), /*pinned=*/true);
    wire::TensorRoute route;
    if (t.nbytes() >= DeviceStager::kMinBytes) {
      route.source = std::make_shared<DeviceStager>(t, staged);
    } else {
      copy_bytes(staged, t);
    }
    t = std::move(staged);
    return route;
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("cannot be staged: {}", e.what()));
  }
}

Tensor CudaStagedChannel::allocate(DType dtype, const Tensor::Shape& shape,
                                   Device device) {
  constexpr size_t kSpan = DeviceLanding::kMinCopyBytes;
  const bool lands = device.is_cuda() && device.index < device_count_;
  if (lands && static_cast<size_t>(Tensor::numel_of(shape)) * dtype_size(dtype) < kSpan) {
    // Counts kSpan from here until the buffer is given back.
    struct Hold {
      explicit Hold(std::shared_ptr<std::atomic<size_t>> counter)
          : live(std::move(counter)) {}
      ~Hold() { live->fetch_sub(kSpan); }
      Hold(const Hold&) = delete;
      Hold& operator=(const Hold&) = delete;
      std::shared_ptr<std::atomic<size_t>> live;
      Tensor buffer;
    };
    if (padded_live_->fetch_add(kSpan) < kMaxPaddedBytes) {
      auto hold = std::make_shared<Hold>(padded_live_);
      hold->buffer =
          buffers_->empty({static_cast<int64_t>(kSpan)}, DType::kUInt8, /*pinned=*/true);
      void* data = hold->buffer.data();
      return DeviceLanding::receive_padded(
          Tensor::from_blob(data, {static_cast<int64_t>(kSpan)}, DType::kUInt8,
                            Device::cpu(), std::move(hold)),
          shape, dtype, device);
    }
    padded_live_->fetch_sub(kSpan);  // past the bound: lands unpadded
  }
  Tensor host = buffers_->empty(shape, dtype, /*pinned=*/device.is_cuda());
  if (lands && host.nbytes() >= DeviceStager::kMinBytes) {
    return DeviceLanding::receive_into(std::move(host), device);
  }
  return host;
}

void CudaStagedChannel::arrived(const Tensor& tensor, size_t filled) noexcept {
  if (DeviceLanding* landing = DeviceLanding::of(tensor)) landing->arrived(filled);
}

Tensor CudaStagedChannel::receive(transport::Connection& connection, Arrival arrival) {
  (void)connection;
  if (arrival.bytes.device() == arrival.device) return std::move(arrival.bytes);
  if (DeviceLanding* landing = DeviceLanding::of(arrival.bytes)) {
    return landing->finish();  // most of it is there already
  }
  return arrival.bytes.to(arrival.device);
}

}  // namespace switchboard::agents::pipe::channel
