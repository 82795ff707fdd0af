#include "agents/pipe/channel/select.h"

#include <fmt/format.h>

namespace switchboard::agents::pipe::channel {

Choice choose(const ChannelDescriptor& mine, const ChannelDescriptor& peer, Device src,
              Device dst, size_t nbytes) {
  if (src.is_cpu() && dst.is_cpu())
    return {wire::TensorChannel::kInline, "cpu", "CPU to CPU"};
  auto staged = [](std::string why) {
    return Choice{wire::TensorChannel::kInline, "cuda_staged", std::move(why)};
  };
  if (src.is_cpu() || dst.is_cpu()) return staged("one end is the CPU");
  if (!mine.cuda_ipc) return staged("this worker cannot share CUDA memory (no CUDA IPC)");
  if (!peer.cuda_ipc) return staged("the peer cannot share CUDA memory (no CUDA IPC)");
  if (mine.host_key != peer.host_key) {
    return staged("the peer runs on another host (or in other namespaces)");
  }
  if (mine.pid == peer.pid && !(mine.cuda_ipc_own_process && peer.cuda_ipc_own_process)) {
    return staged("the peer is this very process (CUDA IPC cannot open its own memory)");
  }
  if (nbytes < kCudaIpcMinBytes) {
    return staged(fmt::format("{} bytes, under the {} bytes worth an outbox", nbytes,
                              kCudaIpcMinBytes));
  }
  return {wire::TensorChannel::kCudaIpc, "cuda_ipc", "same host, both share CUDA memory"};
}

}  // namespace switchboard::agents::pipe::channel
