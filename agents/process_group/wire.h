// The PROCESS_GROUP agent's wire format and store layout, as constants
// (agents/process_group/agent.h documents the format; it includes this).
#pragma once

#include <cstddef>
#include <cstdint>

// Constants of the wire format and the store layout (for tests and for
// anyone writing a compatible peer).
namespace switchboard::agents::process_group::wire {

inline constexpr uint32_t kMagic = 0x47504253;  // "SBPG" little endian
inline constexpr uint8_t kVersion = 1;
inline constexpr size_t kHeaderSize = 40;
inline constexpr int kHeaderTag = 0;
inline constexpr int kDataTag = 1;
inline constexpr const char* kStorePrefix = "rpc/pg_agent";
inline constexpr const char* kGroupName = "rpc";
// Store keys (rendezvous/rounds.h): "rpc/names/<rank>", and the join
// rounds under kScope ("rpc/join/<generation>/<rank>").
inline constexpr const char* kNamesKey = "rpc/names/";
inline constexpr const char* kScope = "rpc/";
// Limits a receiver enforces on a header (larger is a protocol error). The
// tensor limits are those of every format: kMaxTensorsPerMessage and
// kMaxTensorDims in core/tensor_descriptor.h.
inline constexpr uint32_t kMaxFunctionLength = 64 * 1024;
}  // namespace switchboard::agents::process_group::wire
