// Channel: how one tensor's bytes travel from a worker to a peer, in
// TensorPipe's manner. Each channel is a folder under agents/pipe/channel/
// (cpu/, cuda_staged/, cuda_ipc/) and one entry in the channel registry
// (registry.h), which chooses the channel for each tensor per peer and per
// (source device, target device) pair; the agent only asks the registry.
//
// One tensor's way:
//
//   sender                                       receiver
//   send(): readies the tensor and returns
//   its route (the frame's route record:
//   wire/frame.h); an inline channel's
//   bytes follow in the frame          ──frame──▶ inline: the frame reader
//                                                 receives the bytes into
//                                                 allocate()'s tensor, telling
//                                                 arrived() as they come;
//                                                 routed: check() as the frame
//                                                 arrives (a bad route closes
//                                                 the connection);
//                                                 receive(), on the pool: the
//                                                 tensor on its device; or
//                                                 release(): nobody wants it
//   on_message()  ◀── kChannel frames, the channel's own ──▶ on_message()
//
// A channel's own messages are kChannel frames whose payload starts with
// the channel's route tag (docs/wire_formats.md, "Channels"):
// send_message() adds it, and the registry gives on_message() what
// follows it.
//
// Thread safety: every member function may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "agents/pipe/channel/descriptor.h"
#include "agents/pipe/transport/connection.h"
#include "agents/pipe/wire/frame.h"
#include "core/tensor.h"

namespace switchboard::agents::pipe::channel {

// Where a tensor goes: from `src` on this worker (`mine`) to `dst` on the
// peer (`peer`), `nbytes` bytes (0 when the tensor is not contiguous).
struct Ends {
  const ChannelDescriptor& mine;
  const ChannelDescriptor& peer;
  Device src;
  Device dst;
  size_t nbytes = 0;
};

// One tensor of a received frame, for receive().
struct Arrival {
  size_t index = 0;  // in the message
  Device device;     // where the sender's descriptor puts it
  // Inline channels: the CPU tensor the frame reader filled (allocate()'s).
  Tensor bytes;
  // Routed channels: the tensor's route record, dtype and shape.
  wire::InboundFrame::ChannelTensor routed;
};

class Channel {
 public:
  virtual ~Channel() = default;

  // "cpu", "cuda_staged", "cuda_ipc": for logs and errors.
  virtual const char* name() const = 0;
  // The route tag of the tensors it sends: kInline when their bytes
  // follow in the frame.
  virtual wire::TensorChannel tag() const = 0;

  // Whether it can carry a tensor between `ends`. Cheap; on every send.
  virtual bool carries(const Ends& ends) const = 0;
  // Why it does or does not carry one between `ends`, for the log
  // ("CPU to CPU", "the peer runs on another host").
  virtual std::string reason(const Ends& ends) const = 0;

  // Sending, on the caller's thread: readies tensor `t` of a frame for the
  // peer of `connection` (`dst` at the peer) and returns its route. An
  // inline channel replaces `t` with what the frame carries (a contiguous
  // CPU tensor; its route may name a ChunkedSource that makes the bytes
  // ready as they are sent). nullopt: it declines this tensor now (every
  // buffer in flight), and the next channel that carries it takes it.
  // Throws std::invalid_argument when the tensor cannot travel by it, or
  // what the device runtime throws.
  virtual std::optional<wire::TensorRoute> send(transport::Connection& connection,
                                                Tensor& t, Device dst) = 0;

  // Receiving. Whether it receives tensors whose route says `tag` and
  // whose descriptor names `device` (the registry asks each channel in
  // turn). Default: every tensor of its own tag.
  virtual bool receives(wire::TensorChannel tag, Device device) const {
    (void)device;
    return tag == this->tag();
  }
  // Inline channels, on the reading thread: the tensor a descriptor's
  // bytes are read into (wire::FrameReader::Allocate's contract: defined,
  // contiguous, of exactly that dtype and shape, on the CPU). Default:
  // std::logic_error (a routed channel receives nothing inline).
  virtual Tensor allocate(DType dtype, const Tensor::Shape& shape, Device device);
  // Inline channels, on the reading thread: `filled` bytes of `tensor`
  // (allocate()'s) arrived. Never throws. Only called when
  // follows_arrivals() is true.
  virtual void arrived(const Tensor& tensor, size_t filled) noexcept {
    (void)tensor;
    (void)filled;
  }
  virtual bool follows_arrivals() const { return false; }
  // Routed channels, on the reading thread as the frame arrives: throws
  // ProtocolError (the connection closes) unless `tensor` of `frame` is a
  // route this connection's peer may name. Default: nothing to check.
  virtual void check(const transport::Connection& connection,
                     const wire::InboundFrame& frame,
                     const wire::InboundFrame::ChannelTensor& tensor) const {
    (void)connection;
    (void)frame;
    (void)tensor;
  }
  // On the pool: the received tensor on `arrival.device`. `connection`:
  // the one the frame came by. Throws ConnectionError when the connection
  // closed before a routed tensor's bytes arrived, std::invalid_argument
  // when this worker cannot hold it there, or what the runtime throws.
  virtual Tensor receive(transport::Connection& connection, Arrival arrival) = 0;
  // A routed tensor nobody will receive (its call is gone, or another
  // tensor of its frame failed): gives back what it holds at the sender.
  // Default: nothing held.
  virtual void release(transport::Connection& connection,
                       const wire::InboundFrame::ChannelTensor& tensor) {
    (void)connection;
    (void)tensor;
  }

  // A message of its own from the peer of `connection` (what follows the
  // tag). Throws ProtocolError for one it does not expect. Default: every
  // message is unexpected.
  virtual void on_message(const transport::Connection& connection,
                          std::span<const uint8_t> message);
  // The connection closed: frees what the channel held for it.
  virtual void forget(const transport::Connection& connection) { (void)connection; }

 protected:
  // Queues `message` as a kChannel frame with this channel's tag on
  // `connection`; a closed connection drops it (the peer's state goes
  // with the connection).
  void send_message(transport::Connection& connection,
                    std::span<const uint8_t> message) const;
};

}  // namespace switchboard::agents::pipe::channel
