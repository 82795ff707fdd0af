#include "agents/pipe/channel/cuda_staged/staging.h"

#include <algorithm>

#include "common/check.h"

namespace switchboard::agents::pipe::channel {

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

Tensor DeviceLanding::receive_into(Tensor host, Device device, size_t chunk_bytes) {
  void* data = host.data();
  Tensor::Shape shape = host.shape();
  const DType dtype = host.dtype();
  std::shared_ptr<void> owner(
      new DeviceLanding(std::move(host), shape, dtype, device, chunk_bytes), Deleter{});
  return Tensor::from_blob(data, shape, dtype, Device::cpu(), std::move(owner));
}

Tensor DeviceLanding::receive_padded(Tensor padded, const Tensor::Shape& shape, DType dtype,
                                     Device device) {
  const size_t nbytes = static_cast<size_t>(Tensor::numel_of(shape)) * dtype_size(dtype);
  SB_REQUIRE(padded.device().is_cpu() && padded.is_contiguous() && padded.nbytes() >= nbytes,
             "DeviceLanding: {} cannot hold a {} tensor of shape {}", padded.describe(),
             dtype_name(dtype), shape_str(shape));
  void* data = padded.data();
  const size_t span = padded.nbytes();
  // One chunk larger than the buffer: nothing is copied before finish().
  std::shared_ptr<void> owner(
      new DeviceLanding(std::move(padded), shape, dtype, device, span + 1), Deleter{});
  return Tensor::from_blob(data, shape, dtype, Device::cpu(), std::move(owner));
}

Tensor DeviceLanding::view_of(const Tensor& bytes, Device device) const {
  return Tensor::from_blob(bytes.data(), shape_, dtype_, device, bytes.storage());
}

DeviceLanding* DeviceLanding::of(const Tensor& tensor) {
  if (!tensor.defined()) return nullptr;
  const std::shared_ptr<void>& owner = tensor.storage()->owner();
  if (std::get_deleter<Deleter>(owner) == nullptr) return nullptr;
  return static_cast<DeviceLanding*>(owner.get());
}

void DeviceLanding::copy_to(size_t end) {
  if (end <= copied_) return;
  if (!device_tensor_.defined())
    device_tensor_ = Tensor::empty(host_.shape(), host_.dtype(), device_);
  auto* from = static_cast<uint8_t*>(host_.data()) + copied_;
  auto* to = static_cast<uint8_t*>(device_tensor_.data()) + copied_;
  const auto n = static_cast<int64_t>(end - copied_);
  copy_bytes(Tensor::from_blob(to, {n}, DType::kUInt8, device_, nullptr),
             Tensor::from_blob(from, {n}, DType::kUInt8, Device::cpu(), nullptr));
  ++copies_;
  copied_ = end;
}

void DeviceLanding::arrived(size_t filled) noexcept {
  if (failed_) return;
  const size_t whole = filled / chunk_ * chunk_;
  try {
    while (copied_ + chunk_ <= whole) copy_to(copied_ + chunk_);
  } catch (...) {
    failed_ = true;  // finish() copies anew, and throws what that throws
  }
}

Tensor DeviceLanding::finish() {
  if (failed_) return view_of(host_, Device::cpu()).to(device_);
  copy_to(host_.nbytes());
  if (!device_tensor_.defined())
    device_tensor_ = Tensor::empty(host_.shape(), host_.dtype(), device_);
  if (device_tensor_.shape() == shape_ && device_tensor_.dtype() == dtype_)
    return device_tensor_;
  return view_of(device_tensor_, device_);
}

}  // namespace switchboard::agents::pipe::channel
