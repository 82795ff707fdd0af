#include "core/tensor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>

#include "common/check.h"
#include "core/tensor_internal.h"

namespace switchboard {

using tensor_internal::check_strides;
using tensor_internal::checked_numel;
using tensor_internal::view_extent_bytes;

// ---------------------------------------------------------------------------
// Shapes and byte extents

namespace {

int64_t checked_mul(int64_t a, int64_t b, const char* what, const Tensor::Shape& shape) {
  int64_t out = 0;
  SB_REQUIRE(!__builtin_mul_overflow(a, b, &out), "{}: shape {} overflows int64", what,
             shape_str(shape));
  return out;
}

size_t checked_nbytes(int64_t numel, size_t element_size, const char* what,
                      const Tensor::Shape& shape) {
  size_t out = 0;
  SB_REQUIRE(!__builtin_mul_overflow(static_cast<size_t>(numel), element_size, &out),
             "{}: shape {} of {}-byte elements overflows size_t", what, shape_str(shape),
             element_size);
  return out;
}

}  // namespace

// Element count of a shape; `what` names the caller in errors.
int64_t tensor_internal::checked_numel(const Tensor::Shape& shape, const char* what) {
  int64_t count = 1;
  for (int64_t extent : shape) {
    SB_REQUIRE(extent >= 0, "{}: negative extent {} in shape {}", what, extent,
               shape_str(shape));
    count = checked_mul(count, extent, what, shape);
  }
  return count;
}

// Bytes from the first element to one past the last element a view touches
// (0 for an empty view). Strides must be non-negative.
size_t tensor_internal::view_extent_bytes(const Tensor::Shape& shape,
                                          const Tensor::Shape& strides,
                                          size_t element_size, const char* what) {
  if (checked_numel(shape, what) == 0) return 0;
  int64_t count = 1;  // elements up to and including the last one
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t step = checked_mul(shape[i] - 1, strides[i], what, shape);
    SB_REQUIRE(!__builtin_add_overflow(count, step, &count),
               "{}: shape {} with strides {} overflows int64", what, shape_str(shape),
               shape_str(strides));
  }
  return checked_nbytes(count, element_size, what, shape);
}

void tensor_internal::check_strides(const Tensor::Shape& shape,
                                    const Tensor::Shape& strides, const char* what) {
  SB_REQUIRE(strides.size() == shape.size(),
             "{}: strides {} have {} dimensions, shape {} has {}", what,
             shape_str(strides), strides.size(), shape_str(shape), shape.size());
  for (int64_t stride : strides) {
    SB_REQUIRE(stride >= 0, "{}: negative strides {} are not supported", what,
               shape_str(strides));
  }
}

