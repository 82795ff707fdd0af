#include "core/tensor_descriptor.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "common/check.h"
#include "common/error.h"
#include "core/little_endian.h"

namespace switchboard {
namespace {

constexpr size_t kNumDTypes = std::size(kAllDTypes);

bool describable(Device device) {
  return device.is_cpu() ? device.index == 0
                         : device.is_cuda() && device.index >= 0 &&
                               device.index <= std::numeric_limits<int16_t>::max();
}

// A descriptor's fields as read, before validation.
struct RawDescriptor {
  uint8_t dtype;
  uint8_t device_type;
  int16_t device_index;
  uint32_t ndim;

  static RawDescriptor read(const uint8_t* p) {
    return {p[0], p[1], load_le<int16_t>(p + 2), load_le<uint32_t>(p + 4)};
  }
};

// Decodes one block of descriptors; every error names `source_`.
class BlockDecoder {
 public:
  BlockDecoder(const uint8_t* data, size_t length, uint32_t count,
               const DescriptorSource& source)
      : data_(data), length_(length), count_(count), source_(source) {}

  std::vector<TensorDescriptor> decode();

 private:
  [[noreturn]] void message_error(const std::string& what) const {
    throw ProtocolError(fmt::format("{} {}: {}", source_.label, source_.id, what));
  }
  [[noreturn]] void tensor_error(size_t index, const std::string& what) const {
    throw ProtocolError(
        fmt::format("{} {} tensor {}: {}", source_.label, source_.id, index, what));
  }
  void check_fits(size_t index, size_t pos) const;
  void check_fields(size_t index, const RawDescriptor& d) const;
  size_t checked_nbytes(size_t index, const TensorDescriptor& d) const;

  const uint8_t* data_;
  size_t length_;
  uint32_t count_;
  const DescriptorSource& source_;
};

std::vector<TensorDescriptor> BlockDecoder::decode() {
  if (count_ > kMaxTensorsPerMessage) {
    message_error(fmt::format("tensor_count {} exceeds the limit {}", count_,
                              kMaxTensorsPerMessage));
  }
  std::vector<TensorDescriptor> out;
  // No more than the bytes received can hold (a header may lie about count_).
  out.reserve(std::min<size_t>(count_, length_ / descriptor_size(0)));
  size_t pos = 0;
  for (size_t i = 0; i < count_; ++i) {
    check_fits(i, pos);
    const RawDescriptor raw = RawDescriptor::read(data_ + pos);
    check_fields(i, raw);
    TensorDescriptor& d = out.emplace_back();
    d.dtype = kAllDTypes[raw.dtype];
    d.device = raw.device_type == 0 ? Device::cpu() : Device::cuda(raw.device_index);
    d.ndim = raw.ndim;
    d.extents = data_ + pos + descriptor_size(0);
    d.nbytes = checked_nbytes(i, d);
    pos += descriptor_size(d.ndim);
  }
  if (pos != length_) {
    message_error(fmt::format(
        "descriptors_length {} does not match the {} bytes of the descriptors of its {} "
        "tensors",
        length_, pos, count_));
  }
  return out;
}

// Throws unless a whole descriptor (with its extents) fits in the block from
// byte `pos` on. An ndim over the limit is left to check_fields(), which
// names it.
void BlockDecoder::check_fits(size_t index, size_t pos) const {
  const size_t left = length_ - pos;
  if (left < descriptor_size(0)) {
    message_error(fmt::format(
        "descriptors_length {} is too short for tensor_count {} (tensor {}'s descriptor "
        "starts at byte {})",
        length_, count_, index, pos));
  }
  const uint32_t ndim = RawDescriptor::read(data_ + pos).ndim;
  if (ndim <= kMaxTensorDims && (left - descriptor_size(0)) / 8 < ndim) {
    message_error(fmt::format(
        "descriptors_length {} is too short for tensor {}'s {} extents (its descriptor "
        "starts at byte {})",
        length_, index, ndim, pos));
  }
}

// dtype, device and ndim.
void BlockDecoder::check_fields(size_t index, const RawDescriptor& d) const {
  if (d.dtype >= kNumDTypes) {
    tensor_error(
        index, fmt::format("dtype {} is not a dtype (0 to {})", d.dtype, kNumDTypes - 1));
  }
  if (d.device_type > 1) {
    tensor_error(index, fmt::format("device type {} is not a device type (0 cpu, 1 cuda)",
                                    d.device_type));
  }
  if (d.device_type == 1 && source_.devices == AllowedDevices::kCpuOnly) {
    tensor_error(index,
                 "device type 1 (cuda) is not allowed (this format carries cpu "
                 "tensors only: device type 0)");
  }
  if (d.device_type == 0 && d.device_index != 0) {
    tensor_error(index,
                 fmt::format("device index {} for cpu (must be 0)", d.device_index));
  }
  if (d.device_type == 1 && d.device_index < 0) {
    tensor_error(index,
                 fmt::format("device index {} for cuda is negative", d.device_index));
  }
  if (d.ndim > kMaxTensorDims) {
    tensor_error(index,
                 fmt::format("ndim {} exceeds the limit {}", d.ndim, kMaxTensorDims));
  }
}

// The tensor's byte count. Every extent is non-negative, and neither the
// element count nor the contiguous strides (the product of the extents with
// zeros counted as 1, as PyTorch computes them) overflow: [0, 2^62, 4] has
// no elements but has no strides either.
size_t BlockDecoder::checked_nbytes(size_t index, const TensorDescriptor& d) const {
  int64_t numel = 1;
  int64_t span = 1;
  for (size_t dim = 0; dim < d.ndim; ++dim) {
    const int64_t extent = d.extent(dim);
    if (extent < 0) {
      tensor_error(index,
                   fmt::format("extent {} in dimension {} is negative", extent, dim));
    }
    if (__builtin_mul_overflow(numel, extent, &numel)) {
      tensor_error(
          index, fmt::format("numel of shape {} overflows int64", shape_str(d.shape())));
    }
    if (__builtin_mul_overflow(span, std::max<int64_t>(extent, 1), &span)) {
      tensor_error(index, fmt::format("the strides of shape {} overflow int64",
                                      shape_str(d.shape())));
    }
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(numel), dtype_size(d.dtype),
                             &nbytes) ||
      nbytes > std::numeric_limits<size_t>::max()) {
    tensor_error(index, fmt::format("nbytes of {}{} overflows", dtype_name(d.dtype),
                                    shape_str(d.shape())));
  }
  return static_cast<size_t>(nbytes);
}

}  // namespace

