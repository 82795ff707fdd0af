#include "core/tensor.h"

#include <dlpack/dlpack.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstring>
#include <iterator>
#include <new>
#include <utility>

#include "common/check.h"
#include "common/mutex.h"

namespace switchboard {
namespace {

// ---------------------------------------------------------------------------
// DTypes

struct DTypeInfo {
  std::string_view name;
  size_t size;
  bool floating;
};

// Indexed by the enum's value; keep in declaration order.
constexpr DTypeInfo kDTypeInfo[] = {
    {"float16", 2, true}, {"bfloat16", 2, true}, {"float32", 4, true},
    {"float64", 8, true}, {"int8", 1, false},    {"uint8", 1, false},
    {"int32", 4, false},  {"int64", 8, false},   {"bool", 1, false},
};
static_assert(std::size(kDTypeInfo) == std::size(kAllDTypes));

const DTypeInfo& dtype_info(DType dtype, const char* what) {
  auto index = static_cast<size_t>(dtype);
  SB_REQUIRE(index < std::size(kDTypeInfo), "{}: invalid dtype value {}", what, index);
  return kDTypeInfo[index];
}

// DLPack 0.6 has no boolean type code; DLPack >= 0.8 defines kDLBool = 6
// (8 bits per element, 0 or 1), which is what PyTorch exports for torch.bool.
constexpr uint8_t kDLBoolCode = 6;

// ---------------------------------------------------------------------------
// Shapes and byte extents

int64_t checked_mul(int64_t a, int64_t b, const char* what, const Tensor::Shape& shape) {
  int64_t out = 0;
  SB_REQUIRE(!__builtin_mul_overflow(a, b, &out), "{}: shape {} overflows int64", what,
             shape_str(shape));
  return out;
}

// Element count of a shape; `what` names the caller in errors.
int64_t checked_numel(const Tensor::Shape& shape, const char* what) {
  int64_t count = 1;
  for (int64_t extent : shape) {
    SB_REQUIRE(extent >= 0, "{}: negative extent {} in shape {}", what, extent,
               shape_str(shape));
    count = checked_mul(count, extent, what, shape);
  }
  return count;
}

size_t checked_nbytes(int64_t numel, size_t element_size, const char* what,
                      const Tensor::Shape& shape) {
  size_t out = 0;
  SB_REQUIRE(!__builtin_mul_overflow(static_cast<size_t>(numel), element_size, &out),
             "{}: shape {} of {}-byte elements overflows size_t", what, shape_str(shape),
             element_size);
  return out;
}

// Bytes from the first element to one past the last element a view touches
// (0 for an empty view). Strides must be non-negative.
size_t view_extent_bytes(const Tensor::Shape& shape, const Tensor::Shape& strides,
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

void check_strides(const Tensor::Shape& shape, const Tensor::Shape& strides,
                   const char* what) {
  SB_REQUIRE(strides.size() == shape.size(),
             "{}: strides {} have {} dimensions, shape {} has {}", what,
             shape_str(strides), strides.size(), shape_str(shape), shape.size());
  for (int64_t stride : strides) {
    SB_REQUIRE(stride >= 0, "{}: negative strides {} are not supported", what,
               shape_str(strides));
  }
}

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

struct DeviceHooks {
  DeviceAllocator allocator;
  DeviceCopier copier;
  DeviceCounter counter;
};

struct AllocatorRegistry {
  Mutex mutex;
  // One guarded member, so that the analysis checks the accesses through
  // pointers to DeviceHooks' members below.
  DeviceHooks hooks SB_GUARDED_BY(mutex);
};

AllocatorRegistry& allocator_registry() {
  static AllocatorRegistry registry;
  return registry;
}

// Copies a registered hook out of the registry, so that user code never
// runs under its lock.
template <typename Hook>
Hook current(Hook DeviceHooks::*member) {
  auto& registry = allocator_registry();
  MutexLock lock(registry.mutex);
  return registry.hooks.*member;
}

template <typename Hook>
void install(Hook DeviceHooks::*member, Hook hook) {
  auto& registry = allocator_registry();
  Hook previous;  // destroyed outside the lock
  MutexLock lock(registry.mutex);
  previous = std::exchange(registry.hooks.*member, std::move(hook));
}

DeviceAllocator current_allocator() { return current(&DeviceHooks::allocator); }

std::shared_ptr<Storage> allocate_device(size_t nbytes, Device device) {
  DeviceAllocator allocator = current_allocator();
  SB_REQUIRE(allocator != nullptr,
             "Tensor::empty: no allocator for {} (link //core:cuda_allocator)",
             device.str());
  std::shared_ptr<void> owner = allocator(nbytes, device);
  SB_ASSERT(owner != nullptr || nbytes == 0,
            "the device allocator returned null for {} bytes on {}", nbytes,
            device.str());
  void* data = owner.get();
  return std::make_shared<Storage>(std::move(owner), data, nbytes, device);
}

// ---------------------------------------------------------------------------
// DLPack

DType dtype_from_dlpack(const DLDataType& type) {
  SB_REQUIRE(type.lanes == 1,
             "Tensor::from_dlpack: DLPack dtype (code {}, bits {}) has {} lanes; only 1 "
             "is supported",
             type.code, type.bits, type.lanes);
  switch (type.code) {
    case kDLFloat:
      if (type.bits == 16) return DType::kFloat16;
      if (type.bits == 32) return DType::kFloat32;
      if (type.bits == 64) return DType::kFloat64;
      break;
    case kDLBfloat:
      if (type.bits == 16) return DType::kBFloat16;
      break;
    case kDLInt:
      if (type.bits == 8) return DType::kInt8;
      if (type.bits == 32) return DType::kInt32;
      if (type.bits == 64) return DType::kInt64;
      break;
    case kDLUInt:
      if (type.bits == 8) return DType::kUInt8;
      break;
    case kDLBoolCode:
      if (type.bits == 8) return DType::kBool;
      break;
    default:
      break;
  }
  SB_REQUIRE(false, "Tensor::from_dlpack: unsupported DLPack dtype (code {}, bits {})",
             type.code, type.bits);
  return DType::kFloat32;  // unreachable
}

DLDataType dtype_to_dlpack(DType dtype) {
  DLDataType type{};
  type.lanes = 1;
  type.bits = static_cast<uint8_t>(dtype_size(dtype) * 8);
  switch (dtype) {
    case DType::kFloat16:
    case DType::kFloat32:
    case DType::kFloat64:
      type.code = kDLFloat;
      break;
    case DType::kBFloat16:
      type.code = kDLBfloat;
      break;
    case DType::kInt8:
    case DType::kInt32:
    case DType::kInt64:
      type.code = kDLInt;
      break;
    case DType::kUInt8:
      type.code = kDLUInt;
      break;
    case DType::kBool:
      type.code = kDLBoolCode;
      break;
  }
  return type;
}

Device device_from_dlpack(const DLDevice& device) {
  if (device.device_type == kDLCPU) return Device::cpu();
  SB_REQUIRE(device.device_type == kDLCUDA,
             "Tensor::from_dlpack: unsupported DLPack device type {} (supported: kDLCPU "
             "= 1, kDLCUDA = 2)",
             static_cast<int>(device.device_type));
  SB_REQUIRE(device.device_id >= 0, "Tensor::from_dlpack: negative CUDA device id {}",
             device.device_id);
  return Device::cuda(device.device_id);
}

// What an exported DLManagedTensor points at: the storage reference and the
// shape/strides arrays. Freed by delete_export.
struct ExportContext {
  DLManagedTensor managed{};
  std::shared_ptr<Storage> storage;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
};

void delete_export(DLManagedTensor* self) {
  if (self != nullptr) delete static_cast<ExportContext*>(self->manager_ctx);
}

}  // namespace

// ---------------------------------------------------------------------------
// DTypes and conversions

size_t dtype_size(DType dtype) { return dtype_info(dtype, "dtype_size").size; }

std::string_view dtype_name(DType dtype) { return dtype_info(dtype, "dtype_name").name; }

bool is_floating(DType dtype) { return dtype_info(dtype, "is_floating").floating; }

DType parse_dtype(std::string_view name) {
  for (DType dtype : kAllDTypes) {
    if (dtype_name(dtype) == name) return dtype;
  }
  std::vector<std::string_view> names;
  for (DType dtype : kAllDTypes) names.push_back(dtype_name(dtype));
  SB_REQUIRE(false, "parse_dtype: unknown dtype \"{}\" (expected one of {})", name,
             fmt::join(names, ", "));
  return DType::kFloat32;  // unreachable
}

float half_to_float(uint16_t bits) {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1Fu;
  uint32_t mantissa = bits & 0x3FFu;
  uint32_t out = 0;
  if (exponent == 0x1F) {  // inf or nan (payload kept)
    out = sign | 0x7F800000u | (mantissa << 13);
  } else if (exponent != 0) {  // normal: rebias 15 -> 127
    out = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {  // signed zero
    out = sign;
  } else {             // subnormal: value = mantissa * 2^-24; normalize
    uint32_t e = 113;  // biased float exponent of 2^-14
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --e;
    }
    out = sign | (e << 23) | ((mantissa & 0x3FFu) << 13);
  }
  return std::bit_cast<float>(out);
}

uint16_t float_to_half(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) {  // nan: keep the top payload bits, force quiet
    return static_cast<uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));
  }
  // 65520 (0x477FF000) is halfway between 65504 and 2^16 and rounds to even,
  // i.e. up to infinity; so does everything above it.
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);
  uint32_t half = 0;
  if (abs >= 0x38800000u) {                 // normal half: >= 2^-14
    uint32_t rebiased = abs - 0x38000000u;  // exponent 127 -> 15
    half = rebiased >> 13;
    uint32_t rest = rebiased & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // may carry
  } else if (abs > 0x33000000u) {  // subnormal half: > 2^-25 (2^-25 ties to 0)
    uint32_t mantissa = (abs & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 126 - (abs >> 23);  // 14..24: units of 2^-24
    half = mantissa >> shift;
    uint32_t rest = mantissa & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
  }
  return static_cast<uint16_t>(sign | half);
}

