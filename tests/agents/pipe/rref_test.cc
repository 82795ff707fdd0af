// RRefs in PIPE dynamic groups: what a user of an RRef sees when the owner
// leaves or dies (a ConnectionError naming it, never a hang), and a user
// that leaves releases its references. Workers are RpcContexts on threads
// of this process over one HashStore, on 127.0.0.1; nothing sleeps hoping
// for an order (a value still being made is held on a Gate).
#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/mutex.h"
#include "rpc/backend_registry.h"
#include "rpc/rpc.h"
#include "store/hash_store.h"
#include "tests/util/threads.h"

using namespace switchboard;
using namespace std::chrono_literals;
using rpc::RpcContext;
using rpc::RRef;
using testing::eventually;
using testing::Gate;

namespace {

constexpr std::chrono::milliseconds kGuard = 60s;

// A dynamic PIPE worker serving "add" and "held" (which waits on `gate`).
struct Member {
  Member(const std::string& name, int rank, std::shared_ptr<Store> store,
         std::shared_ptr<Gate> gate, rpc::Extras extras = {}) {
    ctx.register_function("add", [](int64_t a, int64_t b) { return a + b; });
    ctx.register_function("held", [gate] {
      gate->pass();
      return int64_t{1};
    });
    ctx.register_function("keep_all", [this](std::vector<RRef<int64_t>> rrefs) {
      MutexLock lock(mu);
      kept = std::move(rrefs);
      return static_cast<int64_t>(kept.size());
    });
    ctx.register_function("drop_all", [this] {
      std::vector<RRef<int64_t>> gone;
      MutexLock lock(mu);
      gone.swap(kept);
    });
    extras.emplace("listen_address", "127.0.0.1");
    extras.emplace("num_worker_threads", "4");
    auto options =
        rpc::construct_rpc_backend_options(rpc::backend_type("PIPE"), 30s, "env://", extras);
    ctx.init_rpc(name, "PIPE", rank, std::nullopt, options, std::move(store));
  }
  ~Member() { ctx.shutdown(false); }
  RpcContext ctx;
  Mutex mu;
  std::vector<RRef<int64_t>> kept SB_GUARDED_BY(mu);
};

int64_t owned(RpcContext& worker) { return worker.rref_debug_info().at("num_owner_rrefs"); }


// What `call` threw, as "Type: message".
template <typename F>
std::string failure_of(F&& call) {
  try {
    call();
  } catch (const ConnectionError& e) {
    return std::string("ConnectionError: ") + e.what();
  } catch (const TimeoutError& e) {
    return std::string("TimeoutError: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("other: ") + e.what();
  }
  return "none";
}

}  // namespace

TEST_CASE("an owner that leaves fails to_here and calls on its RRefs with ConnectionError "
          "naming it",
          "[pipe][rref][dynamic]") {
  auto store = std::make_shared<HashStore>();
  auto gate = std::make_shared<Gate>(kGuard);
  Member w0("w0", 0, store, gate);
  auto w1 = std::make_unique<Member>("w1", 1, store, gate);
  RRef<int64_t> r = w0.ctx.remote<int64_t>("w1", "add", int64_t{1}, int64_t{2});
  REQUIRE(r.to_here() == 3);
  w1->ctx.shutdown(true, kGuard);  // leaves the group
  REQUIRE(eventually([&] { return w0.ctx.get_worker_infos().size() == 1; }));
  const std::string fetch = failure_of([&] { (void)r.to_here(); });
  CHECK_THAT(fetch, Catch::StartsWith("ConnectionError") && Catch::Contains("\"w1\""));
  const std::string call = failure_of([&] { (void)r.rpc_sync<int64_t>("add", int64_t{1}); });
  CHECK_THAT(call, Catch::StartsWith("ConnectionError") && Catch::Contains("\"w1\""));
  gate->open();
}

TEST_CASE("an owner that dies while a value is being made fails the waiting to_here with "
          "ConnectionError",
          "[pipe][rref][dynamic]") {
  auto store = std::make_shared<HashStore>();
  auto gate = std::make_shared<Gate>(kGuard);
  Member w0("w0", 0, store, gate);
  auto w1 = std::make_unique<Member>("w1", 1, store, gate);
  // The value never comes: its function is held until the end.
  RRef<int64_t> r = w0.ctx.remote<int64_t>("w1", "held", rpc::with_timeout(0ms));
  REQUIRE(gate->wait_arrived(1));
  rpc::Future<int64_t> waiting = r.to_here_async(0ms);  // no timeout: only a failure ends it
  // w1 stops without leaving: its connections drop as in a crash.
  std::thread killer([&] { w1->ctx.shutdown(false, 1s); });
  REQUIRE(waiting.wait_for(kGuard));
  const std::string failure = failure_of([&] { (void)waiting.value(); });
  CHECK_THAT(failure, Catch::StartsWith("ConnectionError") && Catch::Contains("\"w1\""));
  gate->open();
  killer.join();
}

TEST_CASE("a user that leaves releases its references, and the owner frees the values",
          "[pipe][rref][dynamic]") {
  auto store = std::make_shared<HashStore>();
  auto gate = std::make_shared<Gate>(kGuard);
  Member w0("w0", 0, store, gate);
  auto w1 = std::make_unique<Member>("w1", 1, store, gate);
  RRef<int64_t> a = w1->ctx.remote<int64_t>("w0", "add", int64_t{1}, int64_t{1});
  RRef<int64_t> b = w1->ctx.remote<int64_t>("w0", "add", int64_t{2}, int64_t{2});
  REQUIRE(a.to_here() + b.to_here() == 6);
  CHECK(w0.ctx.rref_debug_info().at("num_owner_rrefs") == 2);
  // w1 still holds both when it leaves.
  w1->ctx.shutdown(true, kGuard);
  CHECK(eventually([&] { return w0.ctx.rref_debug_info().at("num_owner_rrefs") == 0; }));
  gate->open();
}

TEST_CASE("an RRef belongs to one incarnation of its owner: after the owner left and a new "
          "worker took its name, it fails with ConnectionError naming the lost owner",
          "[pipe][rref][dynamic]") {
  auto store = std::make_shared<HashStore>();
  auto gate = std::make_shared<Gate>(kGuard);
  Member w0("w0", 0, store, gate);
  auto w1 = std::make_unique<Member>("w1", 1, store, gate);
  RRef<int64_t> r = w0.ctx.remote<int64_t>("w1", "add", int64_t{1}, int64_t{2});
  REQUIRE(r.to_here() == 3);
  w1->ctx.shutdown(true, kGuard);  // leaves the group
  REQUIRE(eventually([&] { return w0.ctx.get_worker_infos().size() == 1; }));
  w1.reset();
  // Another "w1" joins, at another rank.
  Member newcomer("w1", 2, store, gate);
  REQUIRE(eventually([&] { return w0.ctx.get_worker_infos().size() == 2; }));
  REQUIRE(w0.ctx.get_worker_info("w1").id == 2);
  const std::string fetch = failure_of([&] { (void)r.to_here(10s); });
  CHECK_THAT(fetch, Catch::StartsWith("ConnectionError") && Catch::Contains("\"w1\" (rank 1)"));
  const std::string call = failure_of([&] { (void)r.rpc_sync<int64_t>("add", int64_t{1}); });
  CHECK_THAT(call, Catch::StartsWith("ConnectionError") && Catch::Contains("\"w1\" (rank 1)"));
  CHECK(owned(newcomer.ctx) == 0);
  gate->open();
}

TEST_CASE("RRef reference counting is never refused by the limit on a caller's requests",
          "[pipe][rref][limits]") {
  auto store = std::make_shared<HashStore>();
  auto gate = std::make_shared<Gate>(kGuard);
  const rpc::Extras limited = {{"max_requests_per_peer", "8"}};
  Member w0("w0", 0, store, gate, limited);
  Member w1("w1", 1, store, gate, limited);
  // w0 owns 1000 values and sends them all to w1 in one call.
  constexpr int64_t kValues = 1000;
  {
    std::vector<RRef<int64_t>> values;
    for (int64_t i = 0; i < kValues; ++i) {
      values.push_back(w0.ctx.remote<int64_t>("w0", "add", i, int64_t{0}));
      REQUIRE(values.back().to_here() == i);  // one at a time: under the limit
    }
    REQUIRE(w0.ctx.rpc_sync<int64_t>("w1", "keep_all", values) == kValues);
  }
  // w0 dropped its own; w1 drops its 1000: 1000 releases at once, past the
  // limit of 8, none refused.
  CHECK(owned(w0.ctx) == kValues);
  w0.ctx.rpc_sync("w1", "drop_all");
  CHECK(eventually([&] { return owned(w0.ctx) == 0; }));
  CHECK(eventually([&] { return w1.ctx.rref_debug_info().at("num_user_rrefs") == 0; }));
  gate->open();
}
