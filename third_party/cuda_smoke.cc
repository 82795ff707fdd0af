// Proves the CUDA runtime and NCCL wrappers compile and link. Run on a GPU
// machine it prints the device count and NCCL version; without a GPU it
// says so and exits 0.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>

int main() {
  int version = 0;
  ncclGetVersion(&version);
  int devices = 0;
  cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess) {
    std::printf("nccl=%d cuda: no usable GPU (%s)\n", version, cudaGetErrorString(status));
    return 0;
  }
  std::printf("nccl=%d cuda_devices=%d\n", version, devices);
  return 0;
}
