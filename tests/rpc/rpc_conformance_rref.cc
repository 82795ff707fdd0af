// The RPC conformance suite, continued: remote() and RRef (rpc/rref.h),
// ported from PyTorch's rpc_test.py (test_rref_*, test_owner_rref_*,
// test_user_rrefs_confirmed, test_rref_leak, test_remote_*, test_nested_*).
// Same binaries, same backends as rpc_conformance.cc.
//
// Reference counts are read with rref_debug_info() (torch's
// _rref_context_get_debug_info). Releases travel as messages after the
// last handle is dropped, so a test waits (bounded) for the count it
// expects rather than reading it once.
#include <fmt/format.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/tensor.h"
#include "common/error.h"
#include "common/mutex.h"
#include "core/remote_error.h"
#include "rpc/rpc.h"
#include "tests/rpc/rpc_conformance.h"
#include "tests/util/threads.h"

using namespace switchboard;
using namespace std::chrono_literals;
using rpc::RpcContext;
using rpc::RRef;
using switchboard::conformance::Cluster;
using switchboard::testing::eventually;
using switchboard::testing::Gate;
using switchboard::testing::on_threads;
using switchboard::testing::rethrow_first;

namespace {

constexpr std::chrono::milliseconds kGuard = 60s;


int64_t owned(RpcContext& worker) { return worker.rref_debug_info().at("num_owner_rrefs"); }

// RRefs a worker keeps for a test, as a handler received them.
struct Kept {
  Mutex mu;
  std::vector<RRef<int64_t>> rrefs SB_GUARDED_BY(mu);

  void keep(RRef<int64_t> r) {
    MutexLock lock(mu);
    rrefs.push_back(std::move(r));
  }
  void drop() {
    std::vector<RRef<int64_t>> gone;
    MutexLock lock(mu);
    gone.swap(rrefs);
  }
};

// What every worker of these tests serves.
void register_rref_functions(int rank, RpcContext& self, const std::shared_ptr<Kept>& kept) {
  self.register_function("add", [](int64_t a, int64_t b) { return a + b; });
  self.register_function("sum_list", [](const std::vector<int64_t>& v, int64_t k) {
    int64_t s = k;
    for (int64_t x : v) s += x;
    return s;
  });
  self.register_function("make_list", [](int64_t n) { return std::vector<int64_t>(n, 1); });
  self.register_function("fail", [](int64_t) -> int64_t {
    throw std::runtime_error("remote function failed on purpose");
  });
  self.register_function("ones", [](int64_t n) {
    Tensor t = Tensor::empty({n}, DType::kFloat32);
    for (int64_t i = 0; i < n; ++i) t.data_as<float>()[i] = 1.0F;
    return t;
  });
  self.register_function("add_tensors", [](const Tensor& value, const Tensor& other) {
    Tensor out = Tensor::empty(value.shape(), DType::kFloat32);
    for (int64_t i = 0; i < value.numel(); ++i) {
      out.data_as<float>()[i] = value.data_as<float>()[i] + other.data_as<float>()[i];
    }
    return out;
  });
  // The value of an RRef this worker received, fetched from its owner.
  self.register_function("fetch", [](const RRef<int64_t>& r) { return r.to_here(); });
  self.register_function("owner_of", [](const RRef<int64_t>& r) { return r.owner_name(); });
  self.register_function("keep", [kept](RRef<int64_t> r) { kept->keep(std::move(r)); });
  self.register_function("echo_rref", [](RRef<int64_t> r) { return r; });
  self.register_function("drop_kept", [kept] { kept->drop(); });
  // Passes the RRef on along `path` (worker names), the last fetching it.
  self.register_function(
      "forward", [&self](const RRef<int64_t>& r, std::vector<std::string> path) -> int64_t {
        if (path.empty()) return r.to_here();
        const std::string next = path.front();
        path.erase(path.begin());
        return self.rpc_sync<int64_t>(next, "forward", r, path);
      });
  // Makes a value on `where` and returns the RRef (torch's return_rref).
  self.register_function("make_rref", [&self](std::string where, int64_t a) {
    return self.remote<int64_t>(where, "add", a, int64_t{1});
  });
  // A remote() from inside a function, fetched there (test_nested_remote).
  self.register_function("nested_remote", [&self](std::string where, int64_t a) {
    return self.remote<int64_t>(where, "add", a, int64_t{10}).to_here();
  });
  // Owner-side: the value itself, changed in place.
  self.register_function("increment", [](const RRef<int64_t>& r) {
    int64_t& v = r.local_value();
    v += 1;
    return v;
  });
  self.register_function("rank", [rank] { return int64_t{rank}; });
  self.register_function("wrong_type", [](const RRef<double>& r) { return r.owner_name(); });
}

Cluster::Prepare rref_workers(const std::shared_ptr<Kept>& kept) {
  return [kept](int rank, RpcContext& self) { register_rref_functions(rank, self, kept); };
}

}  // namespace