void check_descriptors_length(uint64_t length, uint64_t count, std::string_view where) {
  const uint64_t least = min_descriptors_length(count);
  const uint64_t most = max_descriptors_length(count);
  if (length < least || length > most) {
    throw ProtocolError(fmt::format(
        "{}: descriptors_length {} is out of range for tensor_count {} (must be between {} "
        "and {})",
        where, length, count, least, most));
  }
}

size_t descriptors_length(const std::vector<Tensor>& tensors,
                          const std::vector<Device>& devices, std::string_view caller) {
  SB_REQUIRE(tensors.size() <= kMaxTensorsPerMessage,
             "{}: {} tensors exceed the limit {} per message", caller, tensors.size(),
             kMaxTensorsPerMessage);
  SB_REQUIRE(devices.empty() || devices.size() == tensors.size(),
             "{}: {} devices for {} tensors", caller, devices.size(), tensors.size());
  size_t length = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    const Device device = devices.empty() ? t.device() : devices[i];
    SB_REQUIRE(t.dim() <= kMaxTensorDims,
               "{}: tensor {} ({}) has {} dimensions (the limit is {})", caller, i,
               t.describe(), t.dim(), kMaxTensorDims);
    SB_REQUIRE(describable(device),
               "{}: tensor {}: device (type {}, index {}) cannot be sent (cpu index 0, "
               "cuda index 0 to {})",
               caller, i, static_cast<int>(device.type), device.index,
               std::numeric_limits<int16_t>::max());
    length += descriptor_size(static_cast<size_t>(t.dim()));
  }
  return length;
}

uint8_t* encode_descriptors(uint8_t* out, const std::vector<Tensor>& tensors,
                            const std::vector<Device>& devices) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    const Device device = devices.empty() ? t.device() : devices[i];
    out[0] = static_cast<uint8_t>(t.dtype());
    out[1] = device.is_cpu() ? 0 : 1;
    store_le<int16_t>(out + 2, static_cast<int16_t>(device.index));
    store_le<uint32_t>(out + 4, static_cast<uint32_t>(t.dim()));
    out += descriptor_size(0);
    for (int64_t extent : t.shape()) {
      store_le<int64_t>(out, extent);
      out += 8;
    }
  }
  return out;
}

int64_t TensorDescriptor::extent(size_t dim) const {
  return load_le<int64_t>(extents + 8 * dim);
}

void TensorDescriptor::shape_into(Tensor::Shape& shape) const {
  shape.resize(ndim);
  for (size_t dim = 0; dim < ndim; ++dim) shape[dim] = extent(dim);
}

Tensor::Shape TensorDescriptor::shape() const {
  Tensor::Shape shape;
  shape_into(shape);
  return shape;
}

std::vector<TensorDescriptor> decode_descriptors(const uint8_t* data, size_t length,
                                                 uint32_t count,
                                                 const DescriptorSource& source) {
  return BlockDecoder(data, length, count, source).decode();
}

}  // namespace switchboard
