#include "core/cuda_allocator.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>

#include "common/check.h"
#include "common/error.h"
#include "core/device_block_cache.h"

namespace switchboard {
namespace {

struct Availability {
  int count = 0;
  std::string why_not;  // empty when count > 0
};

Availability probe_devices() {
  Availability out;
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // not sticky; leave no trace for later calls
    out.why_not =
        fmt::format("no CUDA device visible: cudaGetDeviceCount returned {} ({})",
                    cudaGetErrorName(status), cudaGetErrorString(status));
  } else if (count <= 0) {
    out.why_not = "no CUDA device visible: cudaGetDeviceCount found 0 devices";
  } else {
    out.count = count;
  }
  return out;
}

const Availability& availability() {
  // Computed on first use, never at static-initialization time.
  static const Availability probed = [] {
    try {
      return probe_devices();
    } catch (const std::exception& e) {
      return Availability{0, fmt::format("no CUDA device visible: {}", e.what())};
    }
  }();
  return probed;
}

void require_device(Device device, std::string_view what) {
  SB_REQUIRE(device.is_cuda(), "{}: {} is not a CUDA device", what, device.str());
  const int count = cuda_device_count();
  if (count == 0) {
    throw Error(
        ErrorCode::kFailedPrecondition,
        fmt::format("{} on {}: {}", what, device.str(), cuda_unavailable_reason()));
  }
  SB_REQUIRE(device.index >= 0 && device.index < count,
             "{}: {} does not exist ({} CUDA devices visible)", what, device.str(),
             count);
}

// Runs `f` with `device` current, restoring the previous one; never throws
// (for the cache's free and wait, which must not).
template <typename F>
void on_device_quietly(int device, F&& f) {
  int previous = -1;
  const bool have_previous = cudaGetDevice(&previous) == cudaSuccess;
  if (cudaSetDevice(device) == cudaSuccess) f();
  if (have_previous) cudaSetDevice(previous);
  cudaGetLastError();
}

// The device memory of every tensor: cudaMalloc'd blocks, kept for reuse
// after their tensors went (core/device_block_cache.h). Never destroyed:
// CUDA may be gone when static destructors run, and the memory goes with
// the process.
DeviceBlockCache& block_cache() {
  static DeviceBlockCache* cache =
      [] {
        DeviceBlockCache::Runtime runtime;
        runtime.allocate = [](int device, size_t bytes) {
          CudaDeviceGuard guard(device);
          void* data = nullptr;
          cuda_check(cudaMalloc(&data, bytes),
                     fmt::format("cudaMalloc of {} bytes on cuda:{}", bytes, device));
          return data;
        };
        runtime.free = [](int device, void* data) {
          on_device_quietly(device, [&] { cudaFree(data); });
        };
        runtime.mark = [](int device) -> void* {
          cudaEvent_t event = nullptr;
          on_device_quietly(device, [&] {
            if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess)
              return;
            if (cudaEventRecord(event, nullptr) != cudaSuccess) {
              cudaEventDestroy(event);
              event = nullptr;
            }
          });
          return event;
        };
        runtime.wait_and_forget = [](int device, void* mark) {
          auto event = static_cast<cudaEvent_t>(mark);
          on_device_quietly(device, [&] {
            cudaEventSynchronize(event);
            cudaEventDestroy(event);
          });
        };
        return new std::shared_ptr<DeviceBlockCache>(
            DeviceBlockCache::create(std::move(runtime)));
      }()
          ->get();
  return *cache;
}

std::shared_ptr<void> cuda_allocate(size_t nbytes, Device device) {
  require_device(device, "CUDA allocation");
  // Never zero bytes, so that even an empty tensor has a real address.
  return block_cache().allocate(device.index, std::max<size_t>(nbytes, 1));
}

const bool kRegistered = [] {
  install_cuda_allocator();
  return true;
}();

int cuda_device_of(const Tensor& t) {
  return t.device().is_cuda() ? t.device().index : -1;
}

}  // namespace

int cuda_device_count() { return availability().count; }

std::string cuda_unavailable_reason() { return availability().why_not; }

void install_cuda_allocator() {
  set_device_allocator(cuda_allocate);
  set_device_copier(copy_tensor);
  set_device_counter(cuda_device_count);
  set_host_pinner({[](void* data, size_t nbytes) {
                     const bool pinned =
                         cudaHostRegister(data, nbytes, cudaHostRegisterDefault) ==
                         cudaSuccess;
                     if (!pinned) cudaGetLastError();
                     return pinned;
                   },
                   [](void* data) {
                     cudaHostUnregister(data);
                     cudaGetLastError();
                   }});
  install_cuda_ipc();
}

void cuda_check(cudaError_t status, std::string_view what) {
  if (status == cudaSuccess) return;
  cudaGetLastError();
  const std::string message = fmt::format(
      "{} failed: {} ({})", what, cudaGetErrorName(status), cudaGetErrorString(status));
  const ErrorCode code = status == cudaErrorMemoryAllocation
                             ? ErrorCode::kResourceExhausted
                             : ErrorCode::kFailedPrecondition;
  throw Error(code, message);
}

CudaDeviceGuard::CudaDeviceGuard(int device) {
  cuda_check(cudaGetDevice(&previous_), "cudaGetDevice");
  if (previous_ == device) return;
  cuda_check(cudaSetDevice(device), fmt::format("cudaSetDevice(cuda:{})", device));
  changed_ = true;
}

CudaDeviceGuard::~CudaDeviceGuard() {
  if (changed_) cudaSetDevice(previous_);
}

void copy_tensor(const Tensor& dst, const Tensor& src) {
  SB_REQUIRE(dst.defined() && src.defined(),
             "copy_tensor: {} <- {}: both must be defined", dst.describe(),
             src.describe());
  SB_REQUIRE(dst.dtype() == src.dtype() && dst.numel() == src.numel(),
             "copy_tensor: {} <- {}: dtype and element count must match", dst.describe(),
             src.describe());
  SB_REQUIRE(dst.is_contiguous() && src.is_contiguous(),
             "copy_tensor: {} <- {}: both must be contiguous", dst.describe(),
             src.describe());
  const size_t nbytes = src.nbytes();
  if (nbytes == 0) return;
  const int device = std::max(cuda_device_of(dst), cuda_device_of(src));
  if (device < 0) {
    std::memcpy(dst.data(), src.data(), nbytes);
    return;
  }
  const std::string what =
      fmt::format("copy_tensor {} <- {}", dst.describe(), src.describe());
  if (dst.device().is_cuda()) require_device(dst.device(), what);
  if (src.device().is_cuda()) require_device(src.device(), what);
  CudaDeviceGuard guard(device);
  // cudaMemcpy may return before a pageable-to-device copy has landed;
  // synchronizing the legacy stream makes the helper fully synchronous.
  cuda_check(cudaMemcpy(dst.data(), src.data(), nbytes, cudaMemcpyDefault), what);
  cuda_check(cudaStreamSynchronize(cudaStreamLegacy), what);
}

Tensor copy_to_cuda(const Tensor& src, int device) {
  SB_REQUIRE(src.defined(), "copy_to_cuda: the source tensor is undefined");
  Tensor out = Tensor::empty(src.shape(), src.dtype(), Device::cuda(device));
  copy_tensor(out, src);
  return out;
}

Tensor copy_to_cpu(const Tensor& src) {
  SB_REQUIRE(src.defined(), "copy_to_cpu: the source tensor is undefined");
  Tensor out = Tensor::empty(src.shape(), src.dtype(), Device::cpu());
  copy_tensor(out, src);
  return out;
}

}  // namespace switchboard
