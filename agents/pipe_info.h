// What PIPE workers tell each other at rendezvous (all-gathered over the
// Gloo group) and in a connection's hello frame. Internal to agents/.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "collective/tensor.h"
#include "rpc/device_map.h"

namespace switchboard::collective {
class ProcessGroup;
}

namespace switchboard::agents {

struct WorkerAnnouncement {
  std::string name;
  std::string address;
  int port = 0;
  int device_count = 0;
  rpc::DeviceMaps device_maps;
  std::vector<Device> devices;
};

// msgpack; decode throws std::invalid_argument on malformed bytes.
std::vector<uint8_t> encode_announcement(const WorkerAnnouncement& a);
WorkerAnnouncement decode_announcement(const uint8_t* data, size_t size);

// Every rank's announcement, by rank (two Gloo allgathers: the lengths, then
// the padded bytes). TimeoutError after `timeout` (0: the group's).
std::vector<WorkerAnnouncement> allgather_announcements(collective::ProcessGroup& group,
                                                        const WorkerAnnouncement& mine,
                                                        std::chrono::milliseconds timeout);

// std::invalid_argument naming a name used by several ranks, and the ranks.
void check_unique_names(const std::vector<WorkerAnnouncement>& all);

// A hello frame's payload: the connecting worker's rank and name.
std::vector<uint8_t> encode_hello(int rank, const std::string& name);
// Throws std::invalid_argument on malformed bytes.
std::pair<int, std::string> decode_hello(const std::vector<uint8_t>& payload);

}  // namespace switchboard::agents