TEST_CASE("remote() returns at once; to_here fetches the value from its owner",
          "[rpc][rref]") {
  auto kept = std::make_shared<Kept>();
  Cluster cluster(2, rref_workers(kept));
  RRef<int64_t> r = cluster[0].remote<int64_t>("w1", "add", int64_t{2}, int64_t{3});
  REQUIRE(r.valid());
  CHECK(r.owner().name == "w1");
  CHECK(r.owner().id == 1);
  CHECK(r.owner_name() == "w1");
  CHECK_FALSE(r.is_owner());
  CHECK(r.to_here() == 5);
  CHECK(r.to_here(10s) == 5);  // fetched again: same value
  CHECK(r.describe().find("owner \"w1\"") != std::string::npos);
  // test_user_rrefs_confirmed
  CHECK(eventually([&] { return r.confirmed_by_owner(); }));
  // Values of other types: a list, a tensor.
  auto list = cluster[0].remote<std::vector<int64_t>>("w1", "make_list", int64_t{4});
  CHECK(list.to_here() == std::vector<int64_t>{1, 1, 1, 1});
  auto tensor = cluster[1].remote<Tensor>("w0", "ones", int64_t{3});
  Tensor t = tensor.to_here();
  REQUIRE(t.numel() == 3);
  CHECK(t.data_as<float>()[2] == 1.0F);
}

TEST_CASE("remote() to this worker makes an owner RRef whose local_value is the value",
          "[rpc][rref]") {
  auto kept = std::make_shared<Kept>();
  Cluster cluster(2, rref_workers(kept));
  RRef<int64_t> r = cluster[0].remote<int64_t>("w0", "add", int64_t{20}, int64_t{22});
  CHECK(r.is_owner());
  CHECK(r.confirmed_by_owner());
  CHECK(r.local_value() == 42);
  CHECK(r.to_here() == 42);
  // local_value is the value itself: a change stays, and others see it.
  r.local_value() = 7;
  CHECK(r.to_here() == 7);
  CHECK(cluster[1].rpc_sync<int64_t>("w0", "fetch", r) == 7);
}

TEST_CASE("local_value() off the owner fails, naming the owner", "[rpc][rref]") {
  auto kept = std::make_shared<Kept>();
  Cluster cluster(2, rref_workers(kept));
  RRef<int64_t> r = cluster[0].remote<int64_t>("w1", "add", int64_t{1}, int64_t{1});
  try {
    (void)r.local_value();
    FAIL("local_value() on a user returned");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kFailedPrecondition);
    CHECK_THAT(e.what(), Catch::Contains("only its owner") && Catch::Contains("\"w1\""));
  }
}

TEST_CASE("a function that throws under remote() fails to_here with its error",
          "[rpc][rref]") {
  auto kept = std::make_shared<Kept>();
  Cluster cluster(2, rref_workers(kept));
  RRef<int64_t> r = cluster[0].remote<int64_t>("w1", "fail", int64_t{1});
  try {
    (void)r.to_here();
    FAIL("to_here() of a failed remote() returned");
  } catch (const rpc::RemoteError& e) {
    CHECK_THAT(e.what(), Catch::Contains("remote function failed on purpose"));
    CHECK(e.worker() == "w1");
  }
  // An unknown function, and arguments that do not match, the same way.
  CHECK_THROWS_AS(cluster[0].remote<int64_t>("w1", "no_such_function").to_here(),
                  rpc::RemoteError);
  CHECK_THROWS_WITH(cluster[0].remote<int64_t>("w1", "add", std::string("x")).to_here(),
                    Catch::Contains("expects (int64, int64)"));
  // A result of another type than the RRef's.
  CHECK_THROWS_AS(cluster[0].remote<std::string>("w1", "add", int64_t{1}, int64_t{2}).to_here(),
                  rpc::SerializationError);
}

