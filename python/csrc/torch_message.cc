#include "python/csrc/torch_message.h"

#include <ATen/ATen.h>
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

Tensor to_switchboard(const at::Tensor& tensor, size_t index) {
  if (tensor.is_sparse() || tensor.is_quantized() || tensor.is_mkldnn()) {
    throw std::invalid_argument(fmt::format(
        "torch message: tensor {} ({}) has a layout Switchboard does not carry (sparse, "
        "quantized and MKL-DNN tensors are not supported)",
        index, tensor.toString()));
  }
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
  // detach(): the bytes, not the autograd graph (requires_grad travels as a
  // flag).
  auto held = std::make_shared<at::Tensor>(tensor.detach().contiguous());
  const auto nbytes = static_cast<int64_t>(held->nbytes());
  void* data = nbytes == 0 ? nullptr : held->data_ptr();
  return Tensor::from_blob(data, {nbytes}, DType::kUInt8, device, std::move(held));
}

at::Tensor to_torch(const Tensor& tensor, c10::ScalarType dtype,
                    const std::vector<int64_t>& sizes) {
  const c10::Device device = tensor.device().is_cuda()
                                 ? c10::Device(c10::DeviceType::CUDA,
                                               static_cast<c10::DeviceIndex>(tensor.device().index))
                                 : c10::Device(c10::DeviceType::CPU);
  auto options = at::TensorOptions().dtype(dtype).device(device);
  if (tensor.nbytes() == 0) return at::empty(sizes, options);
  // Holds the received bytes for as long as torch's tensor lives.
  return at::from_blob(
      tensor.data(), sizes, [held = tensor](void*) mutable { held = Tensor(); }, options);
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
    const at::Tensor& t = tensors[i];
    if (t.dim() > kMaxDims) {
      throw std::invalid_argument(fmt::format(
          "torch message: tensor {} has {} dimensions, more than {}", i, t.dim(), kMaxDims));
    }
    put<int8_t>(out.payload, static_cast<int8_t>(t.scalar_type()));
    put<uint8_t>(out.payload, t.requires_grad() ? kRequiresGrad : 0);
    put<uint8_t>(out.payload, static_cast<uint8_t>(t.dim()));
    for (int64_t size : t.sizes()) put<int64_t>(out.payload, size);
    out.tensors.push_back(to_switchboard(t, i));
  }
  out.payload.insert(out.payload.end(), payload.begin(), payload.end());
  return out;
}

c10::intrusive_ptr<trpc::Message> decode(const rpc::Message& m, int64_t id) {
  Reader in(m.payload);
  const auto version = in.take<uint8_t>("version");
  if (version != kCodecVersion) {
    throw std::invalid_argument(fmt::format(
        "torch message: codec version {}, this worker speaks {}", version, kCodecVersion));
  }
  const auto type = in.take<int32_t>("message type");
  const auto count = in.take<uint32_t>("tensor count");
  if (count != m.tensors.size()) {
    throw std::invalid_argument(fmt::format(
        "torch message: the header names {} tensors, {} came", count, m.tensors.size()));
  }
  std::vector<at::Tensor> tensors;
  tensors.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    const auto raw_dtype = in.take<int8_t>("dtype");
    if (raw_dtype < 0 || raw_dtype >= static_cast<int8_t>(c10::ScalarType::NumOptions) ||
        raw_dtype == static_cast<int8_t>(c10::ScalarType::Undefined)) {
      throw std::invalid_argument(
          fmt::format("torch message: tensor {} has dtype {}, not one of torch's", i,
                      static_cast<int>(raw_dtype)));
    }
    const auto dtype = static_cast<c10::ScalarType>(raw_dtype);
    const auto flags = in.take<uint8_t>("flags");
    if ((flags & ~kRequiresGrad) != 0) {
      throw std::invalid_argument(
          fmt::format("torch message: tensor {} has unknown flags {:#x}", i, flags));
    }
    const auto ndim = in.take<uint8_t>("dimension count");
    if (ndim > kMaxDims) {
      throw std::invalid_argument(fmt::format(
          "torch message: tensor {} has {} dimensions, more than {}", i, ndim, kMaxDims));
    }
    std::vector<int64_t> sizes(ndim);
    // The element count, checked against the bytes that came: no overflow.
    uint64_t bytes = c10::elementSize(dtype);
    bool zero = false;
    for (auto& size : sizes) {
      size = in.take<int64_t>("sizes");
      if (size < 0) {
        throw std::invalid_argument(
            fmt::format("torch message: tensor {} has a negative size {}", i, size));
      }
      if (size == 0) zero = true;
      if (!zero && bytes > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(size))
        bytes = std::numeric_limits<uint64_t>::max();
      else if (!zero)
        bytes *= static_cast<uint64_t>(size);
    }
    if (zero) bytes = 0;
    const Tensor& t = m.tensors[i];
    if (!t.defined() || t.dtype() != DType::kUInt8 || t.dim() != 1 ||
        static_cast<uint64_t>(t.nbytes()) != bytes || !t.is_contiguous()) {
      throw std::invalid_argument(fmt::format(
          "torch message: tensor {} is {} of shape [{}]: {} bytes, but {} came ({})", i,
          c10::toString(dtype), fmt::join(sizes, ", "), bytes, t.defined() ? t.nbytes() : 0,
          t.describe()));
    }
    tensors.push_back(to_torch(t, dtype, sizes));
    // What torch's own pickle of the tensor list keeps: distributed autograd
    // attaches its RecvRpcBackward to the received tensors that need grad.
    if ((flags & kRequiresGrad) != 0) tensors.back().set_requires_grad(true);
  }
  std::vector<char> payload(m.payload.begin() + static_cast<std::ptrdiff_t>(in.at()),
                            m.payload.end());
  return c10::make_intrusive<trpc::Message>(
      std::move(payload), std::move(tensors), static_cast<trpc::MessageType>(type), id);
}

}  // namespace switchboard::torch_rpc
