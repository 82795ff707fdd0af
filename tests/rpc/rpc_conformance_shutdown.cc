// The RPC conformance suite, continued: graceful shutdown loses no work
// (PyTorch's promise: it waits until no worker of the group has calls in
// flight, however the calls move between workers), and the timeout given to
// shutdown() is its bound. Same binaries, same backends as
// rpc_conformance.cc.
#include <fmt/format.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "rpc/future.h"
#include "rpc/rpc.h"
#include "tests/rpc/rpc_conformance.h"
#include "tests/util/threads.h"

using namespace switchboard;
using namespace std::chrono_literals;
using rpc::RpcContext;
using switchboard::conformance::Cluster;
using switchboard::testing::Gate;
using switchboard::testing::on_threads;
using switchboard::testing::rethrow_first;

namespace {

constexpr std::chrono::milliseconds kGuard = 60s;

// Counts of a round of hot-potato chains.
struct Chains {
  std::atomic<int> ran{0};
  std::atomic<int> failed{0};
};

// Registers "hop(left)": counts itself and, while hops are left, fires the
// next hop at the next worker without waiting for it (its future only
// counts a failure), then returns: the work moves on after this call ended.
void register_hop(RpcContext& self, int rank, int world, const std::shared_ptr<Chains>& chains) {
  self.register_function("hop", [&self, rank, world, chains](int64_t left) {
    ++chains->ran;
    if (left <= 1) return;
    self.rpc_async<void>(fmt::format("w{}", (rank + 1) % world), "hop", left - 1)
        .add_callback([chains](const rpc::Future<void>& f) {
          if (f.has_error()) ++chains->failed;
        });
  });
}

}  // namespace

TEST_CASE("graceful shutdown waits until the whole group is quiet: every hop of chains "
          "that move between workers runs",
          "[rpc][shutdown]") {
  constexpr int kWorkers = 4;
  constexpr int kHops = 20;
  // Several rounds: without the group-wide check, most of them lost hops.
  for (int round = 0; round < 3; ++round) {
    INFO("round " << round);
    auto chains = std::make_shared<Chains>();
    Cluster cluster(kWorkers, [chains](int rank, RpcContext& self) {
      register_hop(self, rank, kWorkers, chains);
    });
    // Every worker starts a chain and shuts down at once.
    rethrow_first(on_threads(kWorkers, [&](int rank) {
      cluster[rank]
          .rpc_async<void>(fmt::format("w{}", (rank + 1) % kWorkers), "hop", int64_t{kHops})
          .add_callback([chains](const rpc::Future<void>& f) {
            if (f.has_error()) ++chains->failed;
          });
      cluster[rank].shutdown(true, kGuard);
    }));
    CHECK(chains->ran == kWorkers * kHops);
    CHECK(chains->failed == 0);
  }
}

TEST_CASE("graceful shutdown is bounded by its own timeout, not by rpc_timeout",
          "[rpc][shutdown][timeout]") {
  auto gate = std::make_shared<Gate>(kGuard);
  // rpc_timeout is short: w0's call gives up after it, while w1's handler
  // goes on running; shutdown() is given far longer.
  Cluster cluster(
      2,
      [gate](int, RpcContext& self) {
        self.register_function("slow", [gate] {
          gate->pass();
          return int64_t{7};
        });
      },
      conformance::make_options(300ms));
  rpc::Future<int64_t> call = cluster[0].rpc_async<int64_t>("w1", "slow");
  REQUIRE(gate->wait_arrived(1));
  CHECK_THROWS_AS(call.value(), TimeoutError);
  std::atomic<int> stopped{0};
  std::vector<std::exception_ptr> errors;
  std::thread stopper([&] {
    errors = on_threads(2, [&](int rank) {
      cluster[rank].shutdown(true, kGuard);
      ++stopped;
    });
  });
  // w1's handler runs on for several rpc_timeouts while w0 waits in
  // shutdown: a wait bounded by rpc_timeout would have failed by then. The
  // handler is let go once a call of a worker of its own, held on another
  // gate, has failed its 1200 ms deadline (the library's timer, not a sleep).
  auto held = std::make_shared<Gate>(kGuard);
  Cluster clock(1, [held](int, RpcContext& self) {
    self.register_function("held", [held] {
      held->pass();
      return int64_t{0};
    });
  });
  rpc::Future<int64_t> deadline =
      clock[0].rpc_async<int64_t>("w0", "held", rpc::with_timeout(4 * 300ms));
  REQUIRE(deadline.wait_for(kGuard));
  CHECK_THROWS_AS(deadline.value(), TimeoutError);
  held->open();
  CHECK(stopped == 0);
  gate->open();
  stopper.join();
  CHECK(stopped == 2);
  rethrow_first(errors);
}