TEST_CASE("calls on the owner's value: rref.rpc_sync, rpc_async and remote", "[rpc][rref]") {
  auto kept = std::make_shared<Kept>();
  Cluster cluster(3, rref_workers(kept));
  auto list = cluster[0].remote<std::vector<int64_t>>("w1", "make_list", int64_t{5});
  // sum_list(value, 10), on w1.
  CHECK(list.rpc_sync<int64_t>("sum_list", int64_t{10}) == 15);
  CHECK(list.rpc_async<int64_t>("sum_list", int64_t{1}).value() == 6);
  CHECK(list.rpc_sync<int64_t>("sum_list", rpc::with_timeout(20s), int64_t{2}) == 7);
  RRef<int64_t> sum = list.remote<int64_t>("sum_list", int64_t{100});
  CHECK(sum.owner_name() == "w1");
  CHECK(sum.to_here() == 105);
  // Tensors in the value and in the arguments both arrive.
  auto ones = cluster[2].remote<Tensor>("w1", "ones", int64_t{4});
  Tensor twos = ones.rpc_sync<Tensor>("add_tensors", ones.to_here());
  REQUIRE(twos.numel() == 4);
  CHECK(twos.data_as<float>()[3] == 2.0F);
  // The value's function failed: so does the call.
  auto failed = cluster[0].remote<int64_t>("w1", "fail", int64_t{1});
  CHECK_THROWS_WITH(failed.rpc_sync<int64_t>("add", int64_t{1}),
                    Catch::Contains("failed on purpose"));
}

TEST_CASE("an RRef passed to another worker arrives as a usable reference", "[rpc][rref]") {
  auto kept = std::make_shared<Kept>();
  Cluster cluster(3, rref_workers(kept));
  RRef<int64_t> r = cluster[0].remote<int64_t>("w1", "add", int64_t{4}, int64_t{5});
  CHECK(cluster[0].rpc_sync<int64_t>("w2", "fetch", r) == 9);
  CHECK(cluster[0].rpc_sync<std::string>("w2", "owner_of", r) == "w1");
  // To the owner itself, where it is the owner's RRef.
  CHECK(cluster[0].rpc_sync<int64_t>("w1", "increment", r) == 10);
  CHECK(r.to_here() == 10);
  // test_rref_forward_chain: w0 -> w2 -> w0 -> w2 -> w1 (the owner) -> w2.
  CHECK(cluster[0].rpc_sync<int64_t>(
            "w2", "forward", r, std::vector<std::string>{"w0", "w2", "w1", "w2"}) == 10);
  // Sent away and back, it is a reference to the same value; another
  // value's is not.
  RRef<int64_t> back = cluster[0].rpc_sync<RRef<int64_t>>("w2", "echo_rref", r);
  CHECK(back == r);
  CHECK_FALSE(back == cluster[0].remote<int64_t>("w1", "add", int64_t{4}, int64_t{5}));
  // An RRef of another type is refused, naming both.
  CHECK_THROWS_WITH(cluster[0].rpc_sync<std::string>("w2", "wrong_type", r),
                    Catch::Contains("rref[float64]") && Catch::Contains("rref"));
}

TEST_CASE("RRefs returned by functions, and remote() inside functions", "[rpc][rref]") {
  auto kept = std::make_shared<Kept>();
  Cluster cluster(3, rref_workers(kept));
  // w1 makes a value on w2 and returns the RRef (test_return_local_rrefs,
  // test_nested_rref): w0 gets a reference to w2's value.
  RRef<int64_t> r = cluster[0].rpc_sync<RRef<int64_t>>("w1", "make_rref", std::string("w2"),
                                                       int64_t{6});
  CHECK(r.owner_name() == "w2");
  CHECK(r.to_here() == 7);
  // Owned by the caller itself: it arrives as the owner's RRef.
  RRef<int64_t> mine = cluster[0].rpc_sync<RRef<int64_t>>("w1", "make_rref",
                                                          std::string("w0"), int64_t{1});
  CHECK(mine.is_owner());
  CHECK(mine.local_value() == 2);
  // test_nested_remote
  CHECK(cluster[0].rpc_sync<int64_t>("w1", "nested_remote", std::string("w2"), int64_t{5}) ==
        15);
}

