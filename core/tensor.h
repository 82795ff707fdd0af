// Tensor: a typed, shaped view of bytes on the CPU or a CUDA device.
//
// A Tensor is a small value type (dtype, shape, strides, device, byte offset)
// over a shared Storage. Copying a Tensor copies the view, not the bytes: two
// copies alias the same storage, as PyTorch tensors do. Storage either owns
// its bytes (Tensor::empty/zeros/from_vector allocate them) or borrows them
// (Tensor::from_blob, Tensor::from_dlpack); a borrowed storage holds a shared
// handle to the owner and releases it when the last Tensor over it goes away.
//
// Collectives and RPC move contiguous tensors only ("contiguous is what
// travels"); strides exist so that DLPack imports of strided views are
// represented faithfully and refused with a clear error where bytes must be
// contiguous.
//
// CPU storage is allocated here (64-byte aligned). CUDA storage needs an
// allocator: the CUDA-enabled targets (//core:cuda_allocator) register
// one with set_device_allocator(); without it Tensor::empty on a CUDA device
// throws std::invalid_argument saying so.
//
// Thread safety: a Tensor is a value; concurrent reads of one Tensor are
// safe, and so is using copies in different threads. Writing the bytes of a
// storage from one thread while another reads them is the caller's race, as
// in every tensor library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

struct DLManagedTensor;

namespace switchboard {

enum class DType : uint8_t {
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
  kInt8,
  kUInt8,
  kInt32,
  kInt64,
  kBool,
};

// Every dtype, in declaration order (for tests and dispatch tables).
inline constexpr DType kAllDTypes[] = {
    DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64, DType::kInt8,
    DType::kUInt8,   DType::kInt32,    DType::kInt64,   DType::kBool,
};

size_t dtype_size(DType dtype);
// "float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32",
// "int64", "bool" (PyTorch's names without the "torch." prefix).
std::string_view dtype_name(DType dtype);
// Inverse of dtype_name; throws std::invalid_argument naming the text.
DType parse_dtype(std::string_view name);
bool is_floating(DType dtype);

// The C++ type for a dtype's element, for the dtypes that have one.
// float16 and bfloat16 have no native type; use uint16_t bit patterns and
// the conversions below.
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::kFloat32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::kFloat64;
}
template <>
constexpr DType dtype_of<int8_t>() {
  return DType::kInt8;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::kUInt8;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::kInt32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::kInt64;
}
template <>
constexpr DType dtype_of<bool>() {
  return DType::kBool;
}

// IEEE half and bfloat16 <-> float (round to nearest even).
float half_to_float(uint16_t bits);
uint16_t float_to_half(float value);
float bfloat16_to_float(uint16_t bits);
uint16_t float_to_bfloat16(float value);

struct Device {
  enum class Type : uint8_t { kCpu, kCuda };

  Type type = Type::kCpu;
  int index = 0;  // CUDA ordinal; always 0 for the CPU

  static Device cpu() { return {}; }
  static Device cuda(int index) { return {Type::kCuda, index}; }
  // "cpu", "cuda" (= cuda:0) or "cuda:N"; throws std::invalid_argument.
  static Device parse(std::string_view text);

  bool is_cpu() const { return type == Type::kCpu; }
  bool is_cuda() const { return type == Type::kCuda; }
  std::string str() const;  // "cpu" or "cuda:N"
  friend bool operator==(const Device&, const Device&) = default;
};

// Allocates `nbytes` on a device and returns the storage owner; the
// shared_ptr's deleter frees it. Registered by CUDA-enabled targets.
using DeviceAllocator =
    std::function<std::shared_ptr<void>(size_t nbytes, Device device)>;
// Installs the allocator used for non-CPU devices (replaces any previous
// one; pass nullptr to remove). Thread-safe.
void set_device_allocator(DeviceAllocator allocator);
bool has_device_allocator();

class Tensor;

// Copies the bytes of `src` into `dst` (equal dtype and numel, both
// contiguous, at least one of them not on the CPU) and returns once they
// have arrived. Registered by CUDA-enabled targets next to the allocator;
// Tensor::to() uses it.
using DeviceCopier = std::function<void(const Tensor& dst, const Tensor& src)>;
// Installs the copier (replaces any previous one; nullptr removes it).
// Thread-safe.
void set_device_copier(DeviceCopier copier);
bool has_device_copier();

// Counts the CUDA devices this process can use. Registered by CUDA-enabled
// targets; it must not throw.
using DeviceCounter = std::function<int()>;
// Installs the counter (replaces any previous one; nullptr removes it).
// Thread-safe.
void set_device_counter(DeviceCounter counter);
// The registered counter's answer; 0 when none is registered (a build
// without CUDA). Never throws.
int registered_cuda_device_count();

// Page-locks (pins) host memory so that copies between it and a device run
// at the bus's speed (cudaHostRegister), and unpins it. Registered by
// CUDA-enabled targets; `pin` returns false when it could not (the memory
// stays usable, unpinned). Must not throw.
struct HostPinner {
  std::function<bool(void* data, size_t nbytes)> pin;
  std::function<void(void* data)> unpin;
};
// Installs the pinner (replaces any previous one). Thread-safe.
void set_host_pinner(HostPinner pinner);
// The registered pinner; its functions are empty when none is.
HostPinner host_pinner();

// Copies the bytes of `src` into `dst` (equal dtype and numel, both
// contiguous), between any two devices: on the CPU with memmove, else with
// the registered copier (std::invalid_argument when none is). Returns once
// the bytes have arrived.
void copy_bytes(const Tensor& dst, const Tensor& src);