namespace {

// How many threads of this process are named `name` (/proc/self/task).
int threads_named(const std::string& name) {
  int n = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string line;
    if (std::getline(comm, line) && line == name) ++n;
  }
  return n;
}

// Runs shutdown(graceful, bound) of `context` on a thread of its own;
// reports whether it returned while the test still holds a handler, and
// what it threw.
struct Stopping {
  Stopping(RpcContext& context, bool graceful, std::chrono::milliseconds bound)
      : thread([this, &context, graceful, bound] {
          try {
            context.shutdown(graceful, bound);
          } catch (...) {
            error = std::current_exception();
          }
          returned.set_value();
        }) {}
  ~Stopping() { thread.join(); }
  bool returns() { return returned.get_future().wait_for(kGuard); }

  rpc::Promise<void> returned;
  std::exception_ptr error;
  std::thread thread;
};

}  // namespace

TEST_CASE("shutdown returns within its bound while a handler that ignores its "
          "cancellation still runs; the handler sees its call cancelled",
          "[rpc][shutdown][timeout]") {
  for (const bool graceful : {false, true}) {
    INFO((graceful ? "graceful" : "ungraceful"));
    auto gate = std::make_shared<Gate>(kGuard);
    auto saw_cancelled = std::make_shared<rpc::Promise<bool>>();
    Cluster cluster(2, [gate, saw_cancelled](int, RpcContext& self) {
      self.register_function("stuck", [gate, saw_cancelled] {
        const rpc::CallContext* call = rpc::current_call();
        gate->pass();  // held until the test opens the gate, whatever happens
        saw_cancelled->set_value(call != nullptr && call->cancelled());
        return int64_t{1};
      });
    });
    rpc::Future<int64_t> call = cluster[0].rpc_async<int64_t>("w1", "stuck");
    REQUIRE(gate->wait_arrived(1));
    // w0 stops first (its call fails), then w1 while its handler runs.
    cluster[0].shutdown(false);
    CHECK(call.has_error());
    {
      Stopping w1(cluster[1], graceful, 200ms);
      CHECK(w1.returns());  // with the handler still held
      CHECK_FALSE(cluster[1].initialized());
      if (graceful) {
        // The group's wait ran out: this worker was still serving a call.
        REQUIRE(w1.error != nullptr);
        CHECK_THROWS_AS(std::rethrow_exception(w1.error), TimeoutError);
      } else {
        CHECK(w1.error == nullptr);
      }
      gate->open();
    }
    // The handler ran on after shutdown; once let go, it saw its call
    // cancelled (nobody could receive its reply).
    rpc::Future<bool> seen = saw_cancelled->get_future();
    REQUIRE(seen.wait_for(kGuard));
    CHECK(seen.value());
  }
  // The handlers' threads were left to finish on their own: they do, once
  // let go, and nothing of theirs outlives them (a test that ended first
  // would leave them running into the process's exit).
  CHECK(testing::eventually([] { return threads_named("sb-rpc-pool") == 0; }));
}
