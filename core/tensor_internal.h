// What the files of //core:tensor share with one another, and nothing else
// includes: the checks of shapes and strides (tensor.cc), a dtype's size
// with the caller named in errors (dtype.cc), and the registered device
// hooks (device_hooks.cc). Thread safety: as their public counterparts in
// core/tensor.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/tensor.h"

namespace switchboard::tensor_internal {

// Element count of a shape; `what` names the caller in errors (negative
// extents, overflow: std::invalid_argument).
int64_t checked_numel(const Tensor::Shape& shape, const char* what);
// Strides as many as the shape's dimensions, none negative.
void check_strides(const Tensor::Shape& shape, const Tensor::Shape& strides,
                   const char* what);
// Bytes from the first element to one past the last element a view touches
// (0 for an empty view). Strides must be non-negative.
size_t view_extent_bytes(const Tensor::Shape& shape, const Tensor::Shape& strides,
                         size_t element_size, const char* what);

// dtype_size(), naming `what` for an invalid dtype value.
size_t element_size(DType dtype, const char* what);

// Storage of `nbytes` on `device` from the registered allocator; throws
// std::invalid_argument when none is registered.
std::shared_ptr<Storage> allocate_device(size_t nbytes, Device device);
// The registered copier (null when none).
DeviceCopier registered_copier();

}  // namespace switchboard::tensor_internal
