// The channel registry (agents/pipe/channel/registry.h): the order entries
// are tried in and the refusals of add(); which channels a worker gets
// (what is available, what its options turn off) and what its descriptor
// says; the channel chosen per peer and device pair, with the reason; and
// what the receiving side refuses from a peer.
#include "agents/pipe/channel/registry.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "agents/pipe/channel/cpu/cpu.h"
#include "common/error.h"
#include "common/host_key.h"
#include "core/device_ipc.h"
#include "tests/agents/pipe/channel/recording_connection.h"
#include "tests/agents/pipe/fake_device_ipc.h"

using namespace switchboard;
using namespace switchboard::agents::pipe;
using Catch::Contains;
using channel::ChannelContext;
using channel::ChannelDescriptor;
using channel::ChannelEntry;
using channel::ChannelRegistry;
using channel::Channels;

namespace {

ChannelContext context_with(int devices) {
  ChannelContext context;
  context.agent_name = "w0";
  context.device_count = devices;
  context.buffers = HostBufferCache::create();
  return context;
}

std::vector<std::string> names_of(const Channels& channels) {
  std::vector<std::string> out;
  for (const auto& c : channels.all()) out.push_back(c->name());
  return out;
}

ChannelEntry cpu_entry(std::string name, int priority) {
  return {std::move(name), priority,
          [](const ChannelContext& context, ChannelDescriptor&) {
            return std::make_unique<channel::CpuChannel>(context.buffers);
          }};
}

}  // namespace

TEST_CASE("the registry tries its entries by priority and refuses duplicates",
          "[pipe][channel]") {
  ChannelRegistry registry;
  registry.add(cpu_entry("low", 1));
  registry.add(cpu_entry("high", 30));
  registry.add(cpu_entry("middle", 20));
  std::vector<std::string> order;
  for (const auto& e : registry.entries()) order.push_back(e.name);
  CHECK(order == std::vector<std::string>{"high", "middle", "low"});
  CHECK_THROWS_WITH(registry.add(cpu_entry("middle", 5)),
                    Contains("channel \"middle\" is registered already"));
  CHECK_THROWS_WITH(registry.add(ChannelEntry{"nothing", 2, nullptr}),
                    Contains("channel \"nothing\": no make"));
  const Channels made = registry.make(context_with(0));
  CHECK(names_of(made) == std::vector<std::string>{"cpu", "cpu", "cpu"});
}

TEST_CASE(
    "a worker gets cuda_ipc only with a DeviceIpc, CUDA devices and the channel on; "
    "its descriptor says so",
    "[pipe][channel]") {
  const auto& registry = channel::builtin_channels();
  set_device_ipc(nullptr);
  CHECK(names_of(registry.make(context_with(2))) ==
        std::vector<std::string>{"cuda_staged", "cpu"});
  auto ipc = std::make_shared<sbtest::FakeDeviceIpc>(2);
  set_device_ipc(ipc);
  CHECK(names_of(registry.make(context_with(0))) ==
        std::vector<std::string>{"cuda_staged", "cpu"});
  ChannelContext off = context_with(2);
  off.off.insert("cuda_ipc");
  const Channels without = registry.make(off);
  CHECK(names_of(without) == std::vector<std::string>{"cuda_staged", "cpu"});
  CHECK_FALSE(without.descriptor().cuda_ipc);
  const Channels with = registry.make(context_with(2));
  CHECK(names_of(with) == std::vector<std::string>{"cuda_ipc", "cuda_staged", "cpu"});
  const ChannelDescriptor& mine = with.descriptor();
  CHECK(mine.host_key == host_key());
  CHECK(mine.pid > 0);
  CHECK(mine.cuda_ipc);
  CHECK(mine.cuda_ipc_own_process);
  CHECK(mine.device_uuids == std::vector<std::string>{"GPU-fake-0", "GPU-fake-1"});
  set_device_ipc(nullptr);
}

TEST_CASE("the channel is chosen per peer and device pair, with the reason",
          "[pipe][channel]") {
  auto ipc = std::make_shared<sbtest::FakeDeviceIpc>(1);
  set_device_ipc(ipc);
  const Channels channels = channel::builtin_channels().make(context_with(1));
  set_device_ipc(nullptr);
  ChannelDescriptor peer = channels.descriptor();
  peer.pid += 1;
  const size_t big = 1 << 20;
  auto name = [&](const ChannelDescriptor& p, Device src, Device dst, size_t n) {
    const Channels::Choice choice = channels.choose(p, src, dst, n);
    REQUIRE(choice.channel != nullptr);
    return std::string(choice.channel->name());
  };
  const Device cpu = Device::cpu();
  const Device gpu = Device::cuda(0);
  CHECK(name(peer, cpu, cpu, big) == "cpu");
  CHECK_THAT(channels.choose(peer, cpu, cpu, big).why, Contains("CPU to CPU"));
  CHECK(name(peer, gpu, gpu, big) == "cuda_ipc");
  CHECK_THAT(channels.choose(peer, gpu, gpu, big).why, Contains("same host"));
  CHECK(name(peer, gpu, cpu, big) == "cuda_staged");
  CHECK(name(peer, cpu, gpu, big) == "cuda_staged");
  CHECK_THAT(channels.choose(peer, gpu, cpu, big).why, Contains("one end is the CPU"));
  CHECK(name(peer, gpu, gpu, 100) == "cuda_staged");
  CHECK_THAT(channels.choose(peer, gpu, gpu, 100).why,
             Contains("under the 524288 bytes"));
  ChannelDescriptor far = peer;
  far.host_key = "another host";
  CHECK(name(far, gpu, gpu, big) == "cuda_staged");
  CHECK_THAT(channels.choose(far, gpu, gpu, big).why, Contains("another host"));
  ChannelDescriptor same = peer;
  same.pid = channels.descriptor().pid;
  same.cuda_ipc_own_process = false;
  CHECK_THAT(channels.choose(same, gpu, gpu, big).why, Contains("this very process"));
  ChannelDescriptor none = peer;
  none.cuda_ipc = false;
  CHECK_THAT(channels.choose(none, gpu, gpu, big).why,
             Contains("the peer cannot share CUDA memory"));
}

TEST_CASE(
    "a peer's message for a channel this worker lacks, or a tensor routed by one, is a "
    "protocol error naming it",
    "[pipe][channel]") {
  set_device_ipc(nullptr);
  const Channels channels = channel::builtin_channels().make(context_with(0));
  sbtest::RecordingConnection connection;
  CHECK_THROWS_WITH(
      channels.on_message(connection, std::vector<uint8_t>{1, 2, 0}),
      Contains("a message for channel 1, which this worker does not offer"));
  CHECK_THROWS_WITH(channels.on_message(connection, std::vector<uint8_t>{0, 1}),
                    Contains("channel 0"));
  CHECK_THROWS_AS(channels.on_message(connection, std::vector<uint8_t>{}), ProtocolError);
  wire::InboundFrame frame;
  frame.message.id = 4;
  frame.message.tensors.emplace_back();
  frame.devices = {Device::cuda(0)};
  frame.channel_tensors.push_back(
      {0, DType::kFloat32, {8}, {wire::TensorChannel::kCudaIpc, 3, nullptr}});
  CHECK_THROWS_WITH(
      channels.check(connection, frame),
      Contains("frame 4 tensor 0 comes by channel 1, which this worker does "
               "not offer"));
}
