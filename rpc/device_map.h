// Device maps: which device a tensor lands on when it travels to another
// worker, and the rules that keep a group's maps consistent (the rules
// PyTorch's TensorPipe backend enforces).
//
// A DeviceMap belongs to one (caller, target) pair and maps a device of the
// caller to a device of the target: {cuda:0: cuda:1} means "a tensor on my
// cuda:0 arrives on the target's cuda:1". A response travels back along the
// inverse of the caller's map (reverse_device_maps). A CPU tensor always
// arrives on the CPU; CPU entries in a map are accepted and never consulted.
//
// Three moments use these functions:
//
// Options time (RpcBackendOptions::set_device_map / set_devices), on one
// worker, before any peer is known:
//   - A map is 1-to-1: no source appears twice with different targets, and
//     no two sources share a target. make_device_map and set_device_map
//     enforce it; set_device_map merges into the map already set for a
//     worker and refuses to remap an existing source to a different target
//     (re-setting the same pair is a no-op).
//   - The devices list is only parsed; it is validated at init.
//
// Init time: every worker all-gathers each worker's name, device count,
// device maps and devices, then runs validate_device_maps on the same data,
// so every worker reaches the same verdict. For each worker W, in order:
//   0. Worker names in `all` are unique.
//   1. W's devices list has no duplicates ("duplicated devices").
//   2. W's devices are cpu or cuda:i with 0 <= i < W.device_count
//      ("devices with invalid indices").
//   3. Static group only: every target of W's maps is a known worker
//      ("unknown worker"); in a dynamic group the target may join later.
//   For each of W's maps, to target T:
//   4. The map's target devices are distinct ("duplicate target devices").
//   5. Sources: if W.devices is non-empty, every source is in it
//      ("unexpected source devices"); otherwise every source is valid for
//      W.device_count ("source devices with invalid indices").
//   6. Targets, when T is known: if T.devices is non-empty, every target is
//      in it ("unexpected target devices"); otherwise every target is valid
//      for T.device_count ("target devices with invalid indices"). An
//      unknown T (dynamic group) is not checked.
// Then reverse_device_maps builds the maps for responses and default_devices
// derives the devices a worker uses when its devices list is empty.
//
// Call time: target_device maps each tensor of an outgoing message.
//
// Errors: every failure throws std::invalid_argument (a configuration bug);
// the message names the worker(s), the rule's phrase quoted above, and shows
// the offending map or devices. One rule per message: the first broken rule
// wins.
//
// Thread safety: pure functions over values; no I/O, no CUDA, no shared
// state. Safe to call from any thread.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace switchboard::rpc {

// Orders devices: cpu first, then CUDA devices by index.
struct DeviceLess {
  bool operator()(const Device& a, const Device& b) const {
    if (a.type != b.type) return a.type < b.type;
    return a.index < b.index;
  }
};

// Local device → remote device, for one target worker.
using DeviceMap = std::map<Device, Device, DeviceLess>;
// Target worker name → its DeviceMap.
using DeviceMaps = std::map<std::string, DeviceMap>;

// What each worker contributes to the init-time all-gather.
struct WorkerDevices {
  std::string name;
  int device_count = 0;         // CUDA devices visible to the worker
  DeviceMaps device_maps;       // its maps, by target worker name
  std::vector<Device> devices;  // its devices option (may be empty)
};

// ---------------------------------------------------------------------------
// Formatting, for messages.

// "{cpu: cpu, cuda:0: cuda:1}" (in DeviceLess order of the sources).
std::string format_device_map(const DeviceMap& map);
// "[cuda:0, cuda:1]" (in the given order).
std::string format_devices(const std::vector<Device>& devices);

// True for cpu and for cuda:i with 0 <= i < device_count.
bool is_valid_device(const Device& device, int device_count);

// ---------------------------------------------------------------------------
// Options time.

// Builds a 1-to-1 map from (source, target) pairs. A pair given twice is
// kept once. Throws std::invalid_argument when a source is given two
// different targets, or two sources share a target, naming both and, when
// `worker` is non-empty, the worker the map is for. The string overload also
// throws for text Device::parse rejects.
DeviceMap make_device_map(const std::vector<std::pair<Device, Device>>& entries,
                          std::string_view worker = {});
DeviceMap make_device_map(const std::vector<std::pair<std::string, std::string>>& entries,
                          std::string_view worker = {});

// Merges `map` into maps[worker]. Re-setting an existing pair is a no-op.
// Throws std::invalid_argument, leaving `maps` unchanged, when a source
// already maps to a different target (naming the worker, the source and
// both targets) or a target is already used by another source (naming the
// worker, both sources and the target).
void set_device_map(DeviceMaps& maps, const std::string& worker, const DeviceMap& map);

// The inverse of a 1-to-1 map (target → source). Throws
// std::invalid_argument when two sources share a target.
DeviceMap invert_device_map(const DeviceMap& map);

// ---------------------------------------------------------------------------
// Init time.

// Checks the rules above for every worker in `all` (the gathered data; order
// does not matter). `static_group`: world size known, every worker present.
// Throws std::invalid_argument for the first broken rule.
void validate_device_maps(const std::vector<WorkerDevices>& all, bool static_group);

// The maps `me` uses for responses: for every worker W in `all` whose maps
// have an entry for `me`, result[W.name] is the inverse of
// W.device_maps[me] (my device → W's device). Expects validated data;
// throws std::invalid_argument if such a map is not 1-to-1.
DeviceMaps reverse_device_maps(const std::string& me,
                               const std::vector<WorkerDevices>& all);

// The devices a worker uses: `my_devices` sorted (DeviceLess) when
// non-empty; otherwise the union of the sources of `my_maps` and of
// `reverse` (reverse_device_maps(me, all)), without cpu, sorted by index.
std::vector<Device> default_devices(const std::vector<Device>& my_devices,
                                    const DeviceMaps& my_maps, const DeviceMaps& reverse);

// ---------------------------------------------------------------------------
// Call time.

// Where a tensor on `tensor_device` lands on worker `to`: cpu for a CPU
// tensor, maps[to][tensor_device] for a CUDA tensor. Throws
// std::invalid_argument when there is no map for `to`, or no entry for the
// device, naming the worker, the device and (when given) the tensor's index
// in the message, and telling the user to move the tensor to the CPU or
// call set_device_map.
Device target_device(const DeviceMaps& maps, const std::string& to,
                     const Device& tensor_device,
                     std::optional<size_t> tensor_index = std::nullopt);

}  // namespace switchboard::rpc