TEST_CASE("the owner frees a value when the last reference on any worker is gone",
          "[rpc][rref][refcount]") {
  auto kept = std::make_shared<Kept>();
  Cluster cluster(3, rref_workers(kept));
  {
    RRef<int64_t> r = cluster[0].remote<int64_t>("w1", "add", int64_t{1}, int64_t{2});
    CHECK(r.to_here() == 3);
    CHECK(owned(cluster[1]) == 1);
    // w2 keeps a reference; w0 drops its own.
    cluster[0].rpc_sync("w2", "keep", r);
  }
  // w0 let go of its reference only once w1 counted w2's.
  REQUIRE(eventually([&] { return cluster[0].rref_debug_info().at("num_forks") == 0; }));
  REQUIRE(eventually([&] { return cluster[0].rref_debug_info().at("num_user_rrefs") == 0; }));
  CHECK(owned(cluster[1]) == 1);
  CHECK(cluster[2].rref_debug_info().at("num_user_rrefs") == 1);
  // The kept reference still reads the value.
  {
    MutexLock lock(kept->mu);
    REQUIRE(kept->rrefs.size() == 1);
    CHECK(kept->rrefs[0].to_here() == 3);
  }
  cluster[0].rpc_sync("w2", "drop_kept");
  CHECK(eventually([&] { return owned(cluster[1]) == 0; }));
  CHECK(cluster[2].rref_debug_info().at("num_user_rrefs") == 0);
}

TEST_CASE("reference counts stay right with many references in flight at once",
          "[rpc][rref][refcount]") {
  // test_nested_rref_stress: 20 values, each sent to two workers many
  // times concurrently while the sender drops its own reference.
  auto kept = std::make_shared<Kept>();
  Cluster cluster(3, rref_workers(kept));
  constexpr int kValues = 20;
  rethrow_first(on_threads(kValues, [&](int i) {
    RRef<int64_t> r = cluster[0].remote<int64_t>("w1", "add", int64_t{i}, int64_t{0});
    std::vector<rpc::Future<int64_t>> fetched;
    for (int k = 0; k < 4; ++k) {
      fetched.push_back(cluster[0].rpc_async<int64_t>(k % 2 ? "w2" : "w1", "fetch", r));
    }
    cluster[0].rpc_sync("w2", "keep", r);
    for (auto& f : fetched) REQUIRE(f.value() == i);
  }));
  CHECK(owned(cluster[1]) == kValues);
  cluster[0].rpc_sync("w2", "drop_kept");
  CHECK(eventually([&] { return owned(cluster[1]) == 0; }));
  for (int rank = 0; rank < 3; ++rank) {
    INFO("w" << rank);
    CHECK(eventually([&] {
      auto info = cluster[rank].rref_debug_info();
      return info.at("num_user_rrefs") == 0 && info.at("num_forks") == 0;
    }));
  }
}

TEST_CASE("graceful shutdown releases the references workers still hold, and the values "
          "are freed",
          "[rpc][rref][shutdown]") {
  auto kept = std::make_shared<Kept>();
  Cluster cluster(3, rref_workers(kept));
  RRef<int64_t> held = cluster[0].remote<int64_t>("w1", "add", int64_t{1}, int64_t{1});
  cluster[0].rpc_sync("w2", "keep", held);
  REQUIRE(held.to_here() == 2);
  // Each worker, in its shutdown, releases what it holds (w1 warns when
  // it stops owning values that others still reference).
  rethrow_first(on_threads(3, [&](int rank) { cluster[rank].shutdown(true, kGuard); }));
  // After shutdown, the RRef fails at once, saying why.
  try {
    (void)held.to_here();
    FAIL("to_here() after shutdown returned");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kFailedPrecondition);
    CHECK_THAT(e.what(), Catch::Contains("shut down"));
  }
  kept->drop();
}

