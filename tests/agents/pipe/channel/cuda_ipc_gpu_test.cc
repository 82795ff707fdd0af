// The cuda_ipc channel between two processes on real GPUs (links
// //core:cuda_allocator, whose DeviceIpc is CUDA's IPC). The peer is
// a child process (tests/util/subprocess.h): CUDA refuses to open a
// process's own handles, so workers of one process stage their tensors.
// Each case prints "skipped: <reason>" and returns where no GPU is visible.
//
// Cases: tensors of 1 MiB and 64 MiB go to the child's device and back,
// intact (by cuda_ipc: the log names the channel each pair took); a
// child killed while it holds a mapping fails the pending call, and this
// worker goes on.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "core/cuda_allocator.h"
#include "rpc/rpc.h"
#include "store/tcp_store.h"
#include "store/tcp_store_server.h"
#include "tests/agents/pipe/test_util.h"
#include "tests/util/subprocess.h"
#include "tests/util/threads.h"

using namespace switchboard;
using namespace switchboard::pipe_test;
using namespace std::chrono_literals;
using rpc::RpcContext;
using rpc::with_timeout;
using switchboard::testing::Gate;

namespace {

bool skip_without_gpu() {
  if (cuda_device_count() > 0) return false;
  const std::string reason = cuda_unavailable_reason();
  WARN("skipped: " << reason);
  std::printf("skipped: %s\n", reason.c_str());
  return true;
}

Tensor pattern_on(int64_t n, float first) {
  std::vector<float> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    values[static_cast<size_t>(i)] = first + static_cast<float>(i % 65536);
  return Tensor::from_vector(values, {n}).to(Device::cuda(0));
}

// The child: "w1" on cuda:0, serving "scale" (t * k on t's device), "hold"
// (says "holding", then waits on a gate nobody opens) and "stop" (after
// which it shuts down gracefully, joining "w0"'s graceful shutdown).
std::shared_ptr<rpc::RpcBackendOptions> options_for(int rank) {
  auto options = pipe_options({{"heartbeat_timeout_ms", "0"}});
  typed(options).set_device_map(rank == 0 ? "w1" : "w0", {{"cuda:0", "cuda:0"}});
  return options;
}

// "w0" in this process and the child "w1", ready.
struct ChildPair {
  ChildPair() {
    store = std::make_shared<TcpStore>("127.0.0.1", server.port(), client_options());
    w0.init_rpc("w0", "PIPE", 0, 2, options_for(0), store);
    expect_line(child, "ready");
  }
  TcpStoreServer server;
  Subprocess child =
      sbtest::spawn_child("cuda_ipc_worker", {std::to_string(server.port())});
  std::shared_ptr<TcpStore> store;
  RpcContext w0;
};

}  // namespace

// args: store port.
SB_CHILD_MAIN(cuda_ipc_worker) {
  auto store = std::make_shared<TcpStore>(
      "127.0.0.1", static_cast<uint16_t>(std::stoi(args.at(0))), client_options());
  auto never = std::make_shared<Gate>(kGuard);
  auto stop = std::make_shared<Gate>(kGuard);
  RpcContext context;
  context.register_function("scale", [](Tensor t, double k) {
    std::vector<float> v = t.to(Device::cpu()).to_vector<float>();
    for (float& x : v) x = static_cast<float>(x * k);
    return Tensor::from_vector(v, t.shape()).to(t.device());
  });
  context.register_function("hold", [never](Tensor t) {
    say("holding");
    never->pass();
    return t.numel();
  });
  context.register_function("stop", [stop] {
    stop->open();
    return 0;
  });
  context.init_rpc("w1", "PIPE", 1, 2, options_for(1), store);
  say("ready");
  if (!stop->pass()) return 1;
  context.shutdown(true, kGuard);
  return 0;
}

TEST_CASE(
    "CUDA tensors to a worker process of this host go by cuda_ipc and come back intact",
    "[pipe][cuda][cuda_ipc][gpu][multiprocess]") {
  if (skip_without_gpu()) return;
  ChildPair pair;
  RpcContext& w0 = pair.w0;
  Subprocess& child = pair.child;
  for (int64_t n : {int64_t{256} << 10, int64_t{16} << 20}) {  // 1 MiB, 64 MiB
    const Tensor t = pattern_on(n, 1);
    const Tensor back = w0.rpc_sync<Tensor>("w1", "scale", with_timeout(kGuard), t, 2.0);
    CHECK(back.device() == Device::cuda(0));
    const std::vector<float> got = back.to(Device::cpu()).to_vector<float>();
    REQUIRE(got.size() == static_cast<size_t>(n));
    bool same = true;
    for (int64_t i = 0; i < n && same; i += 4099) {
      same = got[static_cast<size_t>(i)] == 2.0f * (1.0f + static_cast<float>(i % 65536));
    }
    CHECK(same);
  }
  // Both shut down gracefully: the group's join, then every outbox freed
  // and unmapped as the connection closes.
  CHECK(w0.rpc_sync<int>("w1", "stop", with_timeout(kGuard)) == 0);
  w0.shutdown(true, kGuard);
  CHECK(child.wait() == 0);
}

TEST_CASE(
    "a peer process killed while it holds a mapping fails the pending call, and this "
    "worker goes on",
    "[pipe][cuda][cuda_ipc][gpu][failure][multiprocess]") {
  if (skip_without_gpu()) return;
  ChildPair pair;
  RpcContext& w0 = pair.w0;
  Subprocess& child = pair.child;
  rpc::Future<int64_t> call =
      w0.rpc_async<int64_t>("w1", "hold", with_timeout(60s), pattern_on(1 << 20, 0));
  expect_line(child, "holding");
  child.kill(SIGKILL);
  const Outcome outcome = outcome_of(call);
  INFO(outcome.kind << ": " << outcome.message);
  CHECK(outcome.kind == "ConnectionError");
  CHECK(child.wait() == 128 + SIGKILL);
  // This process's CUDA state is intact.
  const Tensor t = pattern_on(1 << 20, 3);
  CHECK(t.to(Device::cpu()).to_vector<float>()[5] == 8.0f);
  w0.shutdown(false);
}
