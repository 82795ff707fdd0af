// libcuda_api_timer.so: where a program's time in the CUDA runtime goes.
// Preloaded into a program linked with libcudart.so (LD_PRELOAD), it
// stands in front of the runtime calls that Switchboard makes on its
// tensor paths, forwards each to the real one and, at exit, prints to
// stderr one line per function called:
//
//   cuda_api_timer pid=<pid> <function> calls=<n> total_us=<t> mean_us=<t/n>
//
// A diagnostic for the GPU check (tools/gpu_check run --trace): the
// runtime's own time per call, beside a benchmark's round trips, says
// whether a fixed cost is in CUDA or in the agent. Thread-safe (atomic
// counters); adds about 0.1 us per call.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>

namespace {

struct Counter {
  const char* name;
  std::atomic<long long> calls{0};
  std::atomic<long long> nanos{0};
  Counter* next;
};

std::atomic<Counter*> counters{nullptr};

void add(Counter& c) {
  c.next = counters.load();
  while (!counters.compare_exchange_weak(c.next, &c)) {
  }
}

struct Report {
  ~Report() {
    for (Counter* c = counters.load(); c != nullptr; c = c->next) {
      const long long n = c->calls.load();
      if (n == 0) continue;
      const double us = static_cast<double>(c->nanos.load()) / 1000.0;
      std::fprintf(stderr, "cuda_api_timer pid=%d %s calls=%lld total_us=%.0f mean_us=%.2f\n",
                   static_cast<int>(getpid()), c->name, n, us, us / static_cast<double>(n));
    }
  }
} report;

template <typename F>
F real(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

struct Timed {
  explicit Timed(Counter& c) : c_(c), start_(std::chrono::steady_clock::now()) {}
  ~Timed() {
    c_.calls.fetch_add(1, std::memory_order_relaxed);
    c_.nanos.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::steady_clock::now() - start_)
                           .count(),
                       std::memory_order_relaxed);
  }
  Counter& c_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

// One forwarding definition per function: same signature as the runtime's.
#define SB_TIMED(ret, name, params, args)                        \
  extern "C" ret name params {                                   \
    static Counter counter{#name, {0}, {0}, nullptr};            \
    static const bool added = (add(counter), true);              \
    (void)added;                                                 \
    static auto const forward = real<ret(*) params>(#name);      \
    Timed timed(counter);                                        \
    return forward args;                                         \
  }

SB_TIMED(cudaError_t, cudaMemcpy, (void* d, const void* s, size_t n, cudaMemcpyKind k),
         (d, s, n, k))
SB_TIMED(cudaError_t, cudaMemcpyAsync,
         (void* d, const void* s, size_t n, cudaMemcpyKind k, cudaStream_t st),
         (d, s, n, k, st))
SB_TIMED(cudaError_t, cudaStreamSynchronize, (cudaStream_t s), (s))
SB_TIMED(cudaError_t, cudaDeviceSynchronize, (void), ())
SB_TIMED(cudaError_t, cudaEventSynchronize, (cudaEvent_t e), (e))
SB_TIMED(cudaError_t, cudaEventQuery, (cudaEvent_t e), (e))
SB_TIMED(cudaError_t, cudaEventCreateWithFlags, (cudaEvent_t * e, unsigned int f), (e, f))
SB_TIMED(cudaError_t, cudaEventRecord, (cudaEvent_t e, cudaStream_t s), (e, s))
SB_TIMED(cudaError_t, cudaEventDestroy, (cudaEvent_t e), (e))
SB_TIMED(cudaError_t, cudaStreamWaitEvent, (cudaStream_t s, cudaEvent_t e, unsigned int f),
         (s, e, f))
SB_TIMED(cudaError_t, cudaStreamCreateWithFlags, (cudaStream_t * s, unsigned int f), (s, f))
SB_TIMED(cudaError_t, cudaStreamDestroy, (cudaStream_t s), (s))
SB_TIMED(cudaError_t, cudaMalloc, (void** p, size_t n), (p, n))
SB_TIMED(cudaError_t, cudaFree, (void* p), (p))
SB_TIMED(cudaError_t, cudaSetDevice, (int d), (d))
SB_TIMED(cudaError_t, cudaGetDevice, (int* d), (d))
SB_TIMED(cudaError_t, cudaGetDeviceCount, (int* n), (n))
SB_TIMED(cudaError_t, cudaHostRegister, (void* p, size_t n, unsigned int f), (p, n, f))
SB_TIMED(cudaError_t, cudaHostUnregister, (void* p), (p))
SB_TIMED(cudaError_t, cudaPointerGetAttributes,
         (cudaPointerAttributes * a, const void* p), (a, p))
SB_TIMED(cudaError_t, cudaIpcGetMemHandle, (cudaIpcMemHandle_t * h, void* p), (h, p))
SB_TIMED(cudaError_t, cudaIpcOpenMemHandle,
         (void** p, cudaIpcMemHandle_t h, unsigned int f), (p, h, f))
SB_TIMED(cudaError_t, cudaIpcCloseMemHandle, (void* p), (p))
SB_TIMED(cudaError_t, cudaIpcGetEventHandle, (cudaIpcEventHandle_t * h, cudaEvent_t e),
         (h, e))
SB_TIMED(cudaError_t, cudaIpcOpenEventHandle, (cudaEvent_t * e, cudaIpcEventHandle_t h),
         (e, h))
SB_TIMED(cudaError_t, cudaGetLastError, (void), ())
