// cuda_copy_latency: what one small copy between host and device costs, by
// how it is made, alone and when two processes take turns on one GPU (as
// two workers of an RPC round trip do). A diagnostic beside cuda_echo
// (tools/gpu_check trace): it says which way of copying a small tensor the
// agent should take.
//
//   cuda_copy_latency [BYTES]     (default 4096) prints, per way,
//     copy_<way>_solo_us=<median>    one process, back to back
//     copy_<way>_turns_us=<median>   two processes, each copying while the
//                                    other waits for its turn (a pipe)
//
// Ways: h2d/d2h from pageable or pinned memory by cudaMemcpy (with and
// without a legacy-stream synchronize after it), and by cudaMemcpyAsync on
// a non-blocking stream of its own synchronized alone; d2d plus
// synchronize. Without a GPU it prints "skipped: <reason>".
#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  std::fprintf(stderr, "cuda_copy_latency: %s: %s\n", what, cudaGetErrorString(status));
  std::exit(1);
}

struct Way {
  std::string name;
  std::function<void()> copy;
};

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

std::vector<double> time_it(const Way& way, int n, int turn_in, int turn_out) {
  std::vector<double> us;
  char token = 0;
  for (int i = 0; i < n; ++i) {
    if (turn_in >= 0 && read(turn_in, &token, 1) != 1) std::exit(1);
    const auto before = Clock::now();
    way.copy();
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - before).count());
    if (turn_out >= 0 && write(turn_out, &token, 1) != 1) std::exit(1);
  }
  return us;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t bytes = argc > 1 ? std::stoul(argv[1]) : 4096;
  int to_child[2], to_parent[2];
  if (pipe(to_child) != 0 || pipe(to_parent) != 0) return 1;
  const size_t big = std::max(bytes, size_t{1} << 20);
  // No CUDA call before the fork: a child of an initialized process
  // cannot use CUDA.
  const pid_t child = fork();
  const bool parent = child != 0;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    if (parent) std::printf("skipped: no CUDA device\n");
    if (parent) waitpid(child, nullptr, 0);
    return 0;
  }
  check(cudaSetDevice(0), "cudaSetDevice");
  void *dev = nullptr, *dev2 = nullptr, *pinned = nullptr;
  std::vector<char> pageable(bytes, 1);
  check(cudaMalloc(&dev, big), "cudaMalloc");
  check(cudaMalloc(&dev2, big), "cudaMalloc");
  check(cudaHostAlloc(&pinned, bytes, cudaHostAllocDefault), "cudaHostAlloc");
  // Pinned as the agent's host buffers are: malloc'd, then registered.
  void* registered = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  check(cudaHostRegister(registered, bytes, cudaHostRegisterDefault), "cudaHostRegister");
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  auto sync_legacy = [] { check(cudaStreamSynchronize(cudaStreamLegacy), "sync"); };
  auto sync_own = [&] { check(cudaStreamSynchronize(stream), "sync own"); };
  const std::vector<Way> ways = {
      {"h2d_pageable_memcpy_sync", [&] { check(cudaMemcpy(dev, pageable.data(), bytes, cudaMemcpyHostToDevice), "h2d"); sync_legacy(); }},
      {"h2d_pinned_memcpy", [&] { check(cudaMemcpy(dev, pinned, bytes, cudaMemcpyHostToDevice), "h2d"); }},
      {"h2d_registered_memcpy", [&] { check(cudaMemcpy(dev, registered, bytes, cudaMemcpyHostToDevice), "h2d"); }},
      {"h2d_pinned_async_own", [&] { check(cudaMemcpyAsync(dev, pinned, bytes, cudaMemcpyHostToDevice, stream), "h2d"); sync_own(); }},
      {"d2h_pageable_memcpy", [&] { check(cudaMemcpy(pageable.data(), dev, bytes, cudaMemcpyDeviceToHost), "d2h"); }},
      {"d2h_pinned_memcpy", [&] { check(cudaMemcpy(pinned, dev, bytes, cudaMemcpyDeviceToHost), "d2h"); }},
      {"d2d_async_own", [&] { check(cudaMemcpyAsync(dev2, dev, bytes, cudaMemcpyDeviceToDevice, stream), "d2d"); sync_own(); }},
      {"d2d_memcpy_sync", [&] { check(cudaMemcpy(dev2, dev, bytes, cudaMemcpyDeviceToDevice), "d2d"); sync_legacy(); }},
  };
  const int n = 400;
  for (const Way& way : ways) {
    // Solo: the parent alone, the child waits.
    char token = 0;
    if (parent) {
      time_it(way, 20, -1, -1);
      const double solo = median(time_it(way, n, -1, -1));
      // Turns: parent, child, parent, ... (the parent times its own).
      if (write(to_child[1], &token, 1) != 1) return 1;
      const double turns = median(time_it(way, n, to_parent[0], to_child[1]));
      std::printf("copy_%s_%zuB_solo_us=%.1f\ncopy_%s_%zuB_turns_us=%.1f\n", way.name.c_str(),
                  bytes, solo, way.name.c_str(), bytes, turns);
      std::fflush(stdout);
      if (read(to_parent[0], &token, 1) != 1) return 1;  // the child's last
    } else {
      if (read(to_child[0], &token, 1) != 1) return 1;
      time_it(way, 1, -1, to_parent[1]);  // its first turn, then n - 1
      time_it(way, n, to_child[0], to_parent[1]);
    }
  }
  if (parent) {
    int status = 0;
    waitpid(child, &status, 0);
  }
  return 0;
}