namespace {

void check_device(Device device, const char* what) {
  if (device.is_cpu()) {
    SB_REQUIRE(device.index == 0, "{}: CPU device index must be 0, got {}", what,
               device.index);
  } else {
    SB_REQUIRE(device.is_cuda() && device.index >= 0,
               "{}: invalid device (type {}, index {})", what,
               static_cast<int>(device.type), device.index);
  }
}

// Calls fn(element_offset) for every element of a view, in row-major order.
template <typename Fn>
void for_each_element(const Tensor::Shape& shape, const Tensor::Shape& strides, Fn fn) {
  if (Tensor::numel_of(shape) == 0) return;
  std::vector<int64_t> index(shape.size(), 0);
  int64_t offset = 0;
  while (true) {
    fn(offset);
    size_t d = shape.size();
    while (d > 0) {
      --d;
      if (++index[d] < shape[d]) {
        offset += strides[d];
        break;
      }
      offset -= strides[d] * (shape[d] - 1);
      index[d] = 0;
      if (d == 0) return;
    }
    if (shape.empty()) return;
  }
}

// ---------------------------------------------------------------------------
// Allocation

constexpr size_t kCpuAlignment = 64;

std::shared_ptr<Storage> allocate_cpu(size_t nbytes) {
  // Never zero bytes, so that even an empty tensor has a real address.
  size_t padded =
      (std::max<size_t>(nbytes, 1) + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
  void* data = ::operator new (padded, std::align_val_t{kCpuAlignment});
  std::shared_ptr<void> owner(
      data, [](void* p) { ::operator delete (p, std::align_val_t{kCpuAlignment}); });
  return std::make_shared<Storage>(std::move(owner), data, nbytes, Device::cpu());
}

}  // namespace

std::string shape_str(const Tensor::Shape& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// ---------------------------------------------------------------------------
// Tensor: construction

Tensor::Tensor(std::shared_ptr<Storage> storage, size_t offset, Shape shape,
               Shape strides, DType dtype)
    : storage_(std::move(storage)),
      offset_(offset),
      shape_(std::move(shape)),
      strides_(std::move(strides)),
      dtype_(dtype) {}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  check_device(device, "Tensor::empty");
  size_t element_size = tensor_internal::element_size(dtype, "Tensor::empty");
  size_t nbytes = checked_nbytes(checked_numel(shape, "Tensor::empty"), element_size,
                                 "Tensor::empty", shape);
  auto storage = device.is_cpu() ? allocate_cpu(nbytes)
                                 : tensor_internal::allocate_device(nbytes, device);
  return Tensor(std::move(storage), 0, shape, contiguous_strides(shape), dtype);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  std::memset(t.data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, Device device,
                         std::shared_ptr<void> owner, Shape strides) {
  constexpr const char* kWhat = "Tensor::from_blob";
  check_device(device, kWhat);
  size_t element_size = tensor_internal::element_size(dtype, kWhat);
  if (strides.empty() && !shape.empty()) strides = contiguous_strides(shape);
  check_strides(shape, strides, kWhat);
  size_t extent = view_extent_bytes(shape, strides, element_size, kWhat);
  SB_REQUIRE(data != nullptr || extent == 0, "{}: null data for a {} view of {} bytes",
             kWhat, shape_str(shape), extent);
  auto storage = std::make_shared<Storage>(std::move(owner), data, extent, device);
  return Tensor(std::move(storage), 0, shape, std::move(strides), dtype);
}

// ---------------------------------------------------------------------------
// Tensor: accessors

DType Tensor::dtype() const {
  require_defined("dtype");
  return dtype_;
}

const Tensor::Shape& Tensor::shape() const {
  require_defined("shape");
  return shape_;
}

const Tensor::Shape& Tensor::strides() const {
  require_defined("strides");
  return strides_;
}

int64_t Tensor::dim() const {
  require_defined("dim");
  return static_cast<int64_t>(shape_.size());
}

Device Tensor::device() const {
  require_defined("device");
  return storage_->device();
}

int64_t Tensor::numel() const {
  require_defined("numel");
  return numel_of(shape_);
}

size_t Tensor::element_size() const {
  require_defined("element_size");
  return dtype_size(dtype_);
}

size_t Tensor::nbytes() const { return static_cast<size_t>(numel()) * element_size(); }

bool Tensor::is_contiguous() const {
  require_defined("is_contiguous");
  if (numel_of(shape_) == 0) return true;
  int64_t expected = 1;
  for (size_t d = shape_.size(); d-- > 0;) {
    if (shape_[d] == 1) continue;  // a size-1 dimension's stride never matters
    if (strides_[d] != expected) return false;
    expected *= shape_[d];
  }
  return true;
}

void* Tensor::data() const {
  require_defined("data");
  auto* base = static_cast<char*>(storage_->data());
  return base == nullptr ? nullptr : base + offset_;
}

const std::shared_ptr<Storage>& Tensor::storage() const {
  require_defined("storage");
  return storage_;
}

size_t Tensor::storage_offset_bytes() const {
  require_defined("storage_offset_bytes");
  return offset_;
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined tensor";
  return fmt::format("{}{} on {}", dtype_name(dtype_), shape_str(shape_), device().str());
}

// ---------------------------------------------------------------------------
// Tensor: operations

Tensor Tensor::clone() const {
  require_defined("clone");
  SB_REQUIRE(device().is_cpu(), "Tensor::clone: needs a CPU tensor, got {}", describe());
  Tensor out = empty(shape_, dtype_);
  if (is_contiguous()) {
    if (nbytes() > 0) std::memcpy(out.data(), data(), nbytes());
    return out;
  }
  size_t size = element_size();
  const auto* src = static_cast<const char*>(data());
  auto* dst = static_cast<char*>(out.data());
  for_each_element(shape_, strides_, [&](int64_t offset) {
    std::memcpy(dst, src + offset * static_cast<int64_t>(size), size);
    dst += size;
  });
  return out;
}

Tensor Tensor::reshape(const Shape& shape) const {
  require_defined("reshape");
  int64_t count = checked_numel(shape, "Tensor::reshape");
  SB_REQUIRE(count == numel(),
             "Tensor::reshape: shape {} has {} elements, tensor {}{} has {}",
             shape_str(shape), count, dtype_name(dtype_), shape_str(shape_), numel());
  SB_REQUIRE(is_contiguous(),
             "Tensor::reshape: needs a contiguous tensor, got {} with "
             "strides {}",
             describe(), shape_str(strides_));
  return Tensor(storage_, offset_, shape, contiguous_strides(shape), dtype_);
}

Tensor Tensor::narrow0(int64_t start, int64_t length) const {
  require_defined("narrow0");
  SB_REQUIRE(!shape_.empty(), "Tensor::narrow0: needs at least one dimension, got {}",
             describe());
  SB_REQUIRE(is_contiguous(),
             "Tensor::narrow0: needs a contiguous tensor, got {} with "
             "strides {}",
             describe(), shape_str(strides_));
  SB_REQUIRE(start >= 0 && length >= 0 && start <= shape_[0] - length,
             "Tensor::narrow0: rows [{}, {} + {}) out of range for {}", start, start,
             length, describe());
  Shape shape = shape_;
  shape[0] = length;
  size_t offset = offset_ + static_cast<size_t>(start * strides_[0]) * element_size();
  return Tensor(storage_, offset, std::move(shape), strides_, dtype_);
}

void Tensor::copy_from(const Tensor& src) {
  require_cpu_contiguous("copy_from");
  src.require_cpu_contiguous("copy_from (source)");
  SB_REQUIRE(src.dtype_ == dtype_ && src.numel() == numel(),
             "Tensor::copy_from: source {} does not match destination {} (dtype and "
             "element count must be equal)",
             src.describe(), describe());
  if (nbytes() > 0) std::memmove(data(), src.data(), nbytes());
}

Tensor Tensor::to(Device device) const {
  SB_REQUIRE(defined(), "Tensor::to({}): the tensor is undefined", device.str());
  SB_REQUIRE(is_contiguous(), "Tensor::to({}): {} is not contiguous", device.str(),
             describe());
  if (device.is_cpu() && this->device().is_cpu()) return clone();
  DeviceCopier copier = tensor_internal::registered_copier();
  SB_REQUIRE(copier != nullptr,
             "Tensor::to: cannot copy {} to {}: no device copier is registered (link "
             "//core:cuda_allocator)",
             describe(), device.str());
  Tensor out = empty(shape_, dtype_, device);
  copier(out, *this);
  return out;
}

bool Tensor::equal(const Tensor& other) const {
  require_cpu_contiguous("equal");
  other.require_cpu_contiguous("equal (other)");
  if (dtype_ != other.dtype_ || shape_ != other.shape_) return false;
  auto n = static_cast<size_t>(numel());
  auto compare = [&](auto convert, auto* a, auto* b) {
    for (size_t i = 0; i < n; ++i) {
      if (convert(a[i]) != convert(b[i])) return false;
    }
    return true;
  };
  auto same = [](auto x) { return x; };
  switch (dtype_) {  // floats compare by value: nan != nan, -0 == +0
    case DType::kFloat16:
      return compare(half_to_float, data_as<uint16_t>(), other.data_as<uint16_t>());
    case DType::kBFloat16:
      return compare(bfloat16_to_float, data_as<uint16_t>(), other.data_as<uint16_t>());
    case DType::kFloat32:
      return compare(same, data_as<float>(), other.data_as<float>());
    case DType::kFloat64:
      return compare(same, data_as<double>(), other.data_as<double>());
    default:
      return n == 0 || std::memcmp(data(), other.data(), nbytes()) == 0;
  }
}

int64_t Tensor::numel_of(const Shape& shape) {
  return checked_numel(shape, "Tensor::numel_of");
}

Tensor::Shape Tensor::contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t stride = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    strides[d] = stride;
    // As PyTorch: empty dims count as 1, and an overflow is an error (a
    // zero-element shape may still have huge other extents).
    if (d > 0 && __builtin_mul_overflow(stride, std::max<int64_t>(shape[d], 1), &stride)) {
      throw std::invalid_argument(
          fmt::format("Tensor: the strides of shape {} overflow int64", shape_str(shape)));
    }
  }
  return strides;
}

