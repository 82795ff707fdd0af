#include "agents/pipe/channel/cpu/cpu.h"

namespace switchboard::agents::pipe::channel {

std::string CpuChannel::reason(const Ends& ends) const {
  return carries(ends) ? "CPU to CPU" : "one end is not the CPU";
}

std::optional<wire::TensorRoute> CpuChannel::send(transport::Connection& connection,
                                                  Tensor& t, Device dst) {
  (void)connection;
  (void)dst;
  if (!t.is_contiguous()) t = t.clone();  // contiguous is what travels
  return wire::TensorRoute{};
}

Tensor CpuChannel::allocate(DType dtype, const Tensor::Shape& shape, Device device) {
  (void)device;
  return buffers_->empty(shape, dtype, /*pinned=*/false);
}

Tensor CpuChannel::receive(transport::Connection& connection, Arrival arrival) {
  (void)connection;
  return std::move(arrival.bytes);
}

}  // namespace switchboard::agents::pipe::channel
