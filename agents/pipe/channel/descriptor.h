// ChannelDescriptor: what a worker's tensor channels can do, as its
// announcement carries it to its peers (agents/pipe/announcement.h encodes
// it; docs/wire_formats.md). Plain values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace switchboard::agents::pipe::channel {

// What a worker's tensor channels can do, for its peers to choose how
// tensors travel to it (Channel::carries, agents/pipe/channel/channel.h).
struct ChannelDescriptor {
  // Its host and namespaces (common/host_key.h).
  std::string host_key;
  int64_t pid = 0;
  // It can export and open CUDA device memory (a DeviceIpc is registered,
  // core/device_ipc.h, and the option allows it), also between two
  // workers of one process (a stand-in runtime; CUDA itself refuses).
  bool cuda_ipc = false;
  bool cuda_ipc_own_process = false;
  // Its CUDA devices' UUIDs, by index ("" where unknown).
  std::vector<std::string> device_uuids;
  bool operator==(const ChannelDescriptor&) const = default;
};

}  // namespace switchboard::agents::pipe::channel
