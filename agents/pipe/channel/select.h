// How a tensor travels from this worker to a peer: the channel chosen per
// peer and per (source device, target device) pair, from the two workers'
// ChannelDescriptors (descriptor.h, exchanged in their announcements).
//
// Fallback order, first that applies:
//   cuda_ipc     CUDA to CUDA, both workers on one host (same boot, network,
//                IPC and PID namespaces), both able to share device memory
//                (CUDA IPC: pipe/channel/cuda_ipc/cuda_ipc.h), not one process
//                (unless its runtime allows that), the tensor at least
//                kCudaIpcMinBytes;
//   cuda_staged  any CUDA end: through host memory, the bytes in the frame;
//   cpu          CPU to CPU: the bytes in the frame (which the same-host
//                lane carries through shared memory when it is on).
// Pure code; thread-safe.
#pragma once

#include <cstddef>
#include <string>

#include "agents/pipe/channel/descriptor.h"
#include "agents/pipe/wire/frame.h"
#include "core/tensor.h"

namespace switchboard::agents::pipe::channel {

// Smaller CUDA tensors take the staged path. Each cuda_ipc transfer runs a
// copy on the device in each of the two processes, and on a GPU shared by
// two processes the second waits for the GPU to switch between them: an
// echo round trip took about 500 us at any size up to 4 MiB on an H100,
// where staged it took 240 us at 64 KiB, 400 us at 256 KiB and 820 us at
// 1 MiB (tools/bench:cuda_echo, both in one run).
inline constexpr size_t kCudaIpcMinBytes = 512 * 1024;

struct Choice {
  wire::TensorChannel channel = wire::TensorChannel::kInline;
  const char* name = "cpu";  // "cpu", "cuda_staged" or "cuda_ipc"
  std::string why;           // for the log: why this one and not a faster one
};

// The channel for a tensor of `nbytes` from `src` here to `dst` at the peer.
Choice choose(const ChannelDescriptor& mine, const ChannelDescriptor& peer, Device src,
              Device dst, size_t nbytes);

}  // namespace switchboard::agents::pipe::channel
