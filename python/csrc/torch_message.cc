#include "python/csrc/torch_message.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace switchboard::torch_rpc {

namespace trpc = torch::distributed::rpc;

namespace {

template <typename T>
void put(std::vector<uint8_t>& out, T value) {
  const auto* p = reinterpret_cast<const uint8_t*>(&value);
  out.insert(out.end(), p, p + sizeof(T));
}

// Reads from the network's bytes, never past their end.
class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& bytes) : bytes_(bytes) {}
  template <typename T>
  T take(const char* what) {
    if (bytes_.size() - at_ < sizeof(T)) {
      throw std::invalid_argument(fmt::format(
          "torch message: {} bytes end at {} of {}, inside the {}", bytes_.size(), at_,
          sizeof(T), what));
    }
    T value;
    std::memcpy(&value, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return value;
  }
  size_t at() const { return at_; }

 private:
  const std::vector<uint8_t>& bytes_;
  size_t at_ = 0;
};

// The elements a view with these sizes and (non-negative) strides spans,
// from its first to its last; 0 when it has none. Overflow: max.
uint64_t span_elements(c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  uint64_t last = 0;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 0) return 0;
    const auto reach = static_cast<unsigned __int128>(sizes[d] - 1) *
                       static_cast<uint64_t>(strides[d]);
    if (reach > std::numeric_limits<uint64_t>::max() - last)
      return std::numeric_limits<uint64_t>::max();
    last += static_cast<uint64_t>(reach);
  }
  return last == std::numeric_limits<uint64_t>::max() ? last : last + 1;
}

uint64_t span_bytes(const at::Tensor& t) {
  return span_elements(t.sizes(), t.strides()) * t.element_size();
}

// What travels of `tensor`: itself, unless its span is 8 KiB or more and
// at least twice its elements, then a compact copy (torch's own rule for
// views of larger storages); detached (the bytes, not the autograd graph:
// requires_grad travels as a flag).
at::Tensor travelling(const at::Tensor& tensor) {
  constexpr uint64_t kMinRecopyBytes = 8 * 1024;
  at::Tensor t = tensor.detach();
  const uint64_t useful = static_cast<uint64_t>(t.numel()) * t.element_size();
  const uint64_t span = span_bytes(t);
  if (!t.is_contiguous() && span >= kMinRecopyBytes && span >= 2 * useful) {
    t = t.contiguous();
  }
  return t;
}

// Throws std::invalid_argument, naming tensor `index`, for a layout that
// has no flat bytes to send and no encoding here (sparse COO has one: its
// indices and values).
void require_carried(const at::Tensor& tensor, size_t index) {
  if (tensor.layout() == c10::kSparse) return;
  if (tensor.layout() != c10::kStrided || tensor.is_quantized() || tensor.is_mkldnn()) {
    throw std::invalid_argument(fmt::format(
        "torch message: tensor {} ({}, layout {}) has a layout Switchboard does not carry "
        "(strided and sparse COO tensors are carried; sparse CSR/CSC/BSR/BSC, quantized and "
        "MKL-DNN tensors are not)",
        index, tensor.toString(), c10::str(tensor.layout())));
  }
}

// PIPE reads a CUDA tensor after the work queued on its device's default
// stream (docs/pipe.md, "Streams"); torch's promise, as TensorPipe keeps
// it, is the work queued on the caller's current stream. When they
// differ, the default stream is made to wait for the current one (an event,
// no host wait), so that a tensor written on a side stream is read only
// once written.
void order_after_current_stream(const at::Tensor& tensor) {
  if (!tensor.is_cuda()) return;
  const c10::Device device = tensor.device();
  const c10::impl::DeviceGuardImplInterface* impl = c10::impl::getDeviceGuardImpl(device.type());
  const c10::Stream current = impl->getStream(device);
  const c10::Stream fallback = impl->getDefaultStream(device);
  if (current == fallback) return;
  c10::Event written(device.type());
  written.record(current);
  written.block(fallback);
}

