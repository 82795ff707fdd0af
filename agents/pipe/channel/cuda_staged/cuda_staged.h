// The cuda_staged channel: tensors with a CUDA device at either end,
// through host memory, their bytes in the frame as the cpu channel's.
//
// Sending, a CUDA tensor is copied into a pinned host buffer of the
// worker's HostBufferCache: one of DeviceStager::kMinBytes or more chunk by
// chunk as the connection sends it (a DeviceStager), a smaller one at once.
// A CPU tensor bound for the peer's device travels as it is.
//
// Receiving, a tensor bound for one of this worker's CUDA devices lands in
// a pinned buffer and is copied to the device (DeviceLanding,
// staging.h): a large one chunk by chunk as its bytes arrive, the rest once
// the frame is complete; a small one lands in a padded buffer copied whole
// (DeviceLanding::kMinCopyBytes says why), at most kMaxPaddedBytes of
// padded buffers live at once, so that a frame of many tiny tensors cannot
// make the worker pin 32 KiB for each byte (past that, unpadded).
//
// Errors: send() throws std::invalid_argument for a CUDA tensor that
// cannot be copied (not contiguous, no device copier registered);
// receive() throws what the copy to the device throws.
// Thread safety: every member function may be called from any thread.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "agents/pipe/channel/channel.h"
#include "core/host_buffer_cache.h"

namespace switchboard::agents::pipe::channel {

class CudaStagedChannel final : public Channel {
 public:
  static constexpr size_t kMaxPaddedBytes = size_t{64} << 20;

  // `buffers` must not be null; `device_count`: this worker's CUDA devices
  // (tensors for others land on the CPU and fail in receive()).
  CudaStagedChannel(std::shared_ptr<HostBufferCache> buffers, int device_count)
      : buffers_(std::move(buffers)), device_count_(device_count) {}

  const char* name() const override { return "cuda_staged"; }
  wire::TensorChannel tag() const override { return wire::TensorChannel::kInline; }
  bool carries(const Ends& ends) const override {
    return !(ends.src.is_cpu() && ends.dst.is_cpu());
  }
  std::string reason(const Ends& ends) const override;

  std::optional<wire::TensorRoute> send(transport::Connection& connection, Tensor& t,
                                        Device dst) override;

  bool receives(wire::TensorChannel tag, Device device) const override {
    return tag == wire::TensorChannel::kInline && !device.is_cpu();
  }
  Tensor allocate(DType dtype, const Tensor::Shape& shape, Device device) override;
  void arrived(const Tensor& tensor, size_t filled) noexcept override;
  // Without CUDA devices nothing lands: no hook on the reads.
  bool follows_arrivals() const override { return device_count_ > 0; }
  Tensor receive(transport::Connection& connection, Arrival arrival) override;

  // Padded landing buffers alive now (for tests).
  size_t padded_bytes() const { return padded_live_->load(); }

 private:
  const std::shared_ptr<HostBufferCache> buffers_;
  const int device_count_;
  // Shared with the padded buffers, which may outlive the channel.
  const std::shared_ptr<std::atomic<size_t>> padded_live_ =
      std::make_shared<std::atomic<size_t>>(0);
};

}  // namespace switchboard::agents::pipe::channel
