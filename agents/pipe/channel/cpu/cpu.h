// The cpu channel: CPU tensors to a CPU at the peer, their bytes in the
// frame after its descriptors (which the same-host lane carries through
// shared memory when it is on). Received tensors of 1 MiB and more come
// from the worker's HostBufferCache (core/host_buffer_cache.h).
//
// Thread safety: every member function may be called from any thread.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "agents/pipe/channel/channel.h"
#include "core/host_buffer_cache.h"

namespace switchboard::agents::pipe::channel {

class CpuChannel final : public Channel {
 public:
  // `buffers` must not be null.
  explicit CpuChannel(std::shared_ptr<HostBufferCache> buffers)
      : buffers_(std::move(buffers)) {}

  const char* name() const override { return "cpu"; }
  wire::TensorChannel tag() const override { return wire::TensorChannel::kInline; }
  bool carries(const Ends& ends) const override {
    return ends.src.is_cpu() && ends.dst.is_cpu();
  }
  std::string reason(const Ends& ends) const override;

  // A non-contiguous tensor travels as a contiguous copy.
  std::optional<wire::TensorRoute> send(transport::Connection& connection, Tensor& t,
                                        Device dst) override;

  bool receives(wire::TensorChannel tag, Device device) const override {
    return tag == wire::TensorChannel::kInline && device.is_cpu();
  }
  Tensor allocate(DType dtype, const Tensor::Shape& shape, Device device) override;
  // The tensor as the frame brought it.
  Tensor receive(transport::Connection& connection, Arrival arrival) override;

 private:
  const std::shared_ptr<HostBufferCache> buffers_;
};

}  // namespace switchboard::agents::pipe::channel
