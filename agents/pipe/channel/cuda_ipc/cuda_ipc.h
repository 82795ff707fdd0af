// CudaIpcChannel: CUDA tensors between workers of one host, device to
// device, through outboxes: device memory of the sender's own, exported
// once per connection and mapped once by the receiver (the design of
// TensorPipe's cuda_ipc channel), so that no user allocation is ever
// exported, no handle is opened per call, and nothing outlives the
// connection.
//
//   sender                                   receiver
//   send(): take a free outbox on the
//   tensor's device (or make one and
//   queue its export first), copy the
//   tensor in after the work queued on
//   the device, record its event;
//   route the tensor to the outbox  ──frame──▶ check(): the outbox is known
//                                            and large enough, else the
//                                            connection closes;
//                                            fetch() (on the pool): map it
//                                            once, wait for the event, copy
//                                            into a new tensor on the
//                                            mapped device, then
//   on_frame(release): the outbox  ◀─release─ release it
//   is free again
//
// The channel's messages travel as kChannel frames on the connection the
// tensors' frames use, after the channel's tag (1; docs/wire_formats.md,
// "Channels"):
//   1 export   u64 outbox, u8 device type (1), u8 0, i16 device index,
//              u32 0, u64 capacity, 64 bytes memory handle, 64 bytes event
//              handle
//   2 release  u64 outbox
//   3 drop     u64 outbox (the sender frees it; the receiver unmaps it)
//
// Never blocks a sender: when every outbox of a device is in flight (at
// most max_outboxes per connection and device), send() declines and the
// tensor takes the staged path. Outboxes grow to fit the largest tensor
// sent (a power of two, at least 1 MiB, at most max_outbox_bytes; a larger
// tensor is staged).
//
// A connection that closes (the peer died, a partition) frees its
// outboxes and unmaps its inboxes; a fetch in progress keeps its inbox
// mapped until it returns. A peer that names an outbox it never exported,
// or asks for more bytes than it holds, is a protocol error.
//
// It carries a tensor (carries()) CUDA to CUDA, both workers on one host
// (same boot, network, IPC and PID namespaces), both able to share device
// memory, not one process (unless its runtime allows that), the tensor at
// least kCudaIpcMinBytes.
//
// Thread safety: every member function may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "agents/pipe/channel/channel.h"
#include "agents/pipe/transport/connection.h"
#include "agents/pipe/wire/frame.h"
#include "common/mutex.h"
#include "core/device_ipc.h"
#include "core/tensor.h"

namespace switchboard::agents::pipe::channel {

// Smaller CUDA tensors take the staged path. Each cuda_ipc transfer runs a
// copy on the device in each of the two processes, and on a GPU shared by
// two processes the second waits for the GPU to switch between them: an
// echo round trip took about 500 us at any size up to 4 MiB on an H100,
// where staged it took 240 us at 64 KiB, 400 us at 256 KiB and 820 us at
// 1 MiB (tools/bench:cuda_echo, both in one run).
inline constexpr size_t kCudaIpcMinBytes = 512 * 1024;

class CudaIpcChannel final : public Channel {
 public:
  struct Options {
    size_t max_outboxes = 4;  // per connection and device
    size_t max_outbox_bytes = size_t{1} << 30;
  };

  // `ipc` must not be null; `agent_name` names the worker in errors.
  CudaIpcChannel(std::string agent_name, std::shared_ptr<DeviceIpc> ipc, Options options);
  CudaIpcChannel(const CudaIpcChannel&) = delete;
  CudaIpcChannel& operator=(const CudaIpcChannel&) = delete;

  const char* name() const override { return "cuda_ipc"; }
  wire::TensorChannel tag() const override { return wire::TensorChannel::kCudaIpc; }
  bool carries(const Ends& ends) const override;
  std::string reason(const Ends& ends) const override;

  // Sender: puts `t` (contiguous, on a CUDA device) into an outbox for the
  // peer of `connection` and returns its route, or nothing when no outbox
  // is free or fits (the caller stages the tensor). Queues the outbox's
  // export on `connection` first when it is new. Throws what the runtime
  // throws (the call fails).
  std::optional<wire::TensorRoute> send(transport::Connection& connection, Tensor& t,
                                        Device dst) override SB_EXCLUDES(mu_);

  // Either side: a message from `connection`. Throws ProtocolError (the
  // connection should close) for a malformed one, an export of a known
  // outbox, a release of one not in flight.
  void on_message(const transport::Connection& connection,
                  std::span<const uint8_t> message) override SB_EXCLUDES(mu_);

  // Receiver, as a frame arrives: throws ProtocolError unless `tensor` of
  // `frame` names an outbox `connection` exported that holds its bytes, and
  // goes to a CUDA device.
  void check(const transport::Connection& connection, const wire::InboundFrame& frame,
             const wire::InboundFrame::ChannelTensor& tensor) const override
      SB_EXCLUDES(mu_);
  // Receiver, on the pool: a new tensor on `arrival.device` holding the
  // bytes of `arrival.routed` (checked), once they arrived; releases the
  // outbox to the sender whatever happens. Throws ConnectionError when the
  // connection closed meanwhile, or what the runtime throws.
  Tensor receive(transport::Connection& connection, Arrival arrival) override
      SB_EXCLUDES(mu_);

  // Receiver: gives the outbox of `tensor` back to the sender without
  // fetching it (the call it belongs to is gone).
  void release(transport::Connection& connection,
               const wire::InboundFrame::ChannelTensor& tensor) override;

  // The connection closed: frees its outboxes and unmaps its inboxes.
  void forget(const transport::Connection& connection) override SB_EXCLUDES(mu_);

  // For tests: outboxes alive, inboxes mapped (every connection).
  size_t outbox_count() const SB_EXCLUDES(mu_);
  size_t inbox_count() const SB_EXCLUDES(mu_);

 private:
  enum Op : uint8_t { kExport = 1, kRelease = 2, kDrop = 3 };

  struct Outbox {
    uint64_t id = 0;
    std::shared_ptr<DeviceIpc::Outbox> box;
    bool busy = false;
  };
  // A peer's exported outbox, mapped on first use.
  struct Inbox {
    Device device;  // the peer's
    size_t capacity = 0;
    IpcHandle memory{};
    IpcHandle event{};
    std::shared_ptr<DeviceIpc::Inbox> mapped;  // null until the first fetch
  };
  struct PerConnection {
    std::map<uint64_t, Outbox> outboxes;  // by id
    std::map<uint64_t, Inbox> inboxes;
  };

  static std::vector<uint8_t> encode(Op op, uint64_t id);

  const std::string agent_name_;
  const std::shared_ptr<DeviceIpc> ipc_;
  const Options options_;
  mutable Mutex mu_;
  uint64_t next_id_ SB_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, PerConnection> connections_ SB_GUARDED_BY(mu_);  // by serial
};

}  // namespace switchboard::agents::pipe::channel
