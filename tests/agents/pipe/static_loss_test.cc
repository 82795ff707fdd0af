// A static PIPE group whose member is stopped past the heartbeat timeout
// (SIGSTOP, a suspended VM): the members that lose it, and the member
// itself once it resumes, apply one rule, so that they end with one view
// of the group. The higher rank of each pair makes a lost connection again,
// so after the member resumes every member calls it and it calls every
// member. Rank 1 is a child process; ranks 0 and 2 are RpcContexts on
// threads of this one, over a TcpStoreServer on 127.0.0.1.
#include <fmt/format.h>
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/logging.h"
#include "rpc/backend_registry.h"
#include "rpc/rpc.h"
#include "store/tcp_store.h"
#include "store/tcp_store_server.h"
#include "tests/util/subprocess.h"
#include "tests/util/threads.h"

using namespace switchboard;
using namespace std::chrono_literals;
using rpc::RpcContext;
using sbtest::Subprocess;
using switchboard::testing::eventually;
using switchboard::testing::on_threads;
using switchboard::testing::rethrow_first;

namespace {

constexpr std::chrono::milliseconds kGuard = 60s;

// Heartbeats every 100 ms, a peer silent for 1 s is lost.
std::shared_ptr<rpc::RpcBackendOptions> options() {
  return rpc::construct_rpc_backend_options(
      rpc::backend_type("PIPE"), 30s, "env://",
      {{"listen_address", "127.0.0.1"},
       {"num_worker_threads", "4"},
       {"heartbeat_interval_ms", "100"},
       {"heartbeat_timeout_ms", "1000"}});
}

std::shared_ptr<Store> client(uint16_t port) {
  TcpStoreOptions store_options;
  store_options.timeout = kGuard;
  return std::make_shared<TcpStore>("127.0.0.1", port, store_options);
}

void serve_whoami(RpcContext& ctx, const std::string& name) {
  ctx.register_function("whoami", [name] { return name; });
}

// What a call of `from` to `to` ended with: "ok", or the error's kind.
std::string call(RpcContext& from, const std::string& to) {
  try {
    from.rpc_sync<std::string>(to, "whoami", rpc::with_timeout(500ms));
    return "ok";
  } catch (const ConnectionError&) {
    return "ConnectionError";
  } catch (const TimeoutError&) {
    return "TimeoutError";
  } catch (const std::exception& e) {
    return std::string("other: ") + e.what();
  }
}

}  // namespace

// Rank 1 of the static group of three: says "joined", then once resumed
// calls ranks 0 and 2 until both answer (a minute at most) and says
// "back", then waits for the store key "done".
SB_CHILD_MAIN(static_member) {
  switchboard::init_logging("static_member");
  const auto port = static_cast<uint16_t>(std::stoi(args.at(0)));
  std::shared_ptr<Store> store = client(port);
  RpcContext ctx;
  serve_whoami(ctx, "x");
  ctx.init_rpc("x", "PIPE", 1, 3, options(), store);
  fmt::print("joined\n");
  std::fflush(stdout);
  store->wait({"stopped"}, kGuard);  // set while this process was stopped
  const bool back = eventually(
      [&] { return call(ctx, "a") == "ok" && call(ctx, "c") == "ok"; }, kGuard);
  fmt::print("{}\n", back ? "back" : "not back: " + call(ctx, "a") + " " + call(ctx, "c"));
  std::fflush(stdout);
  store->wait({"done"}, kGuard);
  ctx.shutdown(false);
  return 0;
}

TEST_CASE("a static member stopped past the heartbeat timeout is called again by every "
          "member once it resumes, and calls them (one rule, one view)",
          "[pipe][static][multiprocess]") {
  TcpStoreServer server;
  const uint16_t port = server.port();
  Subprocess x = sbtest::spawn_child("static_member", {std::to_string(port)});
  std::vector<std::unique_ptr<RpcContext>> here(2);
  const std::vector<std::string> names = {"a", "c"};
  const std::vector<int> ranks = {0, 2};
  rethrow_first(on_threads(2, [&](int i) {
    here[i] = std::make_unique<RpcContext>();
    serve_whoami(*here[i], names[i]);
    here[i]->init_rpc(names[i], "PIPE", ranks[i], 3, options(), client(port));
  }));
  REQUIRE(x.read_line(std::chrono::seconds(60)) == "joined");
  for (auto& ctx : here) REQUIRE(call(*ctx, "x") == "ok");

  x.kill(SIGSTOP);
  // Both lose it: their calls fail at once with ConnectionError.
  for (int i = 0; i < 2; ++i) {
    INFO(names[i]);
    CHECK(eventually([&] { return call(*here[i], "x") == "ConnectionError"; }, kGuard));
  }
  client(port)->set("stopped", {1});
  x.kill(SIGCONT);
  // The lower rank (a) is connected to again by x, the higher (c) connects
  // to x again: both call it, and it calls both.
  for (int i = 0; i < 2; ++i) {
    INFO(names[i]);
    CHECK(eventually([&] { return call(*here[i], "x") == "ok"; }, kGuard));
  }
  CHECK(x.read_line(std::chrono::seconds(60)) == "back");
  client(port)->set("done", {1});
  CHECK(x.wait() == 0);
  for (auto& ctx : here) ctx->shutdown(false);
}