// ---------------------------------------------------------------------------
// Tensor: checks

void Tensor::check_vector_size(const Shape& shape, size_t size) {
  int64_t count = checked_numel(shape, "Tensor::from_vector");
  SB_REQUIRE(static_cast<uint64_t>(count) == size,
             "Tensor::from_vector: shape {} has {} elements, got {} values",
             shape_str(shape), count, size);
}

void Tensor::require_defined(const char* what) const {
  SB_REQUIRE(defined(), "Tensor::{}: undefined tensor", what);
}

void Tensor::require_element_type(DType expected, size_t size, const char* what) const {
  SB_REQUIRE(dtype_ == expected, "Tensor::{}: requested {} elements, tensor is {}", what,
             dtype_name(expected), describe());
  SB_REQUIRE(dtype_size(dtype_) == size,
             "Tensor::{}: requested {}-byte elements, tensor is {}", what, size,
             describe());
}

void Tensor::require_cpu_contiguous(const char* what) const {
  require_defined(what);
  SB_REQUIRE(device().is_cpu(), "Tensor::{}: needs a CPU tensor, got {}", what,
             describe());
  SB_REQUIRE(is_contiguous(),
             "Tensor::{}: needs a contiguous tensor, got {} with strides {}", what,
             describe(), shape_str(strides_));
}

}  // namespace switchboard
