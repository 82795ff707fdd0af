// DeviceStager: a CUDA tensor on its way to another host (the cuda_staged
// channel), copied into a pinned host buffer chunk by chunk as the
// connection takes the bytes (a pipe::ChunkedSource): the connection's
// writer copies the next chunk off the device while the kernel still sends
// the last one, so the device-to-host copy and the send overlap instead of
// following one another.
//
// The copies are the registered device copier's (synchronous, after the
// work already queued on the device's default stream), on uint8 views of
// the two tensors. Holds both tensors until it is destroyed.
//
// Thread safety: as pipe::ChunkedSource (advance() from one thread at a
// time, ready() from any).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

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

}  // namespace switchboard::agents::channel
