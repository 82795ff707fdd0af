// How a torch RPC Message travels inside a Switchboard message: the codec
// between torch::distributed::rpc::Message (type, id, pickled payload,
// tensors) and rpc::Message (payload bytes, Switchboard tensors).
//
// Layout of the Switchboard payload (little-endian):
//   u8  version (1)
//   i32 torch's MessageType
//   u32 tensor count n (torch's tensors)
//   n times, a strided tensor:
//            i8 the tensor's c10::ScalarType, u8 flags (kRequiresGrad),
//            u8 ndim (at most 64), i64 sizes[ndim], i64 strides[ndim]
//          or a sparse COO tensor:
//            i8 its values' c10::ScalarType, u8 flags (kSparseCoo, and
//            kRequiresGrad, kCoalesced), u8 ndim, i64 sizes[ndim], then
//            its indices and its values, each as a strided tensor (flags 0)
//   torch's payload, to the end
// Every strided tensor, a sparse one's parts included, is one Switchboard
// tensor, in order.
// Each tensor travels as a flat uint8 Switchboard tensor over the torch
// tensor's own bytes, from its first element to its last (no copy; a view
// that spans 8 KiB or more and at least twice its elements goes as a
// compact copy, as torch's own rule does), and
// comes back as a torch tensor over the received bytes with the same sizes
// and strides (no copy): any dtype torch has crosses, layouts are kept as
// torch's own pickle keeps them, and PIPE moves the bytes (the same-host
// lane, device maps and CUDA channels included). A sparse COO tensor
// travels as its indices and values (coalesced or not, as it was), as
// torch's pickle carries it.
//
// CUDA streams: encode() orders PIPE's read of each CUDA tensor after the
// work queued on the calling thread's current stream of its device (as
// TensorPipe records it), without waiting on the host; a received tensor
// is ready on every stream when decode() sees it (PIPE finishes its copies
// first).
//
// Errors: encode() throws std::invalid_argument for a tensor Switchboard
// cannot carry (a sparse layout other than COO, a quantized or MKL-DNN one,
// a device other than CPU and CUDA), naming it. decode() throws
// std::invalid_argument naming what is wrong with bytes from the network
// (version, counts, a dtype, sizes that do not match the bytes that came,
// a sparse tensor's indices out of its bounds or parts that disagree),
// never reading out of bounds.
//
// Thread safety: stateless.
#pragma once

#include <torch/csrc/distributed/rpc/message.h>

#include "core/message.h"

namespace switchboard::torch_rpc {

inline constexpr uint8_t kCodecVersion = 1;
inline constexpr uint8_t kMaxDims = 64;
// The tensor needs grad (distributed autograd's received tensors do).
inline constexpr uint8_t kRequiresGrad = 0x01;
// A sparse COO tensor: its indices and values follow as strided tensors.
inline constexpr uint8_t kSparseCoo = 0x02;
// With kSparseCoo: the tensor was coalesced (torch's is_coalesced()).
inline constexpr uint8_t kCoalesced = 0x04;

// `m`'s type, payload and tensors as a Switchboard message of `type`
// (its id, function and timeout left for the caller).
rpc::Message encode(const torch::distributed::rpc::Message& m, rpc::MessageType type);

// The torch message `m` carries, with id `id`.
c10::intrusive_ptr<torch::distributed::rpc::Message> decode(const rpc::Message& m,
                                                            int64_t id);

}  // namespace switchboard::torch_rpc
