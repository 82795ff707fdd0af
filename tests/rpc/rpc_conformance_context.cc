// The RPC conformance suite, continued: what a function knows of the call
// it serves (rpc/call_context.h): its caller, its deadline and nested calls,
// cancellation by the caller, and server and client interceptors. Same binaries, same
// backends as rpc_conformance.cc.
#include <fmt/format.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <sstream>
#include <string>

#include "common/error.h"
#include "common/mutex.h"
#include "rpc/call_context.h"
#include "core/remote_error.h"
#include "rpc/rpc.h"
#include "tests/rpc/rpc_conformance.h"
#include "tests/util/threads.h"

using namespace switchboard;
using namespace std::chrono_literals;
using rpc::RpcContext;
using switchboard::conformance::Cluster;
using switchboard::testing::Gate;

TEST_CASE("a function sees who called it and under which name", "[rpc][context]") {
  Cluster cluster(2, [](int, RpcContext& self) {
    self.register_function("caller", [] {
      const rpc::CallContext* call = rpc::current_call();
      if (call == nullptr) return std::string("no call");
      return fmt::format("{} {} {}", call->caller.name, call->caller.id, call->function);
    });
    // An async function's synchronous part sees it too; the thread that
    // completes its future later does not.
    self.register_function("caller_async", [] {
      const rpc::CallContext* call = rpc::current_call();
      return rpc::Future<std::string>::ready(call ? call->caller.name : "no call");
    });
  });
  CHECK(cluster[1].rpc_sync<std::string>("w0", "caller") == "w1 1 caller");
  CHECK(cluster[0].rpc_sync<std::string>("w1", "caller") == "w0 0 caller");
  CHECK(cluster[0].rpc_sync<std::string>("w0", "caller") == "w0 0 caller");  // itself
  CHECK(cluster[1].rpc_async<std::string>("w0", "caller_async").value() == "w1");
  CHECK(rpc::current_call() == nullptr);  // not on this thread
}

TEST_CASE("a call's future cancelled by its caller fails with kCancelled, and the worker "
          "still drains and shuts down",
          "[rpc][cancel]") {
  auto gate = std::make_shared<Gate>(30s);
  Cluster cluster(2, [gate](int, RpcContext& self) {
    self.register_function("held", [gate] {
      gate->pass();
      return int64_t{1};
    });
  });
  rpc::Future<int64_t> call = cluster[1].rpc_async<int64_t>("w0", "held");
  REQUIRE(gate->wait_arrived(1));
  CHECK(call.cancel());
  try {
    call.value();
    FAIL("the cancelled call completed");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kCancelled);
  }
  gate->open();
  // Nothing of the cancelled call is left in flight on the caller.
  CHECK(cluster[1].get_metrics_snapshot().calls_in_flight == 0);
  cluster.shutdown_all();
}

TEST_CASE("server interceptors see every call first and may refuse it; allow_callers lets "
          "only some workers call a function",
          "[rpc][context][interceptor]") {
  auto seen = std::make_shared<std::atomic<int>>(0);
  Cluster cluster(3, [seen](int rank, RpcContext& self) {
    self.register_function("secret_op", [] { return std::string("done"); });
    self.register_function("open_op", [] { return std::string("open"); });
    if (rank == 0) {
      self.add_server_interceptor([seen](const rpc::CallContext& call) {
        if (call.function != "ping") ++*seen;  // counts what it sees, refuses nothing
        return std::string();
      });
      self.add_server_interceptor(rpc::allow_callers("secret_op", "w1"));
    }
  });
  CHECK(cluster[1].rpc_sync<std::string>("w0", "secret_op") == "done");
  CHECK(cluster[2].rpc_sync<std::string>("w0", "open_op") == "open");
  try {
    cluster[2].rpc_sync<std::string>("w0", "secret_op");
    FAIL("w2's call of secret_op was not refused");
  } catch (const rpc::RemoteError& e) {
    CHECK(e.code() == ErrorCode::kPermissionDenied);
    CHECK_THAT(e.remote_message(),
               Catch::Contains("worker \"w0\" refused function \"secret_op\" from \"w2\": "
                               "only workers matching \"w1\" may call it"));
  }
  CHECK(seen->load() == 3);
  // Other workers have no interceptor.
  CHECK(cluster[0].rpc_sync<std::string>("w2", "secret_op") == "done");
  CHECK_THROWS_AS(rpc::allow_callers("f", "("), std::invalid_argument);
}

namespace {

// What the current call has left until its deadline, in ms; -1 without one.
int64_t time_left() {
  const rpc::CallContext* call = rpc::current_call();
  if (call == nullptr || !call->deadline) return -1;
  return std::chrono::duration_cast<std::chrono::milliseconds>(*call->deadline -
                                                               std::chrono::steady_clock::now())
      .count();
}

}  // namespace

