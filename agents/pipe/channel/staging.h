// The cuda_staged channel's two ends, each overlapping its copy between
// host and device with the connection's transfer instead of following it:
//
// DeviceStager: a CUDA tensor on its way to another worker, copied into a
// pinned host buffer chunk by chunk as the connection takes the bytes (a
// pipe::ChunkedSource): the connection's writer copies the next chunk off
// the device while the kernel still sends the last one.
//
// DeviceLanding: a tensor bound for a CUDA device, received into a pinned
// host buffer whose whole chunks are copied to the device as they arrive
// (told by the frame reader's progress hook), so that only the last chunk
// is left to copy once the frame is complete.
//
// The copies are the registered device copier's (synchronous, after the
// work already queued on the device's default stream), on uint8 views of
// the two tensors. Holds both tensors until it is destroyed.
//
// Thread safety: as pipe::ChunkedSource (advance() from one thread at a
// time, ready() from any).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>

#include "agents/pipe_frame.h"
#include "core/tensor.h"

namespace switchboard::agents::channel {

class DeviceStager final : public pipe::ChunkedSource {
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
  // A CPU tensor over `host` (pinned for speed) to receive into, whose
  // bytes go to a new tensor on `device` chunk by chunk as they arrive.
  // The returned tensor's storage carries the landing.
  static Tensor receive_into(Tensor host, Device device,
                             size_t chunk_bytes = DeviceStager::kChunkBytes);
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
  DeviceLanding(Tensor host, Device device, size_t chunk_bytes)
      : host_(std::move(host)),
        device_(device),
        chunk_(std::max<size_t>(chunk_bytes, 1)) {}
  // Copies bytes [copied_, end) to the device tensor (made on first use).
  void copy_to(size_t end);

  const Tensor host_;
  const Device device_;
  const size_t chunk_;
  // Touched by the reading thread, then (the frame handed on) by the pool.
  Tensor device_tensor_;
  size_t copied_ = 0;
  size_t copies_ = 0;
  bool failed_ = false;
};

}  // namespace switchboard::agents::channel
