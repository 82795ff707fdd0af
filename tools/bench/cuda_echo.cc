// cuda_echo: PIPE's CUDA tensor paths on one host, between two processes,
// on one GPU (device map cuda:0 -> cuda:0), beside the CPU path. The
// benchmark of issue-24's GPU targets; run with the GPU check
// (tools/gpu_check) and compared with PyTorch's TensorPipe in the same run
// (tools/bench/torch_cuda_echo.py).
//
//   cuda_echo [--quick]                  measures, prints name=value lines
//   cuda_echo --only MODE SIZE [CALLS]   one mode and size only (e.g. `staged
//                                        4KiB`): with tools/bench:
//                                        cuda_api_timer, where its time goes
//   cuda_echo --serve PORT MODE          the child ("w1", serving "echo")
//
// Three modes, each a fresh pair of workers: `ipc` (the defaults: tensors
// of 64 KiB and more take the cuda_ipc channel), `staged` (cuda_ipc off:
// through host memory and the connection) and `cpu` (CPU tensors). For
// each size (4 KiB to 256 MiB of int32) "w0" here calls "echo"
// (which returns its tensor) in a loop after a warm-up and prints
//   pipe_cuda_echo_<size>_p50_us   (ipc), pipe_cuda_staged_echo_*,
//   pipe_cpu_echo_*                 the round trip's median, and
//   ..._GBps                        bytes there and back per second of the
//                                   loop (2 x size x calls / seconds)
// Without a GPU the CUDA modes print "skipped: <reason>".
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "agents/builtin_backends.h"
#include "core/cuda_allocator.h"
#include "rpc/rpc.h"
#include "store/tcp_store.h"
#include "store/tcp_store_server.h"
#include "tools/bench/process.h"

using namespace switchboard;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

struct Size {
  const char* name;
  int64_t bytes;
  int calls;
};

const std::vector<Size> kSizes = {
    {"4KiB", 4 << 10, 2000},   {"64KiB", 64 << 10, 1000}, {"256KiB", 256 << 10, 500},
    {"1MiB", 1 << 20, 300},    {"4MiB", 4 << 20, 100},    {"64MiB", 64 << 20, 30},
    {"256MiB", 256 << 20, 10}};

std::shared_ptr<rpc::RpcBackendOptions> options_for(const std::string& mode, int rank) {
  rpc::Extras extras{{"listen_address", "127.0.0.1"}, {"num_worker_threads", "4"}};
  if (mode == "staged") extras["cuda_ipc"] = "0";
  auto options =
      rpc::construct_rpc_backend_options(rpc::backend_type("PIPE"), 120s, "env://", extras);
  if (mode != "cpu") {
    dynamic_cast<agents::PipeRpcBackendOptions&>(*options).set_device_map(
        rank == 0 ? "w1" : "w0", {{"cuda:0", "cuda:0"}});
  }
  return options;
}

int serve(uint16_t port, const std::string& mode) {
  auto store = std::make_shared<TcpStore>("127.0.0.1", port);
  rpc::RpcContext context;
  context.register_function("echo", [](Tensor t) { return t; });
  context.init_rpc("w1", "PIPE", 1, 2, options_for(mode, 1), store);
  context.shutdown(true);
  return 0;
}

// `only_size` (a kSizes name) measures that size alone, `calls` times when
// positive.
void measure(const std::string& argv0, const std::string& mode, const std::string& prefix,
             bool quick, const std::string& only_size = "", int only_calls = 0) {
  TcpStoreServer server;
  bench::ChildProcess child(
      {argv0, "--serve", std::to_string(server.port()), mode});
  auto store = std::make_shared<TcpStore>("127.0.0.1", server.port());
  rpc::RpcContext w0;
  w0.init_rpc("w0", "PIPE", 0, 2, options_for(mode, 0), store);
  const Device device = mode == "cpu" ? Device::cpu() : Device::cuda(0);
  for (const Size& size : kSizes) {
    if (!only_size.empty() && only_size != size.name) continue;
    int calls = quick ? std::max(3, size.calls / 10) : size.calls;
    if (only_calls > 0) calls = only_calls;
    const Tensor cpu = Tensor::zeros({size.bytes / 4}, DType::kInt32);
    const Tensor t = device.is_cpu() ? cpu : cpu.to(device);
    for (int i = 0; i < std::min(calls, 5); ++i) (void)w0.rpc_sync<Tensor>("w1", "echo", t);
    std::vector<double> us;
    const auto start = Clock::now();
    for (int i = 0; i < calls; ++i) {
      const auto before = Clock::now();
      const Tensor back = w0.rpc_sync<Tensor>("w1", "echo", t);
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - before).count());
      if (back.device() != device || back.nbytes() != t.nbytes()) {
        throw std::runtime_error(fmt::format("echo returned {} for {}", back.describe(),
                                             t.describe()));
      }
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
    fmt::print("{}_{}_p50_us={:.1f}\n", prefix, size.name, us[us.size() / 2]);
    fmt::print("{}_{}_GBps={:.2f}\n", prefix, size.name,
               2.0 * static_cast<double>(size.bytes) * calls / seconds / 1e9);
    std::fflush(stdout);
  }
  w0.shutdown(true);
  child.stop();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.size() == 3 && args[0] == "--serve") {
      return serve(static_cast<uint16_t>(std::stoi(args[1])), args[2]);
    }
    if (args.size() >= 3 && args[0] == "--only") {
      const std::string& mode = args[1];
      const std::string prefix = mode == "ipc"      ? "pipe_cuda_echo"
                                 : mode == "staged" ? "pipe_cuda_staged_echo"
                                                    : "pipe_cpu_echo";
      measure(argv[0], mode, prefix, false, args[2], args.size() > 3 ? std::stoi(args[3]) : 0);
      return 0;
    }
    const bool quick = std::find(args.begin(), args.end(), "--quick") != args.end();
    fmt::print("# cuda_echo: PIPE, two processes on one host, echo of int32 tensors\n");
    measure(argv[0], "cpu", "pipe_cpu_echo", quick);
    if (cuda_device_count() == 0) {
      fmt::print("skipped: {}\n", cuda_unavailable_reason());
      return 0;
    }
    measure(argv[0], "ipc", "pipe_cuda_echo", quick);
    measure(argv[0], "staged", "pipe_cuda_staged_echo", quick);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_echo: %s\n", e.what());
    return 1;
  }
}
