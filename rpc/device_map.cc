#include "rpc/device_map.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <stdexcept>

namespace switchboard::rpc {
namespace {

using DeviceSet = std::set<Device, DeviceLess>;

std::vector<std::string> device_strs(const std::vector<Device>& devices) {
  std::vector<std::string> out;
  out.reserve(devices.size());
  for (const Device& device : devices) out.push_back(device.str());
  return out;
}

std::string quoted_list(const std::vector<std::string>& names) {
  std::vector<std::string> quoted;
  for (const std::string& name : names) quoted.push_back(fmt::format("\"{}\"", name));
  return fmt::format("{}", fmt::join(quoted, ", "));
}

// Adds source → target to `map`, keeping it 1-to-1. `prefix` starts every
// error message (it names the map's worker).
void add_entry(DeviceMap& map, const Device& source, const Device& target,
               const std::string& prefix) {
  if (auto it = map.find(source); it != map.end()) {
    if (it->second == target) return;
    throw std::invalid_argument(
        fmt::format("{}{} is mapped to both {} and {}; maps must be 1-to-1", prefix,
                    source.str(), it->second.str(), target.str()));
  }
  for (const auto& [other, other_target] : map) {
    if (other_target == target) {
      throw std::invalid_argument(
          fmt::format("{}{} and {} both map to {}; maps must be 1-to-1", prefix,
                      other.str(), source.str(), target.str()));
    }
  }
  map.emplace(source, target);
}

std::string map_prefix(std::string_view worker) {
  return worker.empty() ? std::string("device_map: ")
                        : fmt::format("device_map for \"{}\": ", worker);
}

std::vector<Device> sources_of(const DeviceMap& map) {
  std::vector<Device> out;
  for (const auto& [source, target] : map) out.push_back(source);
  return out;
}

std::vector<Device> targets_of(const DeviceMap& map) {
  std::vector<Device> out;
  for (const auto& [source, target] : map) out.push_back(target);
  return out;
}

// The devices of `devices` that are not in `allowed`.
std::vector<Device> not_in(const std::vector<Device>& devices,
                           const std::vector<Device>& allowed) {
  std::vector<Device> out;
  for (const Device& device : devices) {
    if (std::find(allowed.begin(), allowed.end(), device) == allowed.end()) {
      out.push_back(device);
    }
  }
  return out;
}

// The devices of `devices` that are invalid for `device_count`.
std::vector<Device> invalid_for(const std::vector<Device>& devices, int device_count) {
  std::vector<Device> out;
  for (const Device& device : devices) {
    if (!is_valid_device(device, device_count)) out.push_back(device);
  }
  return out;
}

using WorkerIndex = std::map<std::string, const WorkerDevices*>;

WorkerIndex index_workers(const std::vector<WorkerDevices>& all) {
  WorkerIndex index;
  for (const WorkerDevices& worker : all) {
    if (!index.emplace(worker.name, &worker).second) {
      throw std::invalid_argument(
          fmt::format("device map validation: worker name \"{}\" appears more than once",
                      worker.name));
    }
  }
  return index;
}

// Rules 1 and 2: W's own devices list.
void validate_devices(const WorkerDevices& w) {
  DeviceSet seen;
  for (const Device& device : w.devices) {
    if (!seen.insert(device).second) {
      throw std::invalid_argument(fmt::format(
          "worker \"{}\" has duplicated devices {} ({} appears more than once)", w.name,
          format_devices(w.devices), device.str()));
    }
  }
  std::vector<Device> invalid = invalid_for(w.devices, w.device_count);
  if (!invalid.empty()) {
    throw std::invalid_argument(fmt::format(
        "worker \"{}\" has devices with invalid indices {} (devices {}, device count {})",
        w.name, format_devices(invalid), format_devices(w.devices), w.device_count));
  }
}

// Rule 3 (static group): every target of W's maps is a known worker.
void validate_targets_known(const WorkerDevices& w, const WorkerIndex& index) {
  std::vector<std::string> unknown;
  for (const auto& [target, map] : w.device_maps) {
    if (!index.contains(target)) unknown.push_back(target);
  }
  if (unknown.empty()) return;
  std::vector<std::string> known;
  for (const auto& [name, worker] : index) known.push_back(name);
  throw std::invalid_argument(fmt::format(
      "worker \"{}\" has device maps to unknown worker(s) {}; the group's workers are {}",
      w.name, quoted_list(unknown), quoted_list(known)));
}

// Rule 4: the map's target devices are distinct.
void validate_distinct_targets(const WorkerDevices& w, const std::string& to,
                               const DeviceMap& map) {
  DeviceSet seen;
  for (const auto& [source, target] : map) {
    if (!seen.insert(target).second) {
      throw std::invalid_argument(fmt::format(
          "device map from \"{}\" to \"{}\" has duplicate target devices ({} more than "
          "once): {}",
          w.name, to, target.str(), format_device_map(map)));
    }
  }
}

// Rule 5: sources are W's devices, or valid for W's device count.
void validate_sources(const WorkerDevices& w, const std::string& to,
                      const DeviceMap& map) {
  std::vector<Device> sources = sources_of(map);
  if (!w.devices.empty()) {
    std::vector<Device> bad = not_in(sources, w.devices);
    if (bad.empty()) return;
    throw std::invalid_argument(
        fmt::format("device map from \"{}\" to \"{}\" has unexpected source devices {}: "
                    "{}; the devices of \"{}\" are {}",
                    w.name, to, format_devices(bad), format_device_map(map), w.name,
                    format_devices(w.devices)));
  }
  std::vector<Device> bad = invalid_for(sources, w.device_count);
  if (bad.empty()) return;
  throw std::invalid_argument(fmt::format(
      "device map from \"{}\" to \"{}\" has source devices with invalid indices {}: {}; "
      "\"{}\" has device count {}",
      w.name, to, format_devices(bad), format_device_map(map), w.name, w.device_count));
}

// Rule 6: targets are T's devices, or valid for T's device count.
void validate_targets(const WorkerDevices& w, const WorkerDevices& t,
                      const DeviceMap& map) {
  std::vector<Device> targets = targets_of(map);
  if (!t.devices.empty()) {
    std::vector<Device> bad = not_in(targets, t.devices);
    if (bad.empty()) return;
    throw std::invalid_argument(
        fmt::format("device map from \"{}\" to \"{}\" has unexpected target devices {}: "
                    "{}; the devices of \"{}\" are {}",
                    w.name, t.name, format_devices(bad), format_device_map(map), t.name,
                    format_devices(t.devices)));
  }
  std::vector<Device> bad = invalid_for(targets, t.device_count);
  if (bad.empty()) return;
  throw std::invalid_argument(fmt::format(
      "device map from \"{}\" to \"{}\" has target devices with invalid indices {}: {}; "
      "\"{}\" has device count {}",
      w.name, t.name, format_devices(bad), format_device_map(map), t.name,
      t.device_count));
}

}  // namespace

std::string format_device_map(const DeviceMap& map) {
  std::vector<std::string> entries;
  for (const auto& [source, target] : map) {
    entries.push_back(fmt::format("{}: {}", source.str(), target.str()));
  }
  return fmt::format("{{{}}}", fmt::join(entries, ", "));
}

std::string format_devices(const std::vector<Device>& devices) {
  return fmt::format("[{}]", fmt::join(device_strs(devices), ", "));
}

bool is_valid_device(const Device& device, int device_count) {
  if (device.is_cpu()) return true;
  return device.is_cuda() && device.index >= 0 && device.index < device_count;
}

DeviceMap make_device_map(const std::vector<std::pair<Device, Device>>& entries,
                          std::string_view worker) {
  const std::string prefix = map_prefix(worker);
  DeviceMap map;
  for (const auto& [source, target] : entries) add_entry(map, source, target, prefix);
  return map;
}

DeviceMap make_device_map(const std::vector<std::pair<std::string, std::string>>& entries,
                          std::string_view worker) {
  std::vector<std::pair<Device, Device>> parsed;
  parsed.reserve(entries.size());
  for (const auto& [source, target] : entries) {
    parsed.emplace_back(Device::parse(source), Device::parse(target));
  }
  return make_device_map(parsed, worker);
}

void set_device_map(DeviceMaps& maps, const std::string& worker, const DeviceMap& map) {
  const std::string prefix = map_prefix(worker);
  auto it = maps.find(worker);
  DeviceMap merged = it == maps.end() ? DeviceMap{} : it->second;
  for (const auto& [source, target] : map) add_entry(merged, source, target, prefix);
  maps[worker] = std::move(merged);  // only once every entry is accepted
}

DeviceMap invert_device_map(const DeviceMap& map) {
  DeviceMap inverse;
  for (const auto& [source, target] : map) {
    if (auto [it, inserted] = inverse.emplace(target, source); !inserted) {
      throw std::invalid_argument(fmt::format(
          "cannot invert device map {}: {} and {} both map to {}", format_device_map(map),
          it->second.str(), source.str(), target.str()));
    }
  }
  return inverse;
}

void validate_device_maps(const std::vector<WorkerDevices>& all, bool static_group) {
  const WorkerIndex index = index_workers(all);
  for (const WorkerDevices& w : all) {
    validate_devices(w);
    if (static_group) validate_targets_known(w, index);
    for (const auto& [to, map] : w.device_maps) {
      validate_distinct_targets(w, to, map);
      validate_sources(w, to, map);
      if (auto t = index.find(to); t != index.end()) validate_targets(w, *t->second, map);
    }
  }
}

DeviceMaps reverse_device_maps(const std::string& me,
                               const std::vector<WorkerDevices>& all) {
  DeviceMaps reverse;
  for (const WorkerDevices& w : all) {
    if (auto it = w.device_maps.find(me); it != w.device_maps.end()) {
      reverse[w.name] = invert_device_map(it->second);
    }
  }
  return reverse;
}

std::vector<Device> default_devices(const std::vector<Device>& my_devices,
                                    const DeviceMaps& my_maps,
                                    const DeviceMaps& reverse) {
  if (!my_devices.empty()) {
    std::vector<Device> sorted = my_devices;
    std::sort(sorted.begin(), sorted.end(), DeviceLess{});
    return sorted;
  }
  DeviceSet devices;
  for (const DeviceMaps* maps : {&my_maps, &reverse}) {
    for (const auto& [worker, map] : *maps) {
      for (const auto& [source, target] : map) {
        if (source.is_cuda()) devices.insert(source);
      }
    }
  }
  return {devices.begin(), devices.end()};
}

Device target_device(const DeviceMaps& maps, const std::string& to,
                     const Device& tensor_device, std::optional<size_t> tensor_index) {
  if (tensor_device.is_cpu()) return Device::cpu();
  auto map = maps.find(to);
  if (map != maps.end()) {
    if (auto it = map->second.find(tensor_device); it != map->second.end())
      return it->second;
  }
  const std::string tensor =
      tensor_index ? fmt::format("tensor {}", *tensor_index) : std::string("a tensor");
  const std::string missing =
      map == maps.end()
          ? fmt::format("there is no device map for \"{}\"", to)
          : fmt::format("the device map for \"{}\" {} has no entry for {}", to,
                        format_device_map(map->second), tensor_device.str());
  throw std::invalid_argument(fmt::format(
      "rpc to \"{}\": {} is on {}, but {}; move the tensor to the CPU first, or map the "
      "device with set_device_map(\"{}\", {{{{\"{}\", <device on \"{}\">}}}})",
      to, tensor, tensor_device.str(), missing, to, tensor_device.str(), to));
}

}  // namespace switchboard::rpc
