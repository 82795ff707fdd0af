// DLPack (core/tensor.h): Tensor::from_dlpack and Tensor::to_dlpack, and
// the dtype and device conversions they need.
#include <dlpack/dlpack.h>

#include <memory>
#include <utility>
#include <vector>

#include "common/check.h"
#include "core/tensor.h"
#include "core/tensor_internal.h"

namespace switchboard {
namespace {

using tensor_internal::check_strides;
using tensor_internal::checked_numel;
using tensor_internal::view_extent_bytes;

// DLPack 0.6 has no boolean type code; DLPack >= 0.8 defines kDLBool = 6
// (8 bits per element, 0 or 1), which is what PyTorch exports for torch.bool.
constexpr uint8_t kDLBoolCode = 6;

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

}  // namespace switchboard
