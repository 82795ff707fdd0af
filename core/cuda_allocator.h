// CUDA storage for Tensor, plus the few CUDA helpers the NCCL backend, its
// tests and users share.
//
// Linking //core:cuda_allocator (alwayslink) registers, from a static
// initializer, the copier Tensor::to uses and the allocator Tensor::empty
// uses for CUDA devices: blocks cudaMalloc'd on the tensor's device and
// kept for reuse when the last Tensor over the storage goes away (a cache
// of at most 2 GiB per device, core/device_block_cache.h: a block is
// reused once the work queued on the device's default stream before the
// free is done), the host pinner (cudaHostRegister) that PIPE's staging
// buffers use, and CUDA IPC for PIPE's cuda_ipc channel. Registration makes
// no CUDA call, so a
// binary that links this target still starts on a machine without a GPU;
// allocating there throws Error(kFailedPrecondition) with the reason.
//
// Ordering: the copy helpers below are synchronous. They run on the device's
// legacy default stream and return once the bytes have arrived, and the NCCL
// backend orders every op after the work already on that stream, so
// "copy in, run an op, wait for it, copy out" needs no further
// synchronization.
//
// Errors: CUDA failures throw switchboard::Error naming the call, the device
// and CUDA's error name and text: kResourceExhausted for out-of-memory,
// kFailedPrecondition otherwise (no device, bad ordinal, driver trouble).
// Caller bugs (wrong dtype, CPU tensor where a CUDA one belongs) throw
// std::invalid_argument.
//
// Thread safety: every function is thread-safe. The current CUDA device is
// per thread in the CUDA runtime; every helper restores it before returning.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <string_view>

#include "core/tensor.h"

namespace switchboard {

// CUDA devices visible to this process; 0 when there is no driver, no GPU,
// or CUDA fails to initialize. Never throws. The answer is computed once.
int cuda_device_count();

// Why cuda_device_count() is 0, e.g. "no CUDA device visible:
// cudaGetDeviceCount returned cudaErrorNoDevice (no CUDA-capable device is
// detected)"; empty when at least one device is visible. Never throws.
std::string cuda_unavailable_reason();

// Registers the CUDA allocator, copier (copy_tensor) and device counter
// (cuda_device_count) with set_device_allocator(), set_device_copier() and
// set_device_counter(), and CUDA IPC with set_device_ipc()
// (core/device_ipc.h; the PIPE agent's cuda_ipc channel uses it). The
// static initializer of this target already did; call it again after
// someone replaced them. Idempotent, makes no CUDA call.
void install_cuda_allocator();
// Registers CUDA IPC alone (set_device_ipc). Makes no CUDA call.
void install_cuda_ipc();

// Throws the Error described above unless `status` is cudaSuccess. `what`
// names the call and its target, e.g. "cudaMalloc of 1024 bytes on cuda:0".
// Clears CUDA's last-error state for non-sticky errors.
void cuda_check(cudaError_t status, std::string_view what);

// Makes `device` current for the calling thread and restores the previous
// current device on destruction. Throws (through cuda_check) when the device
// cannot be made current.
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int device);
  ~CudaDeviceGuard();
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool changed_ = false;
};

// Copies the bytes of `src` into `dst`: equal dtype and numel, both
// contiguous, each on the CPU or a CUDA device (CPU to CUDA, CUDA to CPU,
// CUDA to CUDA, CPU to CPU). Returns when the copy finished.
void copy_tensor(const Tensor& dst, const Tensor& src);

// A new contiguous tensor on cuda:`device` holding a copy of `src` (any
// device).
Tensor copy_to_cuda(const Tensor& src, int device);

// A new contiguous CPU tensor holding a copy of `src` (any device).
Tensor copy_to_cpu(const Tensor& src);

}  // namespace switchboard