Tensor to_switchboard(const at::Tensor& tensor, size_t index) {
  Device device;
  if (tensor.device().is_cuda()) {
    device = Device::cuda(tensor.device().index());
  } else if (!tensor.device().is_cpu()) {
    throw std::invalid_argument(fmt::format(
        "torch message: tensor {} is on {}; Switchboard carries CPU and CUDA tensors",
        index, tensor.device().str()));
  }
  // The bytes stay the torch tensor's: its storage lives as long as the
  // Switchboard tensor over it.
  // The bytes the view spans, from its first element, strides kept (as
  // torch's own pickle keeps them); a view that spans much more than its
  // elements (a column of a large matrix) goes as a compact copy.
  auto held = std::make_shared<at::Tensor>(tensor);
  const auto nbytes = static_cast<int64_t>(span_bytes(*held));
  void* data = nbytes == 0 ? nullptr : held->data_ptr();
  return Tensor::from_blob(data, {nbytes}, DType::kUInt8, device, std::move(held));
}

at::Tensor to_torch(const Tensor& tensor, c10::ScalarType dtype,
                    const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  const c10::Device device = tensor.device().is_cuda()
                                 ? c10::Device(c10::DeviceType::CUDA,
                                               static_cast<c10::DeviceIndex>(tensor.device().index))
                                 : c10::Device(c10::DeviceType::CPU);
  auto options = at::TensorOptions().dtype(dtype).device(device);
  if (tensor.nbytes() == 0) return at::empty(sizes, options);
  // Holds the received bytes for as long as torch's tensor lives.
  return at::from_blob(
      tensor.data(), sizes, strides, [held = tensor](void*) mutable { held = Tensor(); },
      options);
}

}  // namespace

namespace {

// One strided tensor's entry (dtype, flags, ndim, sizes, strides) and its
// Switchboard tensor.
void encode_strided(const at::Tensor& tensor, uint8_t flags, size_t index, rpc::Message& out) {
  const at::Tensor t = travelling(tensor);
  if (t.dim() > kMaxDims) {
    throw std::invalid_argument(fmt::format(
        "torch message: tensor {} has {} dimensions, more than {}", index, t.dim(), kMaxDims));
  }
  put<int8_t>(out.payload, static_cast<int8_t>(t.scalar_type()));
  put<uint8_t>(out.payload, flags);
  put<uint8_t>(out.payload, static_cast<uint8_t>(t.dim()));
  for (int64_t size : t.sizes()) put<int64_t>(out.payload, size);
  for (int64_t stride : t.strides()) put<int64_t>(out.payload, stride);
  order_after_current_stream(t);
  out.tensors.push_back(to_switchboard(t, index));
}

// A sparse COO tensor's entry (values' dtype, flags with kSparseCoo, ndim,
// sizes), then its indices' and its values' strided entries.
void encode_sparse_coo(const at::Tensor& tensor, size_t index, rpc::Message& out) {
  if (tensor.dim() > kMaxDims) {
    throw std::invalid_argument(fmt::format("torch message: tensor {} has {} dimensions, more "
                                            "than {}",
                                            index, tensor.dim(), kMaxDims));
  }
  uint8_t flags = kSparseCoo;
  if (tensor.requires_grad()) flags |= kRequiresGrad;
  if (tensor.is_coalesced()) flags |= kCoalesced;
  put<int8_t>(out.payload, static_cast<int8_t>(tensor.scalar_type()));
  put<uint8_t>(out.payload, flags);
  put<uint8_t>(out.payload, static_cast<uint8_t>(tensor.dim()));
  for (int64_t size : tensor.sizes()) put<int64_t>(out.payload, size);
  const at::Tensor plain = tensor.detach();
  encode_strided(plain._indices(), 0, index, out);
  encode_strided(plain._values(), 0, index, out);
}

}  // namespace