float bfloat16_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

uint16_t float_to_bfloat16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {  // nan: truncate, force quiet
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  // Round to nearest even; a carry out of the mantissa bumps the exponent,
  // which turns values past the largest bfloat16 into infinity.
  uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

// ---------------------------------------------------------------------------
// Devices

Device Device::parse(std::string_view text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  constexpr std::string_view kPrefix = "cuda:";
  if (text.starts_with(kPrefix) && text.size() > kPrefix.size()) {
    std::string_view digits = text.substr(kPrefix.size());
    int index = -1;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (ec == std::errc() && end == digits.data() + digits.size() && index >= 0 &&
        digits[0] != '+') {
      return cuda(index);
    }
  }
  SB_REQUIRE(false, "Device::parse: expected \"cpu\", \"cuda\" or \"cuda:N\", got \"{}\"",
             text);
  return cpu();  // unreachable
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : fmt::format("cuda:{}", index);
}

void set_device_allocator(DeviceAllocator allocator) {
  install(&DeviceHooks::allocator, std::move(allocator));
}

bool has_device_allocator() { return current_allocator() != nullptr; }

void set_device_copier(DeviceCopier copier) {
  install(&DeviceHooks::copier, std::move(copier));
}

bool has_device_copier() { return current(&DeviceHooks::copier) != nullptr; }

void set_device_counter(DeviceCounter counter) {
  install(&DeviceHooks::counter, std::move(counter));
}

namespace {
struct PinnerRegistry {
  Mutex mutex;
  HostPinner pinner SB_GUARDED_BY(mutex);
};
PinnerRegistry& pinner_registry() {
  static PinnerRegistry registry;
  return registry;
}
}  // namespace

void set_host_pinner(HostPinner pinner) {
  PinnerRegistry& registry = pinner_registry();
  MutexLock lock(registry.mutex);
  registry.pinner = std::move(pinner);
}

HostPinner host_pinner() {
  PinnerRegistry& registry = pinner_registry();
  MutexLock lock(registry.mutex);
  return registry.pinner;
}

void copy_bytes(const Tensor& dst, const Tensor& src) {
  SB_REQUIRE(dst.defined() && src.defined() && dst.dtype() == src.dtype() &&
                 dst.numel() == src.numel() && dst.is_contiguous() && src.is_contiguous(),
             "copy_bytes: {} into {} (both contiguous, equal dtype and element count)",
             src.describe(), dst.describe());
  if (dst.device().is_cpu() && src.device().is_cpu()) {
    if (dst.nbytes() > 0) std::memmove(dst.data(), src.data(), dst.nbytes());
    return;
  }
  DeviceCopier copier = current(&DeviceHooks::copier);
  SB_REQUIRE(copier != nullptr,
             "copy_bytes: cannot copy {} to {}: no device copier is registered (link "
             "//core:cuda_allocator)",
             src.describe(), dst.device().str());
  copier(dst, src);
}

int registered_cuda_device_count() {
  DeviceCounter counter = current(&DeviceHooks::counter);
  if (counter == nullptr) return 0;
  try {
    return std::max(0, counter());
  } catch (...) {
    return 0;
  }
}

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
  size_t element_size = dtype_info(dtype, "Tensor::empty").size;
  size_t nbytes = checked_nbytes(checked_numel(shape, "Tensor::empty"), element_size,
                                 "Tensor::empty", shape);
  auto storage = device.is_cpu() ? allocate_cpu(nbytes) : allocate_device(nbytes, device);
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
  size_t element_size = dtype_info(dtype, kWhat).size;
  if (strides.empty() && !shape.empty()) strides = contiguous_strides(shape);
  check_strides(shape, strides, kWhat);
  size_t extent = view_extent_bytes(shape, strides, element_size, kWhat);
  SB_REQUIRE(data != nullptr || extent == 0, "{}: null data for a {} view of {} bytes",
             kWhat, shape_str(shape), extent);
  auto storage = std::make_shared<Storage>(std::move(owner), data, extent, device);
  return Tensor(std::move(storage), 0, shape, std::move(strides), dtype);
}

