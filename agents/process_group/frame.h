// The PROCESS_GROUP agent's frames: how a Message becomes a fixed-size
// header tensor and a body tensor (function name, payload, tensor
// descriptors), and back. Private to //agents/process_group. The
// layout is documented in agents/process_group/agent.h (wire.h).
//
// Decoding validates everything it reads and throws ProtocolError
// (common/error.h) for bad bytes from a peer (never for local mistakes).
// Tensor descriptors and their limits are core/tensor_descriptor.h's,
// shared with PIPE; a descriptor here must name the CPU. encode_frame()
// throws std::invalid_argument for tensors over those limits.
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <utility>

#include "core/tensor.h"
#include "common/error.h"
#include "core/message.h"

namespace switchboard::agents::process_group::wire {

using rpc::Message;
using rpc::MessageType;

constexpr uint64_t kMaxPayloadLength = uint64_t{1} << 40;

// Flags (the header's u16 after the type): kFlagTimeout (requests) says
// that the body starts with the caller's timeout, a u64 of milliseconds.
inline constexpr uint16_t kFlagTimeout = 0x1;

struct Header {
  MessageType type = MessageType::kRequest;
  uint16_t flags = 0;
  uint64_t id = 0;
  uint32_t function_length = 0;
  uint32_t tensor_count = 0;
  uint64_t payload_length = 0;
  uint64_t descriptors_length = 0;

  uint64_t body_length() const {
    return ((flags & kFlagTimeout) ? 8 : 0) + function_length + payload_length +
           descriptors_length;
  }
};

uint8_t* bytes_of(const Tensor& t);
// The header and the body of `m` (body undefined when empty).
std::pair<Tensor, Tensor> encode_frame(const Message& m);
Header decode_header(const Tensor& header);
// A CPU tensor for received bytes; ProtocolError when it cannot be had.
Tensor allocate(const Tensor::Shape& shape, DType dtype);
// Fills m.function, m.payload and m.tensors (allocated, not yet received).
void decode_body(const Header& h, const Tensor& body, Message& m);

}  // namespace switchboard::agents::process_group::wire
