#include "agents/pipe/channel/staging.h"

#include <algorithm>

#include "common/check.h"

namespace switchboard::agents::channel {

DeviceStager::DeviceStager(Tensor device_tensor, Tensor host, size_t chunk_bytes)
    : device_(std::move(device_tensor)),
      host_(std::move(host)),
      size_(device_.nbytes()),
      chunk_(std::max<size_t>(chunk_bytes, 1)) {
  SB_REQUIRE(host_.device().is_cpu() && host_.nbytes() == size_ &&
                 host_.is_contiguous() && device_.is_contiguous(),
             "DeviceStager: cannot stage {} into {}", device_.describe(),
             host_.describe());
}

void DeviceStager::advance() {
  const size_t at = ready_.load(std::memory_order_relaxed);
  if (at >= size_) return;
  const size_t n = std::min(chunk_, size_ - at);
  auto* from = static_cast<uint8_t*>(device_.data()) + at;
  auto* to = static_cast<uint8_t*>(host_.data()) + at;
  const Tensor src = Tensor::from_blob(from, {static_cast<int64_t>(n)}, DType::kUInt8,
                                       device_.device(), nullptr);
  const Tensor dst = Tensor::from_blob(to, {static_cast<int64_t>(n)}, DType::kUInt8,
                                       Device::cpu(), nullptr);
  copy_bytes(dst, src);
  copies_.fetch_add(1);
  ready_.store(at + n, std::memory_order_release);
}

}  // namespace switchboard::agents::channel