rpc::Message encode(const trpc::Message& m, rpc::MessageType type) {
  rpc::Message out;
  out.type = type;
  const std::vector<at::Tensor>& tensors = m.tensors();
  if (tensors.size() > std::numeric_limits<uint32_t>::max()) {
    throw std::invalid_argument(
        fmt::format("torch message: {} tensors is too many", tensors.size()));
  }
  const std::vector<char>& payload = m.payload();
  out.payload.reserve(16 + tensors.size() * 24 + payload.size());
  put<uint8_t>(out.payload, kCodecVersion);
  put<int32_t>(out.payload, static_cast<int32_t>(m.type()));
  put<uint32_t>(out.payload, static_cast<uint32_t>(tensors.size()));
  out.tensors.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    require_carried(tensors[i], i);
    if (tensors[i].layout() == c10::kSparse) {
      encode_sparse_coo(tensors[i], i, out);
    } else {
      encode_strided(tensors[i], tensors[i].requires_grad() ? kRequiresGrad : 0, i, out);
    }
  }
  out.payload.insert(out.payload.end(), payload.begin(), payload.end());
  return out;
}

namespace {

// Reads the Switchboard tensors of a message in order, never past the last.
class TensorCursor {
 public:
  explicit TensorCursor(const std::vector<Tensor>& tensors) : tensors_(tensors) {}
  const Tensor* next() { return at_ < tensors_.size() ? &tensors_[at_++] : nullptr; }
  size_t taken() const { return at_; }
  size_t size() const { return tensors_.size(); }

 private:
  const std::vector<Tensor>& tensors_;
  size_t at_ = 0;
};

c10::ScalarType read_dtype(Reader& in, size_t index) {
  const auto raw_dtype = in.take<int8_t>("dtype");
  if (raw_dtype < 0 || raw_dtype >= static_cast<int8_t>(c10::ScalarType::NumOptions) ||
      raw_dtype == static_cast<int8_t>(c10::ScalarType::Undefined)) {
    throw std::invalid_argument(fmt::format(
        "torch message: tensor {} has dtype {}, not one of torch's", index,
        static_cast<int>(raw_dtype)));
  }
  return static_cast<c10::ScalarType>(raw_dtype);
}

std::vector<int64_t> read_dims(Reader& in, size_t ndim, const char* what, size_t index) {
  std::vector<int64_t> dims(ndim);
  for (auto& d : dims) {
    d = in.take<int64_t>(what);
    if (d < 0) {
      throw std::invalid_argument(
          fmt::format("torch message: tensor {} has a negative {} entry {}", index, what, d));
    }
  }
  return dims;
}

uint8_t read_ndim(Reader& in, size_t index) {
  const auto ndim = in.take<uint8_t>("dimension count");
  if (ndim > kMaxDims) {
    throw std::invalid_argument(fmt::format(
        "torch message: tensor {} has {} dimensions, more than {}", index, ndim, kMaxDims));
  }
  return ndim;
}

// The rest of a strided entry (its dtype and flags read): sizes, strides,
// checked against the next Switchboard tensor's bytes.
at::Tensor decode_strided(Reader& in, c10::ScalarType dtype, TensorCursor& cursor,
                          size_t index) {
  const uint8_t ndim = read_ndim(in, index);
  const std::vector<int64_t> sizes = read_dims(in, ndim, "sizes", index);
  const std::vector<int64_t> strides = read_dims(in, ndim, "strides", index);
  // The bytes the view spans, checked against the bytes that came: no
  // overflow (max stands for "more than any message").
  const uint64_t elements = span_elements(sizes, strides);
  const uint64_t bytes = elements > std::numeric_limits<uint64_t>::max() / 16
                             ? std::numeric_limits<uint64_t>::max()
                             : elements * c10::elementSize(dtype);
  const Tensor* t = cursor.next();
  if (t == nullptr) {
    throw std::invalid_argument(fmt::format(
        "torch message: tensor {} needs one more Switchboard tensor than the {} that came",
        index, cursor.size()));
  }
  if (!t->defined() || t->dtype() != DType::kUInt8 || t->dim() != 1 ||
      static_cast<uint64_t>(t->nbytes()) != bytes || !t->is_contiguous()) {
    throw std::invalid_argument(fmt::format(
        "torch message: tensor {} is {} of shape [{}] and strides [{}]: {} bytes, but {} "
        "came ({})",
        index, c10::toString(dtype), fmt::join(sizes, ", "), fmt::join(strides, ", "), bytes,
        t->defined() ? t->nbytes() : 0, t->describe()));
  }
  return to_torch(*t, dtype, sizes, strides);
}

// A sparse COO entry (its dtype and flags read): sizes, then the indices'
// and the values' strided entries, checked as torch checks a
// sparse_coo_tensor's arguments (indices in bounds, shapes that agree).
at::Tensor decode_sparse_coo(Reader& in, c10::ScalarType dtype, uint8_t flags,
                             TensorCursor& cursor, size_t index) {
  const uint8_t ndim = read_ndim(in, index);
  const std::vector<int64_t> sizes = read_dims(in, ndim, "sizes", index);
  at::Tensor parts[2];
  for (at::Tensor& part : parts) {
    const c10::ScalarType part_dtype = read_dtype(in, index);
    const auto part_flags = in.take<uint8_t>("flags");
    if (part_flags != 0) {
      throw std::invalid_argument(fmt::format(
          "torch message: sparse tensor {}: a part has flags {:#x}", index, part_flags));
    }
    part = decode_strided(in, part_dtype, cursor, index);
  }
  const at::Tensor& indices = parts[0];
  const at::Tensor& values = parts[1];
  if (indices.scalar_type() != c10::kLong || values.scalar_type() != dtype) {
    throw std::invalid_argument(fmt::format(
        "torch message: sparse tensor {} of {} has indices of {} and values of {}", index,
        c10::toString(dtype), c10::toString(indices.scalar_type()),
        c10::toString(values.scalar_type())));
  }
  const bool coalesced = (flags & kCoalesced) != 0;
  try {
    at::_validate_sparse_coo_tensor_args(indices, values, sizes);
  } catch (const std::exception& e) {
    throw std::invalid_argument(fmt::format(
        "torch message: sparse tensor {} of size [{}]: {}", index, fmt::join(sizes, ", "),
        e.what()));
  }
  return at::_sparse_coo_tensor_unsafe(indices, values, sizes,
                                       values.options().layout(c10::kSparse), coalesced);
}

}  // namespace

