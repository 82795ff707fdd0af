// Device maps without a GPU (device counts are inputs): each init-time rule
// of validate_device_maps, valid configurations, reverse maps, default
// devices, call-time target_device, and the options-time 1-to-1 checks and
// merge semantics of make_device_map and set_device_map.
#include "rpc/device_map.h"

#include <catch2/catch.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/tensor.h"

using namespace switchboard;
using namespace switchboard::rpc;
using Catch::Matchers::Contains;

namespace {

Device cuda(int index) { return Device::cuda(index); }
const Device kCpu = Device::cpu();

WorkerDevices worker(std::string name, int device_count, DeviceMaps maps = {},
                     std::vector<Device> devices = {}) {
  return {std::move(name), device_count, std::move(maps), std::move(devices)};
}

// The message validate_device_maps throws, or "" when it passes.
std::string validation_error(const std::vector<WorkerDevices>& all, bool static_group) {
  try {
    validate_device_maps(all, static_group);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("DeviceLess orders cpu first, then cuda by index", "[device_map]") {
  DeviceLess less;
  CHECK(less(kCpu, cuda(0)));
  CHECK_FALSE(less(cuda(0), kCpu));
  CHECK(less(cuda(0), cuda(1)));
  CHECK_FALSE(less(cuda(1), cuda(1)));
}

TEST_CASE("format_device_map and format_devices render devices", "[device_map]") {
  DeviceMap map{{cuda(0), cuda(1)}, {kCpu, kCpu}};
  CHECK(format_device_map(map) == "{cpu: cpu, cuda:0: cuda:1}");
  CHECK(format_device_map({}) == "{}");
  CHECK(format_devices({cuda(1), cuda(0)}) == "[cuda:1, cuda:0]");
  CHECK(format_devices({}) == "[]");
}

TEST_CASE("is_valid_device accepts cpu and in-range cuda indices", "[device_map]") {
  CHECK(is_valid_device(kCpu, 0));
  CHECK(is_valid_device(cuda(1), 2));
  CHECK_FALSE(is_valid_device(cuda(2), 2));
  CHECK_FALSE(is_valid_device(cuda(0), 0));
}

// ---------------------------------------------------------------------------
// Init time: one test case per rule.

TEST_CASE("rule 0: worker names must be unique", "[device_map]") {
  std::string error = validation_error({worker("w0", 1), worker("w0", 1)}, true);
  CHECK_THAT(error, Contains("\"w0\"") && Contains("more than once"));
}

TEST_CASE("rule 1: a devices list with duplicates is refused", "[device_map]") {
  std::string error =
      validation_error({worker("w0", 2, {}, {cuda(0), cuda(0)}), worker("w1", 2)}, true);
  CHECK_THAT(error, Contains("worker \"w0\"") && Contains("duplicated devices") &&
                        Contains("[cuda:0, cuda:0]"));
}

TEST_CASE("rule 2: devices must be valid for the worker's device count", "[device_map]") {
  SECTION("index past the count") {
    std::string error = validation_error({worker("w0", 2, {}, {cuda(2)})}, true);
    CHECK_THAT(error, Contains("worker \"w0\"") && Contains("invalid indices") &&
                          Contains("[cuda:2]") && Contains("device count 2"));
  }
  SECTION("a worker without GPUs lists cuda:0") {
    std::string error = validation_error({worker("w0", 0, {}, {cuda(0)})}, false);
    CHECK_THAT(error, Contains("invalid indices") && Contains("device count 0"));
  }
  SECTION("cpu is always valid") {
    CHECK(validation_error({worker("w0", 0, {}, {kCpu})}, true).empty());
  }
}

TEST_CASE("rule 3: a static group's maps must name known workers", "[device_map]") {
  std::vector<WorkerDevices> all = {
      worker("w0", 1, {{"w9", {{cuda(0), cuda(0)}}}, {"w8", {{kCpu, kCpu}}}}),
      worker("w1", 1)};
  SECTION("static: error naming the worker and the unknown targets") {
    std::string error = validation_error(all, true);
    CHECK_THAT(error, Contains("worker \"w0\"") && Contains("unknown worker") &&
                          Contains("\"w9\"") && Contains("\"w8\"") &&
                          Contains("\"w0\", \"w1\""));
  }
  SECTION("dynamic: the target may join later") {
    CHECK(validation_error(all, false).empty());
  }
}

TEST_CASE("rule 4: a map's target devices must be distinct", "[device_map]") {
  // Options time refuses this map; validation must too (other clients could
  // send anything).
  DeviceMap map;
  map.emplace(cuda(0), cuda(0));
  map.emplace(cuda(1), cuda(0));
  std::string error =
      validation_error({worker("w0", 2, {{"w1", map}}), worker("w1", 2)}, true);
  CHECK_THAT(error, Contains("from \"w0\" to \"w1\"") &&
                        Contains("duplicate target devices") &&
                        Contains("{cuda:0: cuda:0, cuda:1: cuda:0}"));
}

TEST_CASE("rule 5: sources must be the worker's devices or valid indices",
          "[device_map]") {
  SECTION("source not in the devices list") {
    std::string error = validation_error(
        {worker("w0", 2, {{"w1", {{cuda(1), cuda(0)}}}}, {cuda(0)}), worker("w1", 2)},
        true);
    CHECK_THAT(error, Contains("from \"w0\" to \"w1\"") &&
                          Contains("unexpected source devices [cuda:1]") &&
                          Contains("{cuda:1: cuda:0}") && Contains("are [cuda:0]"));
  }
  SECTION("no devices list: source index past the device count") {
    std::string error = validation_error(
        {worker("w0", 1, {{"w1", {{cuda(1), cuda(0)}}}}), worker("w1", 2)}, true);
    CHECK_THAT(error, Contains("from \"w0\" to \"w1\"") &&
                          Contains("source devices with invalid indices [cuda:1]") &&
                          Contains("device count 1"));
  }
  SECTION("sources in the devices list pass") {
    CHECK(validation_error({worker("w0", 2, {{"w1", {{cuda(1), cuda(0)}}}}, {cuda(1)}),
                            worker("w1", 1)},
                           true)
              .empty());
  }
}

TEST_CASE("rule 6: targets must be the target's devices or valid indices",
          "[device_map]") {
  SECTION("mapping to cuda:1 of a worker with one device") {
    std::string error = validation_error(
        {worker("w0", 1, {{"w1", {{cuda(0), cuda(1)}}}}), worker("w1", 1)}, true);
    CHECK_THAT(error, Contains("from \"w0\" to \"w1\"") &&
                          Contains("target devices with invalid indices [cuda:1]") &&
                          Contains("{cuda:0: cuda:1}") && Contains("device count 1"));
  }
  SECTION("target not in the target's devices list") {
    std::string error = validation_error(
        {worker("w0", 2, {{"w1", {{cuda(0), cuda(1)}}}}), worker("w1", 2, {}, {cuda(0)})},
        true);
    CHECK_THAT(error, Contains("from \"w0\" to \"w1\"") &&
                          Contains("unexpected target devices [cuda:1]") &&
                          Contains("devices of \"w1\" are [cuda:0]"));
  }
  SECTION("an unknown target in a dynamic group is not checked") {
    CHECK(validation_error({worker("w0", 1, {{"w9", {{cuda(0), cuda(7)}}}})}, false)
              .empty());
  }
}

TEST_CASE("cpu to cpu is allowed everywhere", "[device_map]") {
  std::vector<WorkerDevices> all = {
      worker("w0", 0, {{"w1", {{kCpu, kCpu}}}}),
      worker("w1", 0, {{"w0", {{kCpu, kCpu}}}}, {kCpu}),
  };
  CHECK(validation_error(all, true).empty());
  CHECK(validation_error(all, false).empty());
}

TEST_CASE("valid configurations pass", "[device_map]") {
  std::vector<WorkerDevices> all = {
      worker("w0", 2, {{"w1", {{cuda(0), cuda(1)}, {cuda(1), cuda(0)}}}}),
      worker("w1", 2, {{"w2", {{cuda(1), cuda(0)}}}}, {cuda(0), cuda(1)}),
      worker("w2", 1, {{"w0", {{cuda(0), cuda(1)}}}}, {cuda(0)}),
      worker("w3", 0),
  };
  CHECK(validation_error(all, true).empty());
  CHECK(validation_error(all, false).empty());
  CHECK(validation_error({}, true).empty());
}

TEST_CASE("the first broken rule is reported", "[device_map]") {
  // Both duplicated devices (rule 1) and an unknown target (rule 3).
  std::string error =
      validation_error({worker("w0", 1, {{"w9", {}}}, {cuda(0), cuda(0)})}, true);
  CHECK_THAT(error, Contains("duplicated devices"));
  CHECK_THAT(error, !Contains("unknown worker"));
}

// ---------------------------------------------------------------------------
// Reverse maps and default devices.

TEST_CASE("reverse_device_maps inverts every map that targets me", "[device_map]") {
  std::vector<WorkerDevices> all = {
      worker("w0", 2,
             {{"w1", {{cuda(0), cuda(1)}, {cuda(1), cuda(0)}}},
              {"w2", {{cuda(0), cuda(0)}}}}),
      worker("w1", 2, {{"w2", {{cuda(1), cuda(2)}}}}),
      worker("w2", 3, {{"w0", {{cuda(2), cuda(1)}}}}),
  };
  DeviceMaps for_w2 = reverse_device_maps("w2", all);
  REQUIRE(for_w2.size() == 2);
  CHECK(for_w2.at("w0") == DeviceMap{{cuda(0), cuda(0)}});
  CHECK(for_w2.at("w1") == DeviceMap{{cuda(2), cuda(1)}});

  DeviceMaps for_w1 = reverse_device_maps("w1", all);
  REQUIRE(for_w1.size() == 1);
  CHECK(for_w1.at("w0") == DeviceMap{{cuda(1), cuda(0)}, {cuda(0), cuda(1)}});

  DeviceMaps for_w0 = reverse_device_maps("w0", all);
  REQUIRE(for_w0.size() == 1);
  CHECK(for_w0.at("w2") == DeviceMap{{cuda(1), cuda(2)}});

  CHECK(reverse_device_maps("w9", all).empty());
}

TEST_CASE("invert_device_map refuses a map that is not 1-to-1", "[device_map]") {
  DeviceMap map;
  map.emplace(cuda(0), cuda(0));
  map.emplace(cuda(1), cuda(0));
  CHECK_THROWS_WITH(invert_device_map(map),
                    Contains("cuda:0 and cuda:1 both map to cuda:0"));
}

TEST_CASE("default_devices derives devices from maps when none are given",
          "[device_map]") {
  SECTION("explicit devices are returned sorted") {
    CHECK(default_devices({cuda(2), cuda(0), cuda(1)}, {}, {}) ==
          std::vector<Device>{cuda(0), cuda(1), cuda(2)});
  }
  SECTION("empty devices: sources of my maps and of the reverse maps, cpu dropped") {
    DeviceMaps mine = {{"w1", {{cuda(3), cuda(0)}, {kCpu, kCpu}}},
                       {"w2", {{cuda(1), cuda(1)}}}};
    DeviceMaps reverse = {{"w1", {{cuda(0), cuda(2)}, {cuda(1), cuda(0)}}},
                          {"w3", {{kCpu, kCpu}}}};
    CHECK(default_devices({}, mine, reverse) ==
          std::vector<Device>{cuda(0), cuda(1), cuda(3)});
  }
  SECTION("no devices and no maps: none") { CHECK(default_devices({}, {}, {}).empty()); }
  SECTION("from gathered data, through reverse_device_maps") {
    std::vector<WorkerDevices> all = {
        worker("w0", 2, {{"w1", {{cuda(1), cuda(0)}}}}),
        worker("w1", 4, {{"w0", {{cuda(3), cuda(0)}}}}),
    };
    DeviceMaps reverse = reverse_device_maps("w1", all);  // {w0: {cuda:0: cuda:1}}
    CHECK(default_devices({}, all[1].device_maps, reverse) ==
          std::vector<Device>{cuda(0), cuda(3)});
  }
}

// ---------------------------------------------------------------------------
// Call time.

TEST_CASE("target_device maps cuda tensors and leaves cpu tensors on cpu",
          "[device_map]") {
  DeviceMaps maps = {{"w1", {{cuda(0), cuda(1)}}}};
  CHECK(target_device(maps, "w1", kCpu) == kCpu);
  CHECK(target_device(maps, "w9", kCpu) == kCpu);
  CHECK(target_device(maps, "w1", cuda(0)) == cuda(1));
}

TEST_CASE("target_device refuses an unmapped cuda tensor with advice", "[device_map]") {
  DeviceMaps maps = {{"w1", {{cuda(1), cuda(0)}}}};
  SECTION("no entry for the device") {
    CHECK_THROWS_WITH(
        target_device(maps, "w1", cuda(0), 0),
        Contains("rpc to \"w1\"") && Contains("tensor 0 is on cuda:0") &&
            Contains("no entry for cuda:0") && Contains("{cuda:1: cuda:0}") &&
            Contains("move the tensor to the CPU") && Contains("set_device_map(\"w1\""));
  }
  SECTION("no map for the worker") {
    CHECK_THROWS_WITH(target_device(maps, "w2", cuda(0)),
                      Contains("rpc to \"w2\"") && Contains("a tensor is on cuda:0") &&
                          Contains("no device map for \"w2\"") &&
                          Contains("set_device_map(\"w2\""));
  }
  SECTION("the exception type is std::invalid_argument") {
    CHECK_THROWS_AS(target_device(maps, "w1", cuda(3), 2), std::invalid_argument);
  }
}

// ---------------------------------------------------------------------------
// Options time.

TEST_CASE("make_device_map builds 1-to-1 maps", "[device_map]") {
  SECTION("from devices and from strings") {
    DeviceMap expected{{cuda(0), cuda(1)}, {kCpu, kCpu}};
    CHECK(make_device_map({{cuda(0), cuda(1)}, {kCpu, kCpu}}) == expected);
    CHECK(make_device_map(std::vector<std::pair<std::string, std::string>>{
              {"cuda:0", "cuda:1"}, {"cpu", "cpu"}}) == expected);
  }
  SECTION("a pair given twice is kept once") {
    CHECK(make_device_map({{cuda(0), cuda(1)}, {cuda(0), cuda(1)}}).size() == 1);
  }
  SECTION("two sources to one target") {
    CHECK_THROWS_WITH(make_device_map({{cuda(0), cuda(0)}, {cuda(1), cuda(0)}}, "w1"),
                      Contains("device_map for \"w1\"") &&
                          Contains("cuda:0 and cuda:1 both map to cuda:0") &&
                          Contains("1-to-1"));
  }
  SECTION("one source to two targets") {
    CHECK_THROWS_WITH(make_device_map({{cuda(0), cuda(1)}, {cuda(0), cuda(2)}}, "w1"),
                      Contains("device_map for \"w1\"") &&
                          Contains("cuda:0 is mapped to both cuda:1 and cuda:2"));
  }
  SECTION("text Device::parse rejects") {
    CHECK_THROWS_AS(make_device_map(std::vector<std::pair<std::string, std::string>>{
                        {"gpu:0", "cuda:0"}}),
                    std::invalid_argument);
  }
}

TEST_CASE("set_device_map merges and keeps maps 1-to-1", "[device_map]") {
  DeviceMaps maps;
  set_device_map(maps, "w1", {{cuda(0), cuda(1)}});
  set_device_map(maps, "w1", {{cuda(1), cuda(0)}});
  set_device_map(maps, "w2", {{cuda(0), cuda(0)}});
  CHECK(maps.at("w1") == DeviceMap{{cuda(0), cuda(1)}, {cuda(1), cuda(0)}});
  CHECK(maps.at("w2") == DeviceMap{{cuda(0), cuda(0)}});

  SECTION("re-setting the same pair is fine") {
    set_device_map(maps, "w1", {{cuda(0), cuda(1)}});
    CHECK(maps.at("w1").size() == 2);
  }
  SECTION("remapping a key is refused, naming worker, key and both values") {
    const DeviceMaps before = maps;
    CHECK_THROWS_WITH(
        set_device_map(maps, "w1", {{cuda(2), cuda(2)}, {cuda(0), cuda(3)}}),
        Contains("\"w1\"") && Contains("cuda:0 is mapped to both cuda:1 and cuda:3"));
    CHECK(maps == before);  // nothing merged, not even cuda:2
  }
  SECTION("a target used by another key is refused") {
    const DeviceMaps before = maps;
    CHECK_THROWS_WITH(
        set_device_map(maps, "w1", {{cuda(2), cuda(1)}}),
        Contains("\"w1\"") && Contains("cuda:0 and cuda:2 both map to cuda:1"));
    CHECK(maps == before);
  }
  SECTION("a map that is not 1-to-1 on its own is refused") {
    DeviceMap bad;
    bad.emplace(cuda(4), cuda(5));
    bad.emplace(cuda(6), cuda(5));
    CHECK_THROWS_WITH(
        set_device_map(maps, "w3", bad),
        Contains("\"w3\"") && Contains("cuda:4 and cuda:6 both map to cuda:5"));
    CHECK_FALSE(maps.contains("w3"));
  }
}