Tensor Tensor::from_dlpack(DLManagedTensor* managed) {
  SB_REQUIRE(managed != nullptr, "Tensor::from_dlpack: null DLManagedTensor");
  // Owns `managed` from here on: if a check below throws, this releases it.
  std::shared_ptr<DLManagedTensor> owner(managed, [](DLManagedTensor* m) {
    if (m->deleter != nullptr) m->deleter(m);
  });
  constexpr const char* kWhat = "Tensor::from_dlpack";
  const DLTensor& dl = managed->dl_tensor;
  Device device = device_from_dlpack(dl.device);
  DType dtype = dtype_from_dlpack(dl.dtype);
  SB_REQUIRE(dl.ndim >= 0, "{}: negative ndim {}", kWhat, dl.ndim);
  SB_REQUIRE(dl.ndim == 0 || dl.shape != nullptr, "{}: null shape for ndim {}", kWhat,
             dl.ndim);
  Shape shape(dl.shape, dl.shape + dl.ndim);
  checked_numel(shape, kWhat);  // refuses negative extents and overflow
  Shape strides = dl.strides != nullptr ? Shape(dl.strides, dl.strides + dl.ndim)
                                        : contiguous_strides(shape);
  check_strides(shape, strides, kWhat);
  size_t extent = view_extent_bytes(shape, strides, dtype_size(dtype), kWhat);
  SB_REQUIRE(dl.data != nullptr || extent == 0, "{}: null data for a {} view of {} bytes",
             kWhat, shape_str(shape), extent);
  size_t nbytes = 0;
  SB_REQUIRE(!__builtin_add_overflow(dl.byte_offset, extent, &nbytes),
             "{}: byte_offset {} overflows", kWhat, dl.byte_offset);
  auto storage = std::make_shared<Storage>(std::move(owner), dl.data, nbytes, device);
  return Tensor(std::move(storage), dl.byte_offset, std::move(shape), std::move(strides),
                dtype);
}

DLManagedTensor* Tensor::to_dlpack() const {
  require_defined("to_dlpack");
  auto context = std::make_unique<ExportContext>();
  context->storage = storage_;
  context->shape = shape_;
  context->strides = strides_;
  DLTensor& dl = context->managed.dl_tensor;
  dl.data = storage_->data();
  dl.byte_offset = offset_;
  dl.device.device_type = device().is_cuda() ? kDLCUDA : kDLCPU;
  dl.device.device_id = device().index;
  dl.ndim = static_cast<int>(shape_.size());
  dl.dtype = dtype_to_dlpack(dtype_);
  dl.shape = context->shape.data();
  dl.strides = context->strides.data();
  context->managed.manager_ctx = context.get();
  context->managed.deleter = delete_export;
  return &context.release()->managed;
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
  DeviceCopier copier = current(&DeviceHooks::copier);
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