TEST_CASE("remote()'s timeout: a value not made in time fails to_here with TimeoutError",
          "[rpc][rref][timeout]") {
  auto gate = std::make_shared<Gate>(kGuard);
  Cluster cluster(2, [gate](int, RpcContext& self) {
    self.register_function("slow", [gate] {
      gate->pass();
      return int64_t{1};
    });
  });
  RRef<int64_t> r = cluster[0].remote<int64_t>("w1", "slow", rpc::with_timeout(300ms));
  REQUIRE(gate->wait_arrived(1));
  CHECK_THROWS_AS(r.to_here(), TimeoutError);
  CHECK_FALSE(r.confirmed_by_owner());
  gate->open();
}

TEST_CASE("an RRef passed to remote(), and malformed RRefs from the network",
          "[rpc][rref]") {
  auto kept = std::make_shared<Kept>();
  Cluster cluster(3, rref_workers(kept));
  // test_user_rrefs_confirmed_remote: w2 fetches w1's value inside a remote().
  RRef<int64_t> r = cluster[0].remote<int64_t>("w1", "add", int64_t{1}, int64_t{2});
  RRef<int64_t> fetched = cluster[0].remote<int64_t>("w2", "fetch", r);
  CHECK(fetched.to_here() == 3);
  // Bytes that are no RRef, where one is expected: the call fails with an
  // error naming it, and the worker goes on serving.
  auto send_raw = [&](const std::string& body) {
    rpc::Message m;
    m.type = rpc::MessageType::kRequest;
    m.function = "fetch";
    switchboard::detail::PayloadWriter writer{&m.payload};
    msgpack::packer<switchboard::detail::PayloadWriter> packer(writer);
    packer.pack_array(1);
    packer.pack_ext(body.size(), rpc::kRRefExtType);
    packer.pack_ext_body(body.data(), body.size());
    return cluster[0].send("w2", std::move(m), std::nullopt).value();
  };
  CHECK_THROWS_AS(rpc::decode_result<int64_t>(send_raw("\xc1")), rpc::RemoteError);
  std::string three_ints;
  {
    std::vector<uint8_t> bytes;
    switchboard::detail::PayloadWriter writer{&bytes};
    msgpack::pack(writer, std::vector<int64_t>{1, 2, 3});
    three_ints.assign(bytes.begin(), bytes.end());
  }
  CHECK_THROWS_WITH(rpc::decode_result<int64_t>(send_raw(three_ints)),
                    Catch::Contains("an RRef is not"));
  CHECK(cluster[0].rpc_sync<int64_t>("w2", "fetch", r) == 3);
  // An RRef can only be received through RPC.
  rpc::Message m;
  rpc::encode_result(m, r);
  CHECK_THROWS_WITH(rpc::decode_result<RRef<int64_t>>(m),
                    Catch::Contains("only be received in an RPC"));
}

