// RRefs whose owner is another process that dies (SIGKILL): a to_here()
// already waiting for a value still being made, and the calls on a value
// made before, fail with ConnectionError naming the owner, within a second,
// never a hang (rpc/rref.h). The owner is a child process
// (tests/util/subprocess.h); the group of two meets over a TcpStore.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
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
using rpc::RRef;
using switchboard::testing::Gate;

// args: store port. Joins a static group of two as "w1", says "ready",
// serves "add" and "held" (says "running", then waits on a gate nobody
// opens) until killed.
SB_CHILD_MAIN(rref_owner) {
  auto store = std::make_shared<TcpStore>(
      "127.0.0.1", static_cast<uint16_t>(std::stoi(args.at(0))), client_options());
  auto never = std::make_shared<Gate>(kGuard);
  RpcContext context;
  context.register_function("add", [](int64_t a, int64_t b) { return a + b; });
  context.register_function("held", [never] {
    say("running");
    never->pass();
    return int64_t{0};
  });
  context.init_rpc("w1", "PIPE", 1, 2, pipe_options(), store);
  say("ready");
  never->pass();
  context.shutdown(false);
  return 0;
}

TEST_CASE("an RRef owner killed with SIGKILL fails a waiting to_here and later calls with "
          "ConnectionError naming it, within a second",
          "[pipe][rref][failure][multiprocess]") {
  TcpStoreServer server;
  Subprocess child = sbtest::spawn_child("rref_owner", {std::to_string(server.port())});
  RpcContext w0;
  auto store = std::make_shared<TcpStore>("127.0.0.1", server.port(), client_options());
  w0.init_rpc("w0", "PIPE", 0, 2, pipe_options({{"heartbeat_timeout_ms", "0"}}), store);
  expect_line(child, "ready");
  RRef<int64_t> made = w0.remote<int64_t>("w1", "add", int64_t{2}, int64_t{3});
  REQUIRE(made.to_here() == 5);
  // A value that is still being made when its owner dies; no timeout at
  // all, so only the owner's loss can end the wait.
  RRef<int64_t> pending = w0.remote<int64_t>("w1", "held", rpc::with_timeout(0ms));
  expect_line(child, "running");
  rpc::Future<int64_t> waiting = pending.to_here_async(0ms);
  const auto killed_at = Clock::now();
  child.kill(SIGKILL);
  const Outcome outcome = outcome_of(waiting);
  INFO(outcome.kind << ": " << outcome.message);
  CHECK(outcome.kind == "ConnectionError");
  CHECK_THAT(outcome.message, Catch::Contains("\"w1\""));
  CHECK(outcome.at - killed_at < 1s);
  CHECK(child.wait() == 128 + SIGKILL);
  // The value made before is gone with its owner: fetching it, and calling
  // on it, fail the same way.
  const Outcome fetch = outcome_of(made.to_here_async(0ms));
  CHECK(fetch.kind == "ConnectionError");
  CHECK_THAT(fetch.message, Catch::Contains("\"w1\""));
  const Outcome call = outcome_of(made.rpc_async<int64_t>("add", int64_t{1}));
  CHECK(call.kind == "ConnectionError");
  w0.shutdown(false);
}