TEST_CASE("a call's deadline reaches the function and every call it makes", "[rpc][context]") {
  Cluster cluster(3, [](int, RpcContext& self) {
    self.register_function("left", [] { return time_left(); });
    // Calls "left" on `to` (with `timeout_ms`, or none given when 0) and
    // says what it had left itself, then what the callee had.
    self.register_function("relay", [&self](std::string to, int64_t timeout_ms) {
      const int64_t mine = time_left();
      const int64_t theirs =
          timeout_ms > 0
              ? self.rpc_sync<int64_t>(to, "left",
                                       rpc::with_timeout(std::chrono::milliseconds(timeout_ms)))
              : self.rpc_sync<int64_t>(to, "left");
      return fmt::format("{} {}", mine, theirs);
    });
  });
  RpcContext& w0 = cluster[0];
  const int64_t left = w0.rpc_sync<int64_t>("w1", "left", rpc::with_timeout(20s));
  CHECK(left > 0);
  CHECK(left <= 20'000);
  // The options' timeout (30 s here) when the call gives none; none at all
  // with a timeout of 0.
  const int64_t by_default = w0.rpc_sync<int64_t>("w1", "left");
  CHECK(by_default > 0);
  CHECK(by_default <= 30'000);
  CHECK(w0.rpc_sync<int64_t>("w1", "left", rpc::with_timeout(0ms)) == -1);
  // Nested calls: the default is the time left; a longer timeout is cut to
  // it; a shorter one stays.
  for (const int64_t nested : {int64_t{0}, int64_t{600'000}, int64_t{1'000}}) {
    INFO("the nested call's timeout: " << nested);
    const std::string answer =
        w0.rpc_sync<std::string>("w1", "relay", rpc::with_timeout(20s), std::string("w2"),
                                 nested);
    std::istringstream fields(answer);
    int64_t mine = 0;
    int64_t theirs = 0;
    fields >> mine >> theirs;
    CHECK(mine > 0);
    CHECK(mine <= 20'000);
    CHECK(theirs > 0);
    CHECK(theirs <= mine);
    if (nested == 1'000) CHECK(theirs <= 1'000);
  }
}


TEST_CASE("client interceptors see every call before it is sent, may refuse it, and hear "
          "how it ended",
          "[rpc][context][interceptor]") {
  struct Seen {
    Mutex mu;
    std::vector<std::string> calls SB_GUARDED_BY(mu);   // "to function timeout tensors"
    std::vector<std::string> ended SB_GUARDED_BY(mu);   // "function ok|<error>"
  };
  auto seen = std::make_shared<Seen>();
  Cluster cluster(2, [seen](int rank, RpcContext& self) {
    self.register_function("add", [](int64_t a, int64_t b) { return a + b; });
    self.register_function("fail", []() -> int64_t { throw std::runtime_error("no"); });
    // A function that calls back: its nested call passes w1's interceptors.
    self.register_function("relay", [&self](std::string to) {
      return self.rpc_sync<int64_t>(to, "add", int64_t{1}, int64_t{1});
    });
    if (rank != 1) return;
    self.add_client_interceptor([seen](rpc::ClientCall& call) {
      {
        MutexLock lock(seen->mu);
        seen->calls.push_back(fmt::format("{} {} {} {}", call.to.name, call.function,
                                          call.timeout.count(), call.tensors));
      }
      call.on_done([seen, function = call.function](std::exception_ptr error) {
        std::string how = "ok";
        if (error) {
          try {
            std::rethrow_exception(error);
          } catch (const std::exception& e) {
            how = e.what();
          }
        }
        MutexLock lock(seen->mu);
        seen->ended.push_back(function + " " + how);
      });
      return std::string();
    });
    self.add_client_interceptor([](rpc::ClientCall& call) {
      if (call.function == "forbidden") return std::string("this worker may not call it");
      if (call.function == "thrown") throw std::runtime_error("the interceptor threw here");
      return std::string();
    });
  });
  RpcContext& w1 = cluster[1];
  CHECK(w1.rpc_sync<int64_t>("w0", "add", rpc::with_timeout(7s), int64_t{2}, int64_t{3}) == 5);
  CHECK_THROWS_AS(w1.rpc_sync<int64_t>("w0", "fail"), rpc::RemoteError);
  for (const char* refused : {"forbidden", "thrown"}) {
    INFO(refused);
    try {
      w1.rpc_sync<int64_t>("w0", refused);
      FAIL("the call was sent");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::kPermissionDenied);
      CHECK_THAT(e.what(), Catch::Contains(fmt::format(
                               "rpc to \"w0\" function \"{}\": refused by this worker's "
                               "client interceptor: ",
                               refused)));
    }
  }
  // w0 has no client interceptor; its call to w1's relay makes a nested
  // call from w1, which w1's interceptors see.
  CHECK(cluster[0].rpc_sync<int64_t>("w1", "relay", std::string("w0")) == 2);

  MutexLock lock(seen->mu);
  CHECK(seen->calls == std::vector<std::string>{"w0 add 7000 0", "w0 fail 30000 0",
                                                "w0 forbidden 30000 0", "w0 thrown 30000 0",
                                                seen->calls.back()});
  CHECK_THAT(seen->calls.back(), Catch::StartsWith("w0 add "));
  REQUIRE(seen->ended.size() == 5);
  CHECK(seen->ended[0] == "add ok");
  CHECK_THAT(seen->ended[1], Catch::StartsWith("fail ") && Catch::Contains("no"));
  CHECK_THAT(seen->ended[2], Catch::Contains("this worker may not call it"));
  CHECK_THAT(seen->ended[3], Catch::Contains("the interceptor threw here"));
  CHECK(seen->ended[4] == "add ok");
  CHECK_THROWS_AS(w1.add_client_interceptor(nullptr), std::invalid_argument);
}

TEST_CASE("a function learns that its caller cancelled the call", "[rpc][context][cancel]") {
  auto gate = std::make_shared<Gate>(30s);
  auto noticed = std::make_shared<std::atomic<int>>(-1);  // -1: not yet known
  Cluster cluster(2, [gate, noticed](int, RpcContext& self) {
    self.register_function("work", [gate, noticed] {
      const rpc::CallContext* call = rpc::current_call();
      gate->pass();
      *noticed = call != nullptr && call->cancelled() ? 1 : 0;
      return int64_t{1};
    });
    self.register_function("echo", [](int64_t x) { return x; });
  });
  rpc::Future<int64_t> call = cluster[1].rpc_async<int64_t>("w0", "work");
  REQUIRE(gate->wait_arrived(1));
  CHECK(call.cancel());
  // A call made after the cancel, to the same worker: once it is answered,
  // the callee has taken in the cancel, which went before it.
  CHECK(cluster[1].rpc_sync<int64_t>("w0", "echo", int64_t{7}) == 7);
  gate->open();
  cluster.shutdown_all();
  CHECK(noticed->load() == 1);
}

// torch's test_worker_info_pickle and test_worker_id: WorkerInfo travels as
// an argument and as a result.
TEST_CASE("WorkerInfo travels as an argument and as a result", "[rpc]") {
  Cluster cluster(2, [](int, RpcContext& self) {
    self.register_function("same", [](rpc::WorkerInfo w) { return w; });
    self.register_function("caller", [] {
      const rpc::CallContext* call = rpc::current_call();
      return call ? call->caller : rpc::WorkerInfo{};
    });
    // A function that calls the worker it is given.
    self.register_function("ask", [&self](rpc::WorkerInfo w) {
      return self.rpc_sync<std::string>(w, "name_of_self");
    });
    self.register_function("name_of_self", [&self] { return self.get_worker_info().name; });
    self.register_function("list", [](std::vector<rpc::WorkerInfo> all) { return all; });
  });
  RpcContext& w0 = cluster[0];
  const rpc::WorkerInfo w1 = w0.get_worker_info("w1");
  CHECK(w0.rpc_sync<rpc::WorkerInfo>("w1", "same", w1) == w1);
  CHECK(w0.rpc_sync<rpc::WorkerInfo>("w1", "caller") == w0.get_worker_info());
  // w1 calls back the worker named by the WorkerInfo it received.
  CHECK(w0.rpc_sync<std::string>("w1", "ask", w0.get_worker_info()) == "w0");
  // In containers too.
  CHECK(w0.rpc_sync<std::vector<rpc::WorkerInfo>>("w1", "list", w0.get_worker_infos()) ==
        w0.get_worker_infos());
}

TEST_CASE("an inline function runs on the thread that received its request, not the pool, "
          "and sees its call",
          "[rpc][context][inline]") {
  Cluster cluster(2, [](int, RpcContext& self) {
    // Where each ran: on the agent's pool (a pool thread), or not.
    self.register_function("on_pool", [] { return rpc::ThreadPool::current() != nullptr; });
    self.register_inline_function("on_receiver", [] {
      const rpc::CallContext* call = rpc::current_call();
      return std::make_tuple(rpc::ThreadPool::current() == nullptr,
                             call ? call->caller.name : std::string());
    });
    self.register_inline_function("add", [](int64_t a, int64_t b) { return a + b; });
  });
  CHECK(cluster[0].rpc_sync<bool>("w1", "on_pool"));
  auto [off_pool, caller] = cluster[0].rpc_sync<std::tuple<bool, std::string>>("w1", "on_receiver");
  CHECK(off_pool);
  CHECK(caller == "w0");
  CHECK(cluster[0].functions().runs_inline("add"));
  CHECK_FALSE(cluster[0].functions().runs_inline("on_pool"));
  // Many at once, both ways.
  std::vector<rpc::Future<int64_t>> sums;
  for (int64_t i = 0; i < 200; ++i) {
    sums.push_back(cluster[i % 2].rpc_async<int64_t>(i % 2 ? "w0" : "w1", "add", i, i));
  }
  for (int64_t i = 0; i < 200; ++i) CHECK(sums[i].value() == 2 * i);
}
