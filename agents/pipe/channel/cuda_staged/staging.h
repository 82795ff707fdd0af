// The cuda_staged channel's two ends, each overlapping its copy between
// host and device with the connection's transfer instead of following it:
//
// DeviceStager: a CUDA tensor on its way to another worker, copied into a
// pinned host buffer chunk by chunk as the connection takes the bytes (a
// wire::ChunkedSource): the connection's writer copies the next chunk off
// the device while the kernel still sends the last one.
//
// DeviceLanding: a tensor bound for a CUDA device, received into a pinned
// host buffer whose whole chunks are copied to the device as they arrive
// (told by the frame reader's progress hook), so that only the last chunk
// is left to copy once the frame is complete. A small tensor is received
// into a pinned buffer of kMinCopyBytes and copied whole, padding and all,
// into a device block as large (see kMinCopyBytes).
//
// The copies are the registered device copier's (synchronous, after the
// work already queued on the device's default stream), on uint8 views of
// the two tensors. Holds both tensors until it is destroyed.
//
// Thread safety: as wire::ChunkedSource (advance() from one thread at a
// time, ready() from any).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>

#include "agents/pipe/wire/frame.h"
#include "core/tensor.h"

namespace switchboard::agents::pipe::channel {

class DeviceStager final : public wire::ChunkedSource {
 public:
  // Tensors of this size and more are staged chunk by chunk; smaller ones
  // at once (one copy costs less than the bookkeeping).
  static constexpr size_t kMinBytes = size_t{8} << 20;
  static constexpr size_t kChunkBytes = size_t{4} << 20;

  // `device_tensor` (contiguous, on a CUDA device) into `host` (a CPU
  // tensor of the same dtype and shape, pinned for speed).
  DeviceStager(Tensor device_tensor, Tensor host, size_t chunk_bytes = kChunkBytes);

  size_t size() const override { return size_; }
  size_t ready() const override { return ready_.load(std::memory_order_acquire); }
  const uint8_t* data() const override {
    return static_cast<const uint8_t*>(host_.data());
  }
  // Copies the next chunk; throws what the copier throws.
  void advance() override;

  // How many copies advance() made (for tests).
  size_t copies() const { return copies_.load(); }

 private:
  const Tensor device_;
  const Tensor host_;
  const size_t size_;
  const size_t chunk_;
  std::atomic<size_t> ready_{0};
  std::atomic<size_t> copies_{0};
};

class DeviceLanding {
 public:
  // The fewest bytes a copy to the device moves. Measured on an H100
  // (tools/bench:cuda_copy_latency, two processes taking turns on the GPU,
  // as the two ends of a round trip do): a host-to-device copy of 16 KiB
  // or less waited about 145 us for the GPU to switch to this process,
  // from pinned or pageable memory alike; one of 32 KiB or more from
  // pinned memory took about 10 us. So a smaller tensor lands padded.
  static constexpr size_t kMinCopyBytes = size_t{32} << 10;

  // A CPU tensor over `host` (pinned for speed) to receive into, whose
  // bytes go to a new tensor on `device` chunk by chunk as they arrive.
  // The returned tensor's storage carries the landing.
  static Tensor receive_into(Tensor host, Device device,
                             size_t chunk_bytes = DeviceStager::kChunkBytes);
  // A CPU tensor of `shape` and `dtype` over the start of `padded` (a
  // contiguous CPU buffer, pinned for speed, of at least the tensor's
  // bytes) to receive into; finish() copies all of `padded` to a device
  // block as large, of which the tensor on `device` is a view. Throws
  // std::invalid_argument when `padded` is too small.
  static Tensor receive_padded(Tensor padded, const Tensor::Shape& shape, DType dtype,
                               Device device);
  // The landing of a tensor receive_into() made; null for any other.
  static DeviceLanding* of(const Tensor& tensor);

  // `filled` bytes from the start arrived: copies the whole chunks among
  // them not yet copied. On the reading thread; never throws (a failure,
  // such as no memory on the device, is kept: finish() then copies anew).
  void arrived(size_t filled) noexcept;
  // Every byte arrived: copies what is left and returns the tensor on the
  // device. After a failure in arrived(), copies the whole tensor anew
  // (Tensor::to), which throws what a placement without landing would.
  Tensor finish();

  size_t copies() const { return copies_; }

 private:
  struct Deleter {
    void operator()(void* landing) const { delete static_cast<DeviceLanding*>(landing); }
  };
  DeviceLanding(Tensor host, Tensor::Shape shape, DType dtype, Device device,
                size_t chunk_bytes)
      : host_(std::move(host)),
        shape_(std::move(shape)),
        dtype_(dtype),
        device_(device),
        chunk_(std::max<size_t>(chunk_bytes, 1)) {}
  // Copies bytes [copied_, end) to the device tensor (made on first use,
  // as large as host_).
  void copy_to(size_t end);
  // The received tensor: shape_ and dtype_ over the start of `bytes`.
  Tensor view_of(const Tensor& bytes, Device device) const;

  // What the bytes arrive in: the tensor itself, or a padded buffer.
  const Tensor host_;
  const Tensor::Shape shape_;
  const DType dtype_;
  const Device device_;
  const size_t chunk_;
  // Touched by the reading thread, then (the frame handed on) by the pool.
  Tensor device_tensor_;
  size_t copied_ = 0;
  size_t copies_ = 0;
  bool failed_ = false;
};

}  // namespace switchboard::agents::pipe::channel
