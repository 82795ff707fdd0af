// The real DeviceIpc (core/device_ipc.h) over the CUDA runtime's IPC:
// outboxes are cudaMalloc'd memory with an interprocess event, exported
// with cudaIpcGetMemHandle and cudaIpcGetEventHandle; the importing side
// opens them once (cudaIpcOpenMemHandle, cudaIpcOpenEventHandle) and
// copies on a non-blocking stream of its own after waiting for the event.
// Registered by install_cuda_allocator() (core/cuda_allocator.h).
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <cstring>
#include <memory>
#include <string>

#include "core/cuda_allocator.h"
#include "core/device_ipc.h"

namespace switchboard {

namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(IpcHandle));
static_assert(sizeof(cudaIpcEventHandle_t) == sizeof(IpcHandle));

class CudaOutbox final : public DeviceIpc::Outbox {
 public:
  ~CudaOutbox() override {
    if (event_ == nullptr && data_ == nullptr) return;
    // Nothing here may throw: the device may be gone (the error is the
    // driver's to report on the next call that can).
    int previous = -1;
    cudaGetDevice(&previous);
    cudaSetDevice(device.index);
    if (event_ != nullptr) cudaEventDestroy(event_);
    if (data_ != nullptr) cudaFree(data_);
    if (previous >= 0) cudaSetDevice(previous);
  }
  void* data_ = nullptr;
  cudaEvent_t event_ = nullptr;
};

class CudaInbox final : public DeviceIpc::Inbox {
 public:
  ~CudaInbox() override {
    int previous = -1;
    cudaGetDevice(&previous);
    cudaSetDevice(device_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (event_ != nullptr) cudaEventDestroy(event_);
    if (data_ != nullptr) cudaIpcCloseMemHandle(data_);
    if (previous >= 0) cudaSetDevice(previous);
  }
  int device_ = 0;
  void* data_ = nullptr;
  cudaEvent_t event_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

class CudaDeviceIpc final : public DeviceIpc {
 public:
  std::string device_uuid(int device) override {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
      cudaGetLastError();
      return "";
    }
    const auto* u = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
    return fmt::format(
        "GPU-{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}"
        "{:02x}{:02x}"
        "{:02x}{:02x}",
        u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12],
        u[13], u[14], u[15]);
  }

  std::unique_ptr<Outbox> make_outbox(Device device, size_t capacity) override {
    CudaDeviceGuard guard(device.index);
    auto box = std::make_unique<CudaOutbox>();
    box->device = device;
    box->capacity = capacity;
    cuda_check(
        cudaMalloc(&box->data_, capacity),
        fmt::format("cudaMalloc of a {} byte outbox on {}", capacity, device.str()));
    cuda_check(
        cudaEventCreateWithFlags(&box->event_,
                                 cudaEventInterprocess | cudaEventDisableTiming),
        fmt::format("cudaEventCreateWithFlags (interprocess) on {}", device.str()));
    cudaIpcMemHandle_t memory;
    cuda_check(cudaIpcGetMemHandle(&memory, box->data_),
               fmt::format("cudaIpcGetMemHandle of an outbox on {}", device.str()));
    cudaIpcEventHandle_t event;
    cuda_check(cudaIpcGetEventHandle(&event, box->event_),
               fmt::format("cudaIpcGetEventHandle on {}", device.str()));
    std::memcpy(box->memory.data(), &memory, sizeof memory);
    std::memcpy(box->event.data(), &event, sizeof event);
    return box;
  }

  void fill(Outbox& outbox, const Tensor& src) override {
    auto& box = static_cast<CudaOutbox&>(outbox);
    CudaDeviceGuard guard(box.device.index);
    // On the legacy default stream: after the work already queued there.
    cuda_check(cudaMemcpyAsync(box.data_, src.data(), src.nbytes(),
                               cudaMemcpyDeviceToDevice, nullptr),
               fmt::format("cudaMemcpyAsync of {} bytes into an outbox on {}",
                           src.nbytes(), box.device.str()));
    cuda_check(
        cudaEventRecord(box.event_, nullptr),
        fmt::format("cudaEventRecord after filling an outbox on {}", box.device.str()));
  }

  std::unique_ptr<Inbox> open(const IpcHandle& memory, const IpcHandle& event,
                              size_t capacity, Device device) override {
    CudaDeviceGuard guard(device.index);
    auto inbox = std::make_unique<CudaInbox>();
    inbox->capacity = capacity;
    inbox->device_ = device.index;
    cudaIpcMemHandle_t m;
    cudaIpcEventHandle_t e;
    std::memcpy(&m, memory.data(), sizeof m);
    std::memcpy(&e, event.data(), sizeof e);
    cuda_check(
        cudaIpcOpenMemHandle(&inbox->data_, m, cudaIpcMemLazyEnablePeerAccess),
        fmt::format("cudaIpcOpenMemHandle of a peer's outbox on {}", device.str()));
    cuda_check(
        cudaIpcOpenEventHandle(&inbox->event_, e),
        fmt::format("cudaIpcOpenEventHandle of a peer's outbox on {}", device.str()));
    cuda_check(cudaStreamCreateWithFlags(&inbox->stream_, cudaStreamNonBlocking),
               fmt::format("cudaStreamCreateWithFlags on {}", device.str()));
    return inbox;
  }

  void drain(Inbox& inbox, const Tensor& dst) override {
    auto& in = static_cast<CudaInbox&>(inbox);
    CudaDeviceGuard guard(in.device_);
    const std::string where = fmt::format("{} bytes from a peer's outbox to {}",
                                          dst.nbytes(), dst.device().str());
    cuda_check(cudaStreamWaitEvent(in.stream_, in.event_, 0),
               "cudaStreamWaitEvent for " + where);
    cuda_check(cudaMemcpyAsync(dst.data(), in.data_, dst.nbytes(), cudaMemcpyDefault,
                               in.stream_),
               "cudaMemcpyAsync of " + where);
    cuda_check(cudaStreamSynchronize(in.stream_), "cudaStreamSynchronize after " + where);
  }
};

}  // namespace

void install_cuda_ipc() { set_device_ipc(std::make_shared<CudaDeviceIpc>()); }

}  // namespace switchboard
