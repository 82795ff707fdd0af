// Python arrays as Switchboard tensors, without copies: what
// switchboard.collective's ops take.
//
//   Tensor t = switchboard::py_tensor::borrow(array, "allreduce: tensor");
//
// Accepted:
//   - objects with __array_interface__ (numpy arrays, and anything that
//     speaks numpy's protocol): the data pointer, shape, byte strides and
//     type string. Read-only arrays are accepted and written to, as
//     torch.from_numpy does: Ray hands actors read-only numpy arrays, and
//     its collectives write their results into them.
//   - objects with __dlpack__ (torch tensors, CPU and CUDA, cupy, jax...):
//     imported with Tensor::from_dlpack.
// Supported dtypes: float16, bfloat16 (DLPack only), float32, float64,
// int8, uint8, int32, int64, bool, in native byte order.
//
// Ownership: the Tensor holds a reference to the Python object (or the
// DLPack capsule's tensor) until the last Tensor over it is gone; dropping
// it takes the GIL.
//
// Errors: TypeError (pybind11::type_error) for an object that is neither,
// ValueError (pybind11::value_error) for a dtype, byte order or stride
// Switchboard cannot use, each starting with `what`.
//
// Thread safety: borrow() needs the GIL.
#pragma once

#include <pybind11/pybind11.h>

#include <string_view>

#include "core/tensor.h"

namespace switchboard::py_tensor {

Tensor borrow(pybind11::handle object, std::string_view what);

}  // namespace switchboard::py_tensor