// Bytes and their owner. `data` stays valid while the Storage lives.
class Storage {
 public:
  Storage(std::shared_ptr<void> owner, void* data, size_t nbytes, Device device)
      : owner_(std::move(owner)), data_(data), nbytes_(nbytes), device_(device) {}

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  // What keeps the bytes alive (what from_blob() was given).
  const std::shared_ptr<void>& owner() const { return owner_; }

 private:
  std::shared_ptr<void> owner_;
  void* data_;
  size_t nbytes_;
  Device device_;
};

class Tensor {
 public:
  using Shape = std::vector<int64_t>;

  // An undefined tensor (defined() is false); every accessor but defined()
  // and describe() throws std::invalid_argument on it.
  Tensor() = default;

  // Allocates uninitialized / zeroed contiguous storage.
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype);  // CPU only
  // A CPU tensor holding a copy of `values` with the given shape (default:
  // one dimension of values.size()). Shape must match the element count.
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, Shape shape = {});
  // Borrows `data` (not copied): the tensor keeps `owner` alive. Strides
  // default to contiguous. The caller guarantees the bytes cover the view.
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device,
                          std::shared_ptr<void> owner, Shape strides = {});

  // Imports a DLPack tensor without copying and takes ownership of
  // `managed`: its deleter runs when the last Tensor over it is destroyed
  // (or right away if the import throws). Throws std::invalid_argument for
  // dtypes, devices or lanes Switchboard does not support, naming them.
  static Tensor from_dlpack(DLManagedTensor* managed);
  // Exports without copying. The returned tensor keeps this storage alive
  // until its deleter is called; the caller owns it and must call
  // `managed->deleter(managed)` exactly once (as every DLPack consumer does).
  DLManagedTensor* to_dlpack() const;

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const;
  const Shape& shape() const;
  const Shape& strides() const;
  int64_t dim() const;
  Device device() const;
  int64_t numel() const;
  size_t element_size() const;
  size_t nbytes() const;  // numel() * element_size()
  bool is_contiguous() const;
  // Address of the first element (storage data + byte offset).
  void* data() const;
  template <typename T>
  T* data_as() const;
  // The storage (shared with every alias of this tensor).
  const std::shared_ptr<Storage>& storage() const;
  size_t storage_offset_bytes() const;

  // For logs and errors: "float32[2, 3] on cpu" or "undefined tensor".
  std::string describe() const;

  // A contiguous CPU copy with its own storage (CPU tensors only).
  Tensor clone() const;
  // CPU contiguous: the elements as a span / a vector of T (T must match
  // the dtype, or be uint16_t for the half types).
  template <typename T>
  std::span<T> span() const;
  template <typename T>
  std::vector<T> to_vector() const;
  // A view of the same storage with another shape of equal numel
  // (contiguous tensors only).
  Tensor reshape(const Shape& shape) const;
  // Rows [start, start + length) of dimension 0, as a view (contiguous).
  Tensor narrow0(int64_t start, int64_t length) const;
  // Copies `src` into this tensor: equal dtype and numel, both CPU and
  // contiguous.
  void copy_from(const Tensor& src);
  // A contiguous copy on `device` with its own storage (contiguous tensors
  // only), also when the tensor is already there. CPU to CPU needs nothing
  // registered; a copy to, from or between CUDA devices uses the registered
  // allocator and copier (link //core:cuda_allocator) and throws
  // std::invalid_argument naming the devices when none is registered. The
  // copier's errors (no such device, out of memory) propagate.
  Tensor to(Device device) const;
  // True when dtype, shape and every element are equal (CPU, contiguous).
  bool equal(const Tensor& other) const;

  // Element count of a shape; throws std::invalid_argument for negative
  // extents or overflow.
  static int64_t numel_of(const Shape& shape);
  static Shape contiguous_strides(const Shape& shape);

 private:
  // Throws std::invalid_argument when numel_of(shape) != size.
  static void check_vector_size(const Shape& shape, size_t size);
  Tensor(std::shared_ptr<Storage> storage, size_t offset, Shape shape, Shape strides,
         DType dtype);
  void require_defined(const char* what) const;
  void require_element_type(DType expected, size_t size, const char* what) const;
  void require_cpu_contiguous(const char* what) const;

  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
  Shape shape_;
  Shape strides_;
  DType dtype_ = DType::kFloat32;
};

// Renders "[2, 3]".
std::string shape_str(const Tensor::Shape& shape);

template <typename T>
constexpr bool kIsHalfBits = std::is_same_v<T, uint16_t>;

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, Shape shape) {
  static_assert(!std::is_same_v<T, bool>,
                "std::vector<bool> has no bytes; use uint8_t and kBool");
  if (shape.empty()) shape = {static_cast<int64_t>(values.size())};
  check_vector_size(shape, values.size());
  Tensor t = empty(shape, dtype_of<T>());
  auto out = t.span<T>();
  for (size_t i = 0; i < values.size(); ++i) out[i] = values[i];
  return t;
}

template <typename T>
T* Tensor::data_as() const {
  using U = std::remove_cv_t<T>;  // span<const float>() reads a float tensor
  require_defined("data_as");
  if constexpr (kIsHalfBits<U>) {
    require_element_type(dtype_, 2, "data_as");
  } else if constexpr (std::is_same_v<U, uint8_t>) {
    if (dtype_ != DType::kBool) require_element_type(DType::kUInt8, 1, "data_as");
  } else {
    require_element_type(dtype_of<U>(), sizeof(U), "data_as");
  }
  return static_cast<T*>(data());
}

template <typename T>
std::span<T> Tensor::span() const {
  require_cpu_contiguous("span");
  return {data_as<T>(), static_cast<size_t>(numel())};
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  auto s = span<T>();
  return {s.begin(), s.end()};
}

}  // namespace switchboard
