#include "python/csrc/py_tensor.h"

#include <dlpack/dlpack.h>
#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

namespace switchboard::py_tensor {

namespace py = pybind11;

namespace {

// numpy's type strings ("<f4", "|b1", ...) as dtypes; native byte order only.
DType dtype_of(const std::string& typestr, std::string_view what) {
  if (typestr.size() < 3) {
    throw py::value_error(fmt::format("{}: array type \"{}\" is not numpy's", what, typestr));
  }
  const char order = typestr[0];
  const std::string kind = typestr.substr(1);
  const bool native = order == '|' || order == '=' || order == '<';  // x86-64, aarch64: little
  if (!native) {
    throw py::value_error(
        fmt::format("{}: array type \"{}\" is big-endian; use native byte order", what, typestr));
  }
  if (kind == "f2") return DType::kFloat16;
  if (kind == "f4") return DType::kFloat32;
  if (kind == "f8") return DType::kFloat64;
  if (kind == "i1") return DType::kInt8;
  if (kind == "u1") return DType::kUInt8;
  if (kind == "i4") return DType::kInt32;
  if (kind == "i8") return DType::kInt64;
  if (kind == "b1") return DType::kBool;
  throw py::value_error(fmt::format(
      "{}: array type \"{}\" is not supported (float16, float32, float64, int8, uint8, int32, "
      "int64, bool)",
      what, typestr));
}

// Keeps `object` alive for as long as a Tensor uses its memory.
std::shared_ptr<void> hold(py::handle object) {
  return std::shared_ptr<void>(new py::object(py::reinterpret_borrow<py::object>(object)),
                               [](void* p) {
                                 py::gil_scoped_acquire gil;
                                 delete static_cast<py::object*>(p);
                               });
}

Tensor from_array_interface(py::handle object, const py::dict& face, std::string_view what) {
  const DType dtype = dtype_of(py::str(face["typestr"]), what);
  const auto data = face["data"].cast<py::tuple>();
  auto* pointer = reinterpret_cast<void*>(data[0].cast<uintptr_t>());
  Tensor::Shape shape;
  for (py::handle d : face["shape"].cast<py::tuple>()) shape.push_back(d.cast<int64_t>());
  Tensor::Shape strides;
  if (face.contains("strides") && !face["strides"].is_none()) {
    const auto element = static_cast<int64_t>(dtype_size(dtype));
    for (py::handle s : face["strides"].cast<py::tuple>()) {
      const auto bytes = s.cast<int64_t>();
      if (bytes < 0 || bytes % element != 0) {
        throw py::value_error(fmt::format(
            "{}: a stride of {} bytes is not a non-negative multiple of the element size {}",
            what, bytes, element));
      }
      strides.push_back(bytes / element);
    }
  }
  return Tensor::from_blob(pointer, shape, dtype, Device::cpu(), hold(object), strides);
}

Tensor from_dlpack(py::handle object, std::string_view what) {
  py::object capsule = object.attr("__dlpack__")();
  auto* managed =
      static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (managed == nullptr) {
    PyErr_Clear();
    throw py::value_error(fmt::format("{}: __dlpack__ did not return a \"dltensor\" capsule",
                                      what));
  }
  // The capsule is consumed: its destructor must not free the tensor.
  PyCapsule_SetName(capsule.ptr(), "used_dltensor");
  try {
    return Tensor::from_dlpack(managed);
  } catch (const std::invalid_argument& e) {
    throw py::value_error(fmt::format("{}: {}", what, e.what()));
  }
}

}  // namespace

Tensor borrow(py::handle object, std::string_view what) {
  if (py::hasattr(object, "__array_interface__")) {
    return from_array_interface(object, object.attr("__array_interface__").cast<py::dict>(),
                                what);
  }
  if (py::hasattr(object, "__dlpack__")) return from_dlpack(object, what);
  throw py::type_error(fmt::format(
      "{}: a {} is not an array (numpy arrays, torch tensors and other objects with "
      "__array_interface__ or __dlpack__ are)",
      what, std::string(py::str(object.get_type().attr("__name__")))));
}

}  // namespace switchboard::py_tensor
