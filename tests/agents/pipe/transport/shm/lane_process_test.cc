// PIPE's same-host lane between processes: once both directions of a
// connection move through shared memory, a peer killed with SIGKILL still
// fails a pending call within 1 s (its socket closes; the ring is drained
// first), and a peer stopped with SIGSTOP still fails it after the
// heartbeat timeout (heartbeats travel through the ring too). The peer is a
// child process (tests/util/subprocess.h); the group meets over a TcpStore.
#include <signal.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "common/error.h"
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

// Lane segments mapped in this process.
int lane_mappings() {
  int n = 0;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/memfd:switchboard-ring") != std::string::npos) ++n;
  }
  return n;
}

// Calls w1 until both directions of the connection are in shared memory:
// this side's ring and w1's (which this side mapped when it accepted it),
// and then a few more calls, the first of which carries w1's switch. False
// when the lane did not come: this host does not let one process open
// another's memory file (/proc/<pid>/fd; the lane then stays off, which
// pipe_lane_test's in-process cases would not show).
bool reach_lane(RpcContext& w0) {
  const bool reached = testing::eventually(
      [&] {
        (void)w0.rpc_sync<int64_t>("w1", "add", with_timeout(kGuard), int64_t{1}, int64_t{1});
        return lane_mappings() == 2;
      },
      std::chrono::seconds(10));
  for (int i = 0; i < 10; ++i) {
    REQUIRE(w0.rpc_sync<int64_t>("w1", "add", with_timeout(kGuard), int64_t{i}, int64_t{1}) ==
            i + 1);
  }
  if (!reached) {
    std::printf("skipped: no same-host lane between two processes here (this host refuses "
                "opening another process's memory file; see the log)\n");
  }
  return reached;
}

}  // namespace

// args: store port, heartbeat_interval_ms, heartbeat_timeout_ms. Joins a
// group of two as "w1", says "ready", serves "add" and "block" (which says
// "running" and waits on a gate nobody opens) until killed.
SB_CHILD_MAIN(lane_worker) {
  auto store = std::make_shared<TcpStore>("127.0.0.1", static_cast<uint16_t>(std::stoi(args.at(0))),
                                          client_options());
  auto never = std::make_shared<Gate>(kGuard);
  RpcContext context;
  context.register_function("add", [](int64_t a, int64_t b) { return a + b; });
  context.register_function("block", [never] {
    say("running");
    never->pass();
    return int64_t{0};
  });
  context.init_rpc("w1", "PIPE", 1, 2,
                   pipe_options({{"heartbeat_interval_ms", args.at(1)},
                                 {"heartbeat_timeout_ms", args.at(2)}}),
                   store);
  say("ready");
  never->pass();
  context.shutdown(false);
  return 0;
}

TEST_CASE("over the same-host lane, a peer killed with SIGKILL fails a pending call within 1 s",
          "[pipe][shm][failure][multiprocess]") {
  TcpStoreServer server;
  Subprocess child =
      sbtest::spawn_child("lane_worker", {std::to_string(server.port()), "250", "5000"});
  RpcContext w0;
  auto store = std::make_shared<TcpStore>("127.0.0.1", server.port(), client_options());
  // The heartbeat check is off here: only the closed socket can fail it.
  w0.init_rpc("w0", "PIPE", 0, 2, pipe_options({{"heartbeat_timeout_ms", "0"}}), store);
  expect_line(child, "ready");
  if (!reach_lane(w0)) {
    w0.shutdown(false);
    return;
  }
  rpc::Future<int64_t> call = w0.rpc_async<int64_t>("w1", "block", with_timeout(60s));
  expect_line(child, "running");
  const auto killed_at = Clock::now();
  child.kill(SIGKILL);
  const Outcome outcome = outcome_of(call);
  INFO(outcome.kind << ": " << outcome.message);
  CHECK(outcome.kind == "ConnectionError");
  CHECK_THAT(outcome.message, Catch::Contains("\"w1\""));
  CHECK(outcome.at - killed_at < 1s);
  CHECK(child.wait() == 128 + SIGKILL);
  w0.shutdown(false);
}

TEST_CASE("over the same-host lane, a peer stopped with SIGSTOP fails a pending call after "
          "the heartbeat timeout",
          "[pipe][shm][failure][heartbeat][multiprocess]") {
  TcpStoreServer server;
  Subprocess child =
      sbtest::spawn_child("lane_worker", {std::to_string(server.port()), "100", "1000"});
  RpcContext w0;
  auto store = std::make_shared<TcpStore>("127.0.0.1", server.port(), client_options());
  w0.init_rpc("w0", "PIPE", 0, 2,
              pipe_options({{"heartbeat_interval_ms", "100"}, {"heartbeat_timeout_ms", "1000"}}),
              store);
  expect_line(child, "ready");
  if (!reach_lane(w0)) {
    w0.shutdown(false);
    return;
  }
  child.kill(SIGSTOP);
  int status = 0;
  REQUIRE(::waitpid(child.pid(), &status, WUNTRACED) == child.pid());
  const auto stopped_at = Clock::now();
  const Outcome outcome = outcome_of(
      w0.rpc_async<int64_t>("w1", "add", with_timeout(60s), int64_t{1}, int64_t{2}));
  INFO(outcome.kind << ": " << outcome.message);
  CHECK(outcome.kind == "ConnectionError");
  CHECK_THAT(outcome.message, Catch::Contains("heartbeat"));
  CHECK(outcome.at - stopped_at < 5s);
  child.kill(SIGKILL);
  CHECK(child.wait() == 128 + SIGKILL);
  w0.shutdown(false);
}