namespace {

using Pair = std::vector<RRef<int64_t>>;

// Workers whose "make_pair" (on the outer value's owner) returns two RRefs
// to values made on `where`, and whose "sum_pair" fetches both.
void register_nested_functions(RpcContext& self) {
  self.register_function("make_pair", [&self](std::string where) {
    return Pair{self.remote<int64_t>(where, "add", int64_t{1}, int64_t{2}),
                self.remote<int64_t>(where, "add", int64_t{10}, int64_t{20})};
  });
  self.register_function("sum_pair", [](const Pair& pair) {
    int64_t sum = 0;
    for (const RRef<int64_t>& r : pair) sum += r.to_here(std::chrono::milliseconds(10'000));
    return sum;
  });
  self.register_function("add", [](int64_t a, int64_t b) { return a + b; });
}

}  // namespace

TEST_CASE("a value that holds RRefs keeps them while it lives: fetched and called on again "
          "and again, then freed with them",
          "[rpc][rref][refcount][nested]") {
  Cluster cluster(3, [](int, RpcContext& self) { register_nested_functions(self); });
  {
    // w1 owns a pair of references to values on w2.
    RRef<Pair> outer = cluster[0].remote<Pair>("w1", "make_pair", std::string("w2"));
    for (int round = 0; round < 3; ++round) {
      INFO("round " << round);
      Pair copy = outer.to_here();
      REQUIRE(copy.size() == 2);
      CHECK(copy[0].to_here(std::chrono::milliseconds(10'000)) == 3);
      CHECK(copy[1].to_here(std::chrono::milliseconds(10'000)) == 30);
      // The copy goes; w1's value still holds the inner values.
    }
    for (int round = 0; round < 3; ++round) {
      INFO("call " << round);
      CHECK(outer.rpc_sync<int64_t>("sum_pair") == 33);
    }
    CHECK(owned(cluster[2]) == 2);
  }
  // Everything dropped: the outer value goes, and with it the inner ones.
  CHECK(eventually([&] { return owned(cluster[1]) == 0; }));
  CHECK(eventually([&] { return owned(cluster[2]) == 0; }));
  for (int rank = 0; rank < 3; ++rank) {
    INFO("w" << rank);
    CHECK(eventually([&] {
      auto info = cluster[rank].rref_debug_info();
      return info.at("num_user_rrefs") == 0 && info.at("num_forks") == 0;
    }));
  }
}

TEST_CASE("a function that receives an RRef runs once its owner confirmed it",
          "[rpc][rref]") {
  // torch's test_user_rrefs_confirmed: confirmed_by_owner() inside the
  // function that received the RRef.
  Cluster cluster(3, [](int, RpcContext& self) {
    self.register_function("add", [](int64_t a, int64_t b) { return a + b; });
    self.register_function("confirmed", [](const RRef<int64_t>& r) {
      return r.confirmed_by_owner();
    });
  });
  RRef<int64_t> r = cluster[0].remote<int64_t>("w1", "add", int64_t{1}, int64_t{2});
  REQUIRE(r.to_here() == 3);
  std::vector<rpc::Future<bool>> calls;
  for (int i = 0; i < 40; ++i) calls.push_back(cluster[0].rpc_async<bool>("w2", "confirmed", r));
  for (int i = 0; i < 40; ++i) {
    INFO("call " << i);
    CHECK(calls[i].value());
  }
}

namespace {

// The time its call had left when a function started (ms; INT64_MIN: no
// deadline), and its name and caller as it saw them.
struct Seen {
  std::atomic<int64_t> left{INT64_MAX};  // INT64_MAX: not run yet
  Mutex mu;
  std::string function SB_GUARDED_BY(mu);
  std::string caller SB_GUARDED_BY(mu);
  std::atomic<int> cancelled{-1};
  std::atomic<bool> started{false};
};

void record(Seen& seen) {
  const rpc::CallContext* call = rpc::current_call();
  {
    MutexLock lock(seen.mu);
    seen.function = call ? call->function : "(none)";
    seen.caller = call ? call->caller.name : "(none)";
  }
  seen.left = call && call->deadline
                  ? std::chrono::duration_cast<std::chrono::milliseconds>(
                        *call->deadline - std::chrono::steady_clock::now())
                        .count()
                  : INT64_MIN;
}

}  // namespace

TEST_CASE("calls on an RRef's value run in their caller's context: the name, the deadline "
          "from the request's arrival, and cancellation",
          "[rpc][rref][context]") {
  auto gate = std::make_shared<Gate>(kGuard);
  auto seen = std::make_shared<Seen>();
  Cluster cluster(2, [gate, seen](int, RpcContext& self) {
    self.register_function("held", [gate] {
      gate->pass();
      return int64_t{1};
    });
    self.register_function("record", [seen](int64_t value) {
      record(*seen);
      return value;
    });
    self.register_function("until_cancelled", [seen](int64_t value) {
      const rpc::CallContext* call = rpc::current_call();
      seen->started = true;
      // Waits for the caller's cancel (bounded: before the fix, it never came).
      const bool noticed =
          call != nullptr && eventually([call] { return call->cancelled(); }, 10s);
      seen->cancelled = noticed ? 1 : 0;
      return value;
    });
    self.register_function("echo", [](int64_t x) { return x; });
  });
  RpcContext& w0 = cluster[0];

  SECTION("the name and the caller, through rref.rpc_async, rref.remote and remote") {
    RRef<int64_t> r = w0.remote<int64_t>("w1", "echo", int64_t{5});
    auto check_seen = [&](const char* how) {
      INFO(how);
      MutexLock lock(seen->mu);
      CHECK(seen->function == "record");
      CHECK(seen->caller == "w0");
      CHECK(seen->left.load() > 0);
      CHECK(seen->left.load() <= 20'000);
      seen->function.clear();
    };
    CHECK(r.rpc_sync<int64_t>("record", rpc::with_timeout(20s)) == 5);
    check_seen("rref.rpc_sync");
    CHECK(r.remote<int64_t>("record", rpc::with_timeout(20s)).to_here() == 5);
    check_seen("rref.remote");
    CHECK(w0.remote<int64_t>("w1", "record", rpc::with_timeout(20s), int64_t{5}).to_here() == 5);
    check_seen("remote");
  }

  SECTION("the deadline counts from the request's arrival, not from when the value was made") {
    RRef<int64_t> r = w0.remote<int64_t>("w1", "held");
    REQUIRE(gate->wait_arrived(1));
    rpc::Future<int64_t> call = r.rpc_async<int64_t>("record", rpc::with_timeout(500ms));
    // The caller gave up: its deadline is over on both sides.
    CHECK_THROWS_AS(call.value(), TimeoutError);
    gate->open();  // the value is made now, and the function runs
    REQUIRE(eventually([&] { return seen->left.load() != INT64_MAX; }));
    CHECK(seen->left.load() != INT64_MIN);
    // Counted from the request's arrival, the deadline is over, or within
    // the request's transit time of it (the callee's clock started when the
    // request arrived, the caller's when it was sent); counted from when the
    // value was made, nearly the whole 500 ms would be left.
    CHECK(seen->left.load() < 250);
  }

  SECTION("a call on a value that was being made sees its caller cancel it") {
    RRef<int64_t> r = w0.remote<int64_t>("w1", "held");
    REQUIRE(gate->wait_arrived(1));
    rpc::Future<int64_t> call = r.rpc_async<int64_t>("until_cancelled");
    gate->open();  // the value is made, and the function starts
    REQUIRE(eventually([&] { return seen->started.load(); }));
    CHECK(call.cancel());
    REQUIRE(eventually([&] { return seen->cancelled.load() != -1; }));
    CHECK(seen->cancelled.load() == 1);
  }
}

namespace {

// The fork number an RRef packed on this thread carries (the last field of
// its ext body: [owner, owner id, creator, serial, type, parent, fork]).
uint64_t fork_number_of(const RRef<int64_t>& r) {
  rpc::Message m;
  rpc::encode_result(m, r);
  msgpack::object_handle outer = msgpack::unpack(
      reinterpret_cast<const char*>(m.payload.data()), m.payload.size());
  const msgpack::object& ext = outer.get();
  REQUIRE(ext.type == msgpack::type::EXT);
  msgpack::object_handle body = msgpack::unpack(ext.via.ext.data(), ext.via.ext.size);
  REQUIRE(body.get().type == msgpack::type::ARRAY);
  REQUIRE(body.get().via.array.size == 7);
  return body.get().via.array.ptr[6].as<uint64_t>();
}

}  // namespace

TEST_CASE("the fork numbers of different workers do not coincide, so a release meant for a "
          "worker that left never frees a newcomer's fork of the same number",
          "[rpc][rref][refcount]") {
  // A release names the fork's parent by name only; a worker that joins
  // under the name of one that left must not hold forks of the same
  // numbers.
  auto kept = std::make_shared<Kept>();
  Cluster cluster(3, rref_workers(kept));
  RRef<int64_t> one = cluster[1].remote<int64_t>("w0", "add", int64_t{1}, int64_t{1});
  RRef<int64_t> two = cluster[2].remote<int64_t>("w0", "add", int64_t{2}, int64_t{2});
  REQUIRE(one.to_here() == 2);
  REQUIRE(two.to_here() == 4);
  // Packed outside a call: each is a fork of its worker (released when its
  // receiver, which never comes, would be counted: a leak, never a free).
  CHECK(fork_number_of(one) != fork_number_of(two));
}
