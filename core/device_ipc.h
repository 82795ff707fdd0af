// DeviceIpc: sharing device memory between processes of one host (CUDA IPC),
// as the PIPE agent's cuda_ipc channel uses it
// (agents/pipe/channel/cuda_ipc/cuda_ipc.h). An interface registered at run time,
// like the allocator and copier of core/tensor.h, so that nothing here
// depends on CUDA:
//   //core:cuda_allocator registers the real one (cudaIpcGetMemHandle,
//   interprocess events, cudaIpcOpenMemHandle);
//   tests register a stand-in whose "device memory" is host memory, so that
//   the channel's protocol runs on every machine.
//
// The exporting side makes an Outbox: device memory of its own, with an
// interprocess event, both exported once as opaque handles. fill() copies
// a tensor into it and records the event after the copy, without waiting
// for it. The importing side opens the handles (an Inbox, once per outbox),
// and drain() waits for the event on a stream of its own, copies into its
// tensor and returns once the bytes have arrived. The exporter may refill
// the outbox only after the importer said it drained it (the channel's
// release message).
//
// Errors: every call throws switchboard::Error naming the call, the device
// and the runtime's reason (kResourceExhausted for out-of-memory,
// kFailedPrecondition otherwise).
// Thread safety: implementations are thread-safe; one Outbox or Inbox is
// used by one thread at a time.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.h"

namespace switchboard {

// An exported memory or event handle (cudaIpcMemHandle_t and
// cudaIpcEventHandle_t are 64 bytes each).
using IpcHandle = std::array<uint8_t, 64>;

class DeviceIpc {
 public:
  struct Outbox {
    virtual ~Outbox() = default;
    Device device;
    size_t capacity = 0;
    IpcHandle memory{};
    IpcHandle event{};
  };
  struct Inbox {
    virtual ~Inbox() = default;  // unmaps the peer's memory
    size_t capacity = 0;
  };

  virtual ~DeviceIpc() = default;

  // Whether a process may open its own outboxes (CUDA refuses: workers of
  // one process then stage their tensors; a stand-in may allow it).
  virtual bool opens_own_process() const { return false; }

  // This process's handle on `device` for the peers' selection: the device's
  // UUID ("GPU-..."); empty when unknown.
  virtual std::string device_uuid(int device) = 0;

  // Exporting side: `capacity` bytes on `device` and an interprocess event.
  virtual std::unique_ptr<Outbox> make_outbox(Device device, size_t capacity) = 0;
  // Copies `src` (contiguous, on the outbox's device, at most its capacity)
  // to the start of the outbox after the work already queued on the
  // device, and records the event after the copy. Does not wait.
  virtual void fill(Outbox& outbox, const Tensor& src) = 0;

  // Importing side: maps a peer's outbox (its handles, `capacity` bytes)
  // for copies to `device`. Throws when the handles are not valid here.
  virtual std::unique_ptr<Inbox> open(const IpcHandle& memory, const IpcHandle& event,
                                      size_t capacity, Device device) = 0;
  // Waits for the peer's event, copies dst.nbytes() bytes from the start of
  // the inbox into `dst` (contiguous, on a CUDA device) and returns once
  // they arrived.
  virtual void drain(Inbox& inbox, const Tensor& dst) = 0;
};

// Registers the implementation (null: none). Thread-safe.
void set_device_ipc(std::shared_ptr<DeviceIpc> ipc);
// The registered implementation, or null.
std::shared_ptr<DeviceIpc> device_ipc();

}  // namespace switchboard
