// The PIPE agent's tensors on their way (agents/pipe/agent_impl.h): each
// sent by its channel (agents/pipe/channel/registry.h), each received
// from its channel on the device its descriptor names, and the log of the
// channels chosen. Split from agent.cc, which wires the rest.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "agents/pipe/agent_impl.h"
#include "common/check.h"

namespace switchboard::agents::pipe {

using rpc::Message;

// A self-send's message with its own copies of the tensors, each on
// devices[i] (the device map's target) or, when `devices` is empty, on the
// CPU.
Message copy_tensors(Message m, const std::vector<Device>& devices) {
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    m.tensors[i] = m.tensors[i].to(devices.empty() ? Device::cpu() : devices[i]);
  }
  return m;
}

channel::Channels make_channels(const std::string& name, const PipeAgentOptions& options,
                                int device_count,
                                std::shared_ptr<HostBufferCache> buffers) {
  channel::ChannelContext context;
  context.agent_name = name;
  context.device_count = device_count;
  context.buffers = std::move(buffers);
  const char* variable = std::getenv("SWITCHBOARD_PIPE_CUDA_IPC");
  if (!options.cuda_ipc.value_or(variable == nullptr ||
                                 std::string_view(variable) != "0"))
    context.off.insert("cuda_ipc");
  return channel::builtin_channels().make(context);
}

// A response whose tensors go to CUDA devices is placed there on the pool
// (the copies must not hold up this connection's reads); any other
// completes here.
void PipeAgent::Impl::complete(wire::InboundFrame response,
                               std::shared_ptr<transport::Connection> connection) {
  const bool placed = std::any_of(response.devices.begin(), response.devices.end(),
                                  [](const Device& d) { return !d.is_cpu(); });
  if (!placed) {
    complete_now(std::move(response.message));
    return;
  }
  // Destroyed with `place`, run or not: what it still holds goes back.
  auto unfetched = std::make_shared<Unfetched>(weak_from_this(), std::move(connection),
                                               std::move(response.channel_tensors));
  auto place = [self = shared_from_this(), response = std::move(response),
                unfetched = std::move(unfetched)]() mutable {
    const uint64_t id = response.message.id;
    const std::optional<int> from = self->calls.destination(id);
    if (!from) return;  // timed out or cancelled
    try {
      self->receive_tensors(response.message, response.devices, *unfetched, *from);
    } catch (...) {
      self->calls.fail(id, std::current_exception());
      return;
    }
    self->complete_now(std::move(response.message));
  };
  try {
    owner.pool()->post(std::move(place));
  } catch (const std::exception& e) {  // the pool is shutting down
    spdlog::debug("rpc agent \"{}\": response dropped: {}", name, e.what());
  }
}

PipeAgent::Impl::Unfetched::~Unfetched() {
  if (tensors.empty() || connection == nullptr) return;
  if (std::shared_ptr<Impl> self = impl.lock()) {
    for (const auto& t : tensors) self->channels.release(*connection, t);
  }
}

void PipeAgent::Impl::receive_tensors(Message& m, const std::vector<Device>& devices,
                                      Unfetched& unfetched, int from) const {
  std::vector<wire::InboundFrame::ChannelTensor> routed;
  routed.swap(unfetched.tensors);  // each is received or released below
  std::exception_ptr failure;
  size_t next = 0;  // the routed tensors are in index order
  int count = -1;
  for (size_t i = 0; i < devices.size() && i < m.tensors.size(); ++i) {
    const bool by_channel = next < routed.size() && routed[next].index == i;
    if (!by_channel && (devices[i].is_cpu() || m.tensors[i].device() == devices[i]))
      continue;  // there already
    // Every routed tensor is released at the sender, also after a failure.
    try {
      if (failure) {
        if (by_channel) channels.release(*unfetched.connection, routed[next]);
      } else {
        if (count < 0) count = device_count;
        SB_REQUIRE(
            devices[i].index < count,
            "rpc agent \"{}\": tensor {} from \"{}\" is for {}, but this worker has {} "
            "CUDA device(s){}",
            name, i, peers.name_of(from), devices[i].str(), count,
            count == 0 ? " (a build without //core:cuda_allocator, or no GPU)" : "");
        // A self-send's tensors are all there already: a connection is here.
        SB_ASSERT(unfetched.connection != nullptr,
                  "tensor {} to receive without a connection", i);
        channel::Arrival arrival;
        arrival.index = i;
        arrival.device = devices[i];
        if (by_channel) {
          arrival.routed = routed[next];
        } else {
          arrival.bytes = std::move(m.tensors[i]);
        }
        m.tensors[i] = channels.receive(*unfetched.connection, std::move(arrival));
      }
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
    if (by_channel) ++next;
  }
  if (failure) std::rethrow_exception(failure);
}

std::vector<wire::TensorRoute> PipeAgent::Impl::route_tensors(
    Message& m, const std::vector<Device>& wire, int to,
    transport::Connection& connection) {
  std::vector<wire::TensorRoute> routes;
  const channel::ChannelDescriptor& peer = peers.info(to).announcement.channels;
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const Device src = m.tensors[i].device();
    const Device dst = wire.empty() ? Device::cpu() : wire[i];
    const size_t nbytes = m.tensors[i].is_contiguous() ? m.tensors[i].nbytes() : 0;
    channel::Channels::Sent sent;
    try {
      sent = channels.send(connection, peer, m.tensors[i], dst);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(
          fmt::format("rpc to \"{}\": tensor {} {}", peers.name_of(to), i, e.what()));
    }
    if (!src.is_cpu() || !dst.is_cpu()) log_choice(to, src, dst, nbytes, *sent.channel);
    if (sent.route.channel != wire::TensorChannel::kInline || sent.route.source) {
      routes.resize(m.tensors.size());
      routes[i] = std::move(sent.route);
    }
  }
  return routes;
}

void PipeAgent::Impl::log_choice(int to, Device src, Device dst, size_t nbytes,
                                 const channel::Channel& chosen) {
  const std::string key =
      fmt::format("{} {} {} {}", to, src.str(), dst.str(), chosen.name());
  {
    MutexLock lock(choices_mu);
    if (!logged_choices.insert(key).second) return;
  }
  const channel::Channels::Choice choice =
      channels.choose(peers.info(to).announcement.channels, src, dst, nbytes);
  const std::string why =
      choice.channel == &chosen
          ? choice.why
          : fmt::format("the {} channel declined it: no free buffer",
                        choice.channel ? choice.channel->name() : "?");
  spdlog::info("rpc agent \"{}\": tensors from {} to {} of \"{}\" go by {} ({})", name,
               src.str(), dst.str(), peers.name_of(to), chosen.name(), why);
}

std::vector<Device> PipeAgent::Impl::wire_devices(const Message& m, int to,
                                                  bool reply) const {
  std::vector<Device> wire;
  bool any_cuda = false;
  for (const Tensor& t : m.tensors) any_cuda = any_cuda || t.device().is_cuda();
  if (!any_cuda) return wire;
  // A dynamic group's reverse maps change as workers join: a copy.
  const rpc::DeviceMaps reverse = reply ? peers.reverse_maps() : rpc::DeviceMaps();
  const rpc::DeviceMaps& maps = reply ? reverse : options.device_maps;
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    wire.push_back(rpc::target_device(maps, peers.name_of(to), m.tensors[i].device(), i));
  }
  return wire;
}

}  // namespace switchboard::agents::pipe
