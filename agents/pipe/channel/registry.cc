#include "agents/pipe/channel/registry.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <stdexcept>

#include "agents/pipe/channel/cpu/cpu.h"
#include "agents/pipe/channel/cuda_ipc/cuda_ipc.h"
#include "agents/pipe/channel/cuda_staged/cuda_staged.h"
#include "common/check.h"
#include "common/error.h"
#include "common/host_key.h"
#include "core/device_ipc.h"

namespace switchboard::agents::pipe::channel {

// ----------------------------------------------------------------- Channels

Channels::Channels(std::vector<std::shared_ptr<Channel>> channels,
                   ChannelDescriptor descriptor)
    : channels_(std::move(channels)), descriptor_(std::move(descriptor)) {}

Channel* Channels::find(std::string_view name) const {
  for (const auto& c : channels_) {
    if (name == c->name()) return c.get();
  }
  return nullptr;
}

Channels::Choice Channels::choose(const ChannelDescriptor& peer, Device src, Device dst,
                                  size_t nbytes) const {
  const Ends ends{descriptor_, peer, src, dst, nbytes};
  const Channel* faster = nullptr;  // the last one passed over
  for (const auto& c : channels_) {
    if (c->carries(ends)) return {c.get(), (faster ? faster : c.get())->reason(ends)};
    faster = c.get();
  }
  return {nullptr, "no channel carries it"};
}

Channels::Sent Channels::send(transport::Connection& connection,
                              const ChannelDescriptor& peer, Tensor& t,
                              Device dst) const {
  const Ends ends{descriptor_, peer, t.device(), dst, t.is_contiguous() ? t.nbytes() : 0};
  for (const auto& c : channels_) {
    if (!c->carries(ends)) continue;
    if (std::optional<wire::TensorRoute> route = c->send(connection, t, dst)) {
      return {std::move(*route), c.get()};
    }
  }
  throw std::invalid_argument(
      fmt::format("no channel of this worker carries {} to {}", t.describe(), dst.str()));
}

Channel* Channels::receiver(wire::TensorChannel tag, Device device) const {
  for (const auto& c : channels_) {
    if (c->receives(tag, device)) return c.get();
  }
  return nullptr;
}

wire::FrameReader::Allocate Channels::allocator() const {
  std::vector<std::shared_ptr<Channel>> receivers;
  for (const auto& c : channels_) {
    if (c->tag() == wire::TensorChannel::kInline) receivers.push_back(c);
  }
  return [receivers = std::move(receivers)](DType dtype, const Tensor::Shape& shape,
                                            Device device) {
    for (const auto& c : receivers) {
      if (c->receives(wire::TensorChannel::kInline, device))
        return c->allocate(dtype, shape, device);
    }
    throw ProtocolError(
        fmt::format("no channel of this worker receives a tensor for {}", device.str()));
  };
}

wire::FrameReader::Progress Channels::progress() const {
  std::vector<std::shared_ptr<Channel>> following;
  for (const auto& c : channels_) {
    if (c->tag() == wire::TensorChannel::kInline && c->follows_arrivals())
      following.push_back(c);
  }
  if (following.empty()) return nullptr;
  return [following = std::move(following)](const Tensor& tensor, size_t filled) {
    for (const auto& c : following) c->arrived(tensor, filled);
  };
}

void Channels::check(const transport::Connection& connection,
                     const wire::InboundFrame& frame) const {
  for (const wire::InboundFrame::ChannelTensor& t : frame.channel_tensors) {
    Channel* c = receiver(t.route.channel, frame.devices[t.index]);
    if (c == nullptr) {
      throw ProtocolError(fmt::format(
          "frame {} tensor {} comes by channel {}, which this worker does not offer",
          frame.message.id, t.index, static_cast<int>(t.route.channel)));
    }
    c->check(connection, frame, t);
  }
}

Tensor Channels::receive(transport::Connection& connection, Arrival arrival) const {
  const wire::TensorChannel tag = arrival.bytes.defined() ? wire::TensorChannel::kInline
                                                          : arrival.routed.route.channel;
  Channel* c = receiver(tag, arrival.device);
  // check() and the frame reader's allocator found one.
  SB_ASSERT(c != nullptr, "no channel receives tensor {} for {}", arrival.index,
            arrival.device.str());
  return c->receive(connection, std::move(arrival));
}

void Channels::release(transport::Connection& connection,
                       const wire::InboundFrame::ChannelTensor& tensor) const {
  for (const auto& c : channels_) {
    if (c->tag() == tensor.route.channel) {
      c->release(connection, tensor);
      return;
    }
  }
}

void Channels::on_message(const transport::Connection& connection,
                          std::span<const uint8_t> payload) const {
  if (payload.empty()) throw ProtocolError("an empty channel message");
  const auto tag = static_cast<wire::TensorChannel>(payload[0]);
  for (const auto& c : channels_) {
    if (tag != wire::TensorChannel::kInline && c->tag() == tag) {
      c->on_message(connection, payload.subspan(1));
      return;
    }
  }
  throw ProtocolError(fmt::format(
      "a message for channel {}, which this worker does not offer", payload[0]));
}

void Channels::forget(const transport::Connection& connection) const {
  for (const auto& c : channels_) c->forget(connection);
}

// ----------------------------------------------------------------- registry

void ChannelRegistry::add(ChannelEntry entry) {
  if (!entry.make) {
    throw std::invalid_argument(fmt::format("channel \"{}\": no make", entry.name));
  }
  for (const ChannelEntry& e : entries_) {
    if (e.name == entry.name) {
      throw std::invalid_argument(
          fmt::format("channel \"{}\" is registered already", entry.name));
    }
  }
  const auto at =
      std::find_if(entries_.begin(), entries_.end(),
                   [&](const ChannelEntry& e) { return e.priority < entry.priority; });
  entries_.insert(at, std::move(entry));
}

Channels ChannelRegistry::make(const ChannelContext& context) const {
  ChannelDescriptor mine;
  mine.host_key = host_key();
  mine.pid = ::getpid();
  std::vector<std::shared_ptr<Channel>> channels;
  for (const ChannelEntry& e : entries_) {
    if (std::unique_ptr<Channel> c = e.make(context, mine))
      channels.push_back(std::move(c));
  }
  return Channels(std::move(channels), std::move(mine));
}

const ChannelRegistry& builtin_channels() {
  static const ChannelRegistry* registry = [] {
    auto* r = new ChannelRegistry;
    r->add({"cuda_ipc", 300,
            [](const ChannelContext& context,
               ChannelDescriptor& mine) -> std::unique_ptr<Channel> {
              std::shared_ptr<DeviceIpc> ipc = device_ipc();
              if (context.off.contains("cuda_ipc") || ipc == nullptr ||
                  context.device_count == 0) {
                return nullptr;
              }
              mine.cuda_ipc = true;
              mine.cuda_ipc_own_process = ipc->opens_own_process();
              for (int d = 0; d < context.device_count; ++d)
                mine.device_uuids.push_back(ipc->device_uuid(d));
              return std::make_unique<CudaIpcChannel>(context.agent_name, std::move(ipc),
                                                      CudaIpcChannel::Options{});
            }});
    r->add({"cuda_staged", 200,
            [](const ChannelContext& context,
               ChannelDescriptor&) -> std::unique_ptr<Channel> {
              return std::make_unique<CudaStagedChannel>(context.buffers,
                                                         context.device_count);
            }});
    r->add({"cpu", 100,
            [](const ChannelContext& context,
               ChannelDescriptor&) -> std::unique_ptr<Channel> {
              return std::make_unique<CpuChannel>(context.buffers);
            }});
    return r;
  }();
  return *registry;
}

}  // namespace switchboard::agents::pipe::channel
