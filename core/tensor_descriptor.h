// Tensor descriptors: the bytes that tell a receiver the dtype, device and
// shape of each tensor a message carries, and the limits on them. One codec
// for both frame formats, PIPE (agents/pipe/wire/frame.h) and PROCESS_GROUP
// (agents/process_group/frame.h); docs/wire_formats.md, "Tensor
// descriptors", is the reference for peers.
//
// Wire format (every integer little endian), descriptor_size(ndim) =
// 8 + 8 * ndim bytes:
//
//   u8  dtype         the DType enum's value (kAllDTypes order)
//   u8  device type   0 cpu, 1 cuda
//   i16 device index  0 for cpu, 0..32767 for cuda
//   u32 ndim          at most kMaxTensorDims
//   ndim x i64 extents, each >= 0
//
// A message's descriptors are one block of descriptors_length bytes that
// holds its tensor_count descriptors back to back, with nothing before,
// between or after them.
//
// Errors: bad bytes from a peer throw ProtocolError (common/error.h) naming
// the message, the tensor, the field, its value and the limit it broke, e.g.
// "pipe frame: frame 7 tensor 1: ndim 65 exceeds the limit 64". Local
// mistakes (tensors that cannot be described) throw std::invalid_argument.
//
// Thread safety: pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace switchboard {

// The limits of both formats, checked by every encoder and decoder.
//
// Most dimensions a tensor may have: NumPy 2's limit, and the larger of the
// two limits the formats had (32 and 64), so nothing either accepted is
// refused.
inline constexpr uint32_t kMaxTensorDims = 64;
// Most tensors one message may carry: the smaller of the two the formats
// had (65,536 and 2^20). It bounds what a hostile header can announce; see
// kMaxDescriptorsLength.
inline constexpr uint32_t kMaxTensorsPerMessage = 65536;

// Bytes on the wire for one descriptor of `ndim` dimensions.
constexpr size_t descriptor_size(size_t ndim) { return 8 + 8 * ndim; }

// The fewest and the most bytes `count` descriptors take: a header whose
// descriptors_length is outside this range is refused before the body is
// read.
constexpr uint64_t min_descriptors_length(uint64_t count) {
  return count * descriptor_size(0);
}
constexpr uint64_t max_descriptors_length(uint64_t count) {
  return count * descriptor_size(kMaxTensorDims);
}

// Throws ProtocolError, starting with `where` (e.g. "pipe frame"), unless a
// header's `length` of descriptor bytes lies between
// min_descriptors_length(count) and max_descriptors_length(count): the
// check every format makes before it reads the body.
void check_descriptors_length(uint64_t length, uint64_t count, std::string_view where);

// The most descriptor bytes a valid header can announce: 34,078,720 (32.5
// MiB), which fits PIPE's u32 descriptors_length field.
inline constexpr uint64_t kMaxDescriptorsLength =
    max_descriptors_length(kMaxTensorsPerMessage);
static_assert(kMaxDescriptorsLength <= std::numeric_limits<uint32_t>::max());

// ---------------------------------------------------------------- encoding

// Checks that `tensors` can be described and returns the bytes their
// descriptors take (the sum of descriptor_size(t.dim())). `devices` is what
// the descriptors will name: devices[i] for tensors[i], or each tensor's own
// device when `devices` is empty. Neither is retained. Throws
// std::invalid_argument, starting with `caller` and naming the tensor's
// index where one is at fault, for: more than kMaxTensorsPerMessage tensors,
// devices.size() != tensors.size() (when not empty), a tensor with more than
// kMaxTensorDims dimensions, or a device a descriptor cannot name (cpu with
// an index other than 0, cuda with an index outside 0..32767). Undefined
// tensors are the caller's to refuse first.
size_t descriptors_length(const std::vector<Tensor>& tensors,
                          const std::vector<Device>& devices, std::string_view caller);

// Writes the descriptors of `tensors` at `out`, naming devices[i] (or each
// tensor's own device when `devices` is empty), and returns the end: out +
// descriptors_length(tensors, devices, ...) bytes, which the caller checked
// first.
uint8_t* encode_descriptors(uint8_t* out, const std::vector<Tensor>& tensors,
                            const std::vector<Device>& devices);

// ---------------------------------------------------------------- decoding

// Which devices a format's descriptors may name.
enum class AllowedDevices {
  kCpuOnly,     // PROCESS_GROUP
  kCpuAndCuda,  // PIPE
};

// The message whose descriptors are decoded, for error messages and rules.
struct DescriptorSource {
  // Names the message in errors as "<label> <id>", e.g. label "pipe frame:
  // frame" and id 7 give "pipe frame: frame 7 tensor 1: ...".
  std::string_view label;
  uint64_t id = 0;
  AllowedDevices devices = AllowedDevices::kCpuAndCuda;
};

// One decoded and validated descriptor. A view: `extents` points into the
// bytes it was decoded from and is valid as long as they are.
struct TensorDescriptor {
  DType dtype = DType::kUInt8;
  Device device;
  uint32_t ndim = 0;                 // <= kMaxTensorDims
  const uint8_t* extents = nullptr;  // ndim little-endian i64, each >= 0
  // numel x element size. Neither it, the element count nor the contiguous
  // strides overflow (int64, and size_t for the bytes).
  size_t nbytes = 0;

  int64_t extent(size_t dim) const;
  // Assigns the extents to `shape`, reusing its storage.
  void shape_into(Tensor::Shape& shape) const;
  Tensor::Shape shape() const;
};

// Decodes and validates the `count` descriptors in the `length` bytes at
// `data` (not retained; the descriptors returned point into it). Allocates
// nothing but the vector returned. Throws ProtocolError naming `source` for:
// count over kMaxTensorsPerMessage; a descriptor that does not fit in what
// is left of `length` (truncated) or bytes left after the last one; a dtype
// that is not a DType; a device type other than cpu or cuda (or cuda where
// source.devices is kCpuOnly); a cpu index other than 0 or a negative cuda
// index; ndim over kMaxTensorDims; a negative extent; an element count,
// contiguous strides or byte count that overflows.
std::vector<TensorDescriptor> decode_descriptors(const uint8_t* data, size_t length,
                                                 uint32_t count,
                                                 const DescriptorSource& source);

}  // namespace switchboard
