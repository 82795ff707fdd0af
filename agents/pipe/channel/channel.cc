#include "agents/pipe/channel/channel.h"

#include <fmt/format.h>

#include <stdexcept>

#include "common/error.h"

namespace switchboard::agents::pipe::channel {

Tensor Channel::allocate(DType dtype, const Tensor::Shape& shape, Device device) {
  (void)shape;
  throw std::logic_error(
      fmt::format("the {} channel receives no tensor inline ({} on {})", name(),
                  dtype_name(dtype), device.str()));
}

void Channel::on_message(const transport::Connection& connection,
                         std::span<const uint8_t> message) {
  (void)connection;
  throw ProtocolError(fmt::format("the {} channel has no messages (one of {} bytes came)",
                                  name(), message.size()));
}

void Channel::send_message(transport::Connection& connection,
                           std::span<const uint8_t> message) const {
  std::vector<uint8_t> payload;
  payload.reserve(message.size() + 1);
  payload.push_back(static_cast<uint8_t>(tag()));
  payload.insert(payload.end(), message.begin(), message.end());
  connection.enqueue_control(wire::FrameKind::kChannel, payload.data(), payload.size());
}

}  // namespace switchboard::agents::pipe::channel
