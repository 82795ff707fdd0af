// The channel registry: PIPE's tensor channels by name, each with a
// priority, in TensorPipe's manner. A worker makes its channels once
// (ChannelRegistry::make: those available to it); each tensor then goes by
// the channel of highest priority that carries it between its two devices
// to that peer (Channel::carries, from both workers' ChannelDescriptors,
// exchanged in their announcements) and does not decline it.
//
// The built-ins (builtin_channels()), fastest first:
//   cuda_ipc     300  CUDA to CUDA on one host, device to device through
//                     outboxes (cuda_ipc/cuda_ipc.h); available with a
//                     DeviceIpc registered (core/device_ipc.h), CUDA devices,
//                     and the channel not turned off;
//   cuda_staged  200  any CUDA end, through host memory, the bytes in the
//                     frame (cuda_staged/cuda_staged.h);
//   cpu          100  CPU to CPU, the bytes in the frame (cpu/cpu.h).
// Adding a channel is a folder under agents/pipe/channel/ and one entry in
// builtin_channels() (registry.cc), with a route tag of its own
// (wire::TensorChannel) when its bytes do not follow in the frame; the
// conformance suite (tests/agents/pipe/channel/conformance_test.cc) runs
// over every entry.
//
// Errors: add() throws std::invalid_argument for a duplicate name or an
// entry without make. Channels' receiving side throws ProtocolError for
// what a peer must not send (a tensor no channel receives, a message for a
// channel this worker lacks), which closes that connection.
// Thread safety: a registry is built once, then only read (any thread);
// Channels' member functions may be called from any thread.
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "agents/pipe/channel/channel.h"
#include "agents/pipe/channel/descriptor.h"
#include "agents/pipe/transport/connection.h"
#include "agents/pipe/wire/frame.h"
#include "core/host_buffer_cache.h"
#include "core/tensor.h"

namespace switchboard::agents::pipe::channel {

// What a worker's channels are made from.
struct ChannelContext {
  std::string agent_name;  // names the worker in errors
  int device_count = 0;    // its CUDA devices
  // Received tensors' host memory; must not be null.
  std::shared_ptr<HostBufferCache> buffers;
  // Channels the worker's options turned off, by name.
  std::set<std::string, std::less<>> off;
};

struct ChannelEntry {
  std::string name;
  int priority = 0;  // tried highest first
  // The channel for a worker, filling in what it can do in `mine`; null
  // when it cannot serve this worker (no runtime for it, turned off).
  std::function<std::unique_ptr<Channel>(const ChannelContext& context,
                                         ChannelDescriptor& mine)>
      make;
};

// A worker's channels, the highest priority first.
class Channels {
 public:
  Channels(std::vector<std::shared_ptr<Channel>> channels, ChannelDescriptor descriptor);
  Channels(Channels&&) = default;

  // What they can do, for the worker's announcement.
  const ChannelDescriptor& descriptor() const { return descriptor_; }
  const std::vector<std::shared_ptr<Channel>>& all() const { return channels_; }
  // The channel named `name`; null when this worker has none of that name.
  Channel* find(std::string_view name) const;

  // The channel a tensor between `src` here and `dst` at a peer described
  // by `peer` takes unless it declines (null when none carries it), and
  // why it and not a faster one, for the log.
  struct Choice {
    Channel* channel = nullptr;
    std::string why;
  };
  Choice choose(const ChannelDescriptor& peer, Device src, Device dst,
                size_t nbytes) const;

  // Sends tensor `t` of a frame to the peer of `connection` (described by
  // `peer`; `dst` there) by the first channel that carries it and does not
  // decline it: its route, and the channel. Throws std::invalid_argument
  // when none carries it, or what the channel's send() throws.
  struct Sent {
    wire::TensorRoute route;
    Channel* channel = nullptr;
  };
  Sent send(transport::Connection& connection, const ChannelDescriptor& peer, Tensor& t,
            Device dst) const;

  // The frame reader's hooks for a connection of this worker: inline
  // tensors' bytes land in the tensor of the channel that receives them,
  // which is told of their arrival; progress() is null when no channel
  // follows arrivals. Each holds the channels it uses (a connection may
  // outlive this object).
  wire::FrameReader::Allocate allocator() const;
  wire::FrameReader::Progress progress() const;

  // As a frame arrives: throws ProtocolError unless every routed tensor of
  // it has a channel here that receives it, and that channel's check passes.
  void check(const transport::Connection& connection,
             const wire::InboundFrame& frame) const;
  // On the pool: tensor `arrival.index` of a frame on `arrival.device`,
  // from the channel that receives it (inline: `arrival.bytes`).
  Tensor receive(transport::Connection& connection, Arrival arrival) const;
  // Gives back a routed tensor nobody will receive.
  void release(transport::Connection& connection,
               const wire::InboundFrame::ChannelTensor& tensor) const;
  // A kChannel frame's payload: the tag, then the channel's message.
  // Throws ProtocolError for an empty one, or a tag no routed channel of
  // this worker has, or what the channel's on_message() throws.
  void on_message(const transport::Connection& connection,
                  std::span<const uint8_t> payload) const;
  // The connection closed: every channel frees what it held for it.
  void forget(const transport::Connection& connection) const;

 private:
  // The channel that receives a tensor routed by `tag` to `device`.
  Channel* receiver(wire::TensorChannel tag, Device device) const;

  std::vector<std::shared_ptr<Channel>> channels_;
  ChannelDescriptor descriptor_;
};

class ChannelRegistry {
 public:
  void add(ChannelEntry entry);
  // Every entry, the highest priority first.
  const std::vector<ChannelEntry>& entries() const { return entries_; }
  // The channels available to a worker, and its descriptor (its host key
  // and process id, then what each channel fills in).
  Channels make(const ChannelContext& context) const;

 private:
  std::vector<ChannelEntry> entries_;
};

// cuda_ipc, cuda_staged and cpu.
const ChannelRegistry& builtin_channels();

}  // namespace switchboard::agents::pipe::channel