c10::intrusive_ptr<trpc::Message> decode(const rpc::Message& m, int64_t id) {
  Reader in(m.payload);
  const auto version = in.take<uint8_t>("version");
  if (version != kCodecVersion) {
    throw std::invalid_argument(fmt::format(
        "torch message: codec version {}, this worker speaks {}", version, kCodecVersion));
  }
  const auto type = in.take<int32_t>("message type");
  const auto count = in.take<uint32_t>("tensor count");
  if (count > m.tensors.size()) {
    throw std::invalid_argument(fmt::format(
        "torch message: the header names {} tensors, {} came", count, m.tensors.size()));
  }
  std::vector<at::Tensor> tensors;
  tensors.reserve(count);
  TensorCursor cursor(m.tensors);
  for (uint32_t i = 0; i < count; ++i) {
    const c10::ScalarType dtype = read_dtype(in, i);
    const auto flags = in.take<uint8_t>("flags");
    if ((flags & ~(kRequiresGrad | kSparseCoo | kCoalesced)) != 0 ||
        ((flags & kCoalesced) != 0 && (flags & kSparseCoo) == 0)) {
      throw std::invalid_argument(
          fmt::format("torch message: tensor {} has unknown flags {:#x}", i, flags));
    }
    tensors.push_back((flags & kSparseCoo) != 0 ? decode_sparse_coo(in, dtype, flags, cursor, i)
                                                : decode_strided(in, dtype, cursor, i));
    // What torch's own pickle of the tensor list keeps: distributed autograd
    // attaches its RecvRpcBackward to the received tensors that need grad.
    if ((flags & kRequiresGrad) != 0) tensors.back().set_requires_grad(true);
  }
  if (cursor.taken() != m.tensors.size()) {
    throw std::invalid_argument(fmt::format(
        "torch message: the header's {} tensors take {} Switchboard tensors, {} came", count,
        cursor.taken(), m.tensors.size()));
  }
  std::vector<char> payload(m.payload.begin() + static_cast<std::ptrdiff_t>(in.at()),
                            m.payload.end());
  return c10::make_intrusive<trpc::Message>(
      std::move(payload), std::move(tensors), static_cast<trpc::MessageType>(type), id);
}

}  // namespace switchboard::torch_rpc
