// The RPC conformance suite (see rpc_conformance.h): the public API of
// rpc/rpc.h over the backend the test binary names. Every case runs
// workers as threads of this process.
//
// Nothing here sleeps hoping for an order: a handler that must still be
// running blocks on a Gate the test opens, and every wait for something
// that must happen is bounded by kGuard so that a hang fails the test.
#include "tests/rpc/rpc_conformance.h"

#include <fmt/format.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/tensor.h"
#include "common/error.h"
#include "core/remote_error.h"
#include "core/serialize.h"
#include "rpc/thread_pool.h"
#include "store/hash_store.h"
#include "tests/util/threads.h"

using namespace switchboard;
using namespace std::chrono_literals;
using rpc::Future;
using rpc::RpcContext;
using rpc::WorkerInfo;
using rpc::with_timeout;
using switchboard::testing::Gate;
using switchboard::testing::on_threads;
using switchboard::testing::rethrow_first;

namespace conformance_types {
struct Point {
  int64_t x = 0;
  int64_t y = 0;
  std::string label;
  MSGPACK_DEFINE(x, y, label);
};
}  // namespace conformance_types
using conformance_types::Point;

namespace switchboard::conformance {

// Bounds every wait for something that must happen.
constexpr std::chrono::milliseconds kGuard = 60s;

rpc::BackendType backend_under_test() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (conformance_backend().setup) conformance_backend().setup();
  });
  return rpc::backend_type(conformance_backend().name);
}

std::shared_ptr<rpc::RpcBackendOptions> make_options(std::chrono::milliseconds rpc_timeout,
                                                     const rpc::Extras& more) {
  rpc::Extras extras = conformance_backend().extras;
  for (const auto& [key, value] : more) extras[key] = value;
  return rpc::construct_rpc_backend_options(backend_under_test(), rpc_timeout, "env://",
                                            extras);
}

Cluster::Cluster(int n, const Prepare& prepare,
                 std::shared_ptr<rpc::RpcBackendOptions> options)
    : store_(std::make_shared<HashStore>()) {
  for (int rank = 0; rank < n; ++rank) {
    contexts_.push_back(std::make_unique<RpcContext>());
    if (prepare) prepare(rank, *contexts_.back());
  }
  rethrow_first(on_threads(n, [&](int rank) {
    contexts_[rank]->init_rpc(fmt::format("w{}", rank), backend_under_test(), rank, n,
                              options, store_);
  }));
}

void Cluster::shutdown_all() {
  rethrow_first(on_threads(size(), [&](int rank) { contexts_[rank]->shutdown(true, kGuard); }));
}

Cluster::~Cluster() {
  auto errors = on_threads(size(), [&](int rank) { contexts_[rank]->shutdown(true, kGuard); });
  for (auto& context : contexts_) context->shutdown(false);
}

}  // namespace switchboard::conformance

namespace {

using conformance::Cluster;
using conformance::kGuard;
using conformance::make_options;

// The functions every worker of the common cluster serves.
void register_common(int rank, RpcContext& self, std::shared_ptr<Gate> gate) {
  self.register_function("add", [](int64_t a, int64_t b) { return a + b; });
  self.register_function("whoami", [rank] { return fmt::format("w{}", rank); });
  self.register_function("concat", [](std::string a, std::vector<std::string> parts) {
    for (const auto& part : parts) a += part;
    return a;
  });
  self.register_function("mixed", [](bool flip, std::map<std::string, int64_t> m,
                                     std::optional<std::string> label,
                                     std::vector<uint8_t> bytes, Point p) {
    Point out;
    out.x = flip ? p.y : p.x;
    out.y = static_cast<int64_t>(m.size() + bytes.size());
    out.label = label.value_or("none") + p.label;
    return out;
  });
  self.register_function("noop", [] {});
  self.register_function("echo", [](Tensor t) { return t; });
  self.register_function("echo_list",
                         [](std::vector<Tensor> ts) { return ts; });
  self.register_function("fail", [](std::string message) -> int64_t {
    throw std::runtime_error(message);
  });
  self.register_function("fail_domain", []() -> int64_t {
    throw std::domain_error("negative step size");
  });
  self.register_function("block", [gate](int64_t v) {
    gate->pass();
    return v;
  });
  // Nested: asks `to` for add(a, b) and adds one.
  self.register_function("nested_add", [&self](std::string to, int64_t a, int64_t b) {
    return self.rpc_sync<int64_t>(to, "add", a, b) + 1;
  });
  // A chain of nested calls alternating between two workers, `depth` deep.
  self.register_function("relay", [&self](std::vector<std::string> order, int64_t depth) {
    if (depth == 0) return int64_t{0};
    const std::string next = order[static_cast<size_t>(depth) % order.size()];
    return self.rpc_sync<int64_t>(next, "relay", order, depth - 1) + 1;
  });
  // An async handler: replies when the nested call completes, holding no
  // thread meanwhile.
  self.register_function("async_add", [&self](std::string to, int64_t a, int64_t b) {
    return self.rpc_async<int64_t>(to, "add", a, b).then(
        [](const Future<int64_t>& sum) { return sum.value() * 10; });
  });
  self.register_function("async_fail", [&self](std::string to) {
    return self.rpc_async<int64_t>(to, "fail", std::string("inner failure"));
  });
  self.register_function("on_pool", [] { return rpc::ThreadPool::current() != nullptr; });
}

std::unique_ptr<Cluster> common_cluster(int n, std::shared_ptr<Gate> gate,
                                        std::shared_ptr<rpc::RpcBackendOptions> options =
                                            make_options()) {
  return std::make_unique<Cluster>(
      n, [gate](int rank, RpcContext& self) { register_common(rank, self, gate); },
      std::move(options));
}

// Fills a tensor's bytes with a pattern depending on `seed` (bool: 0/1).
Tensor patterned(const Tensor::Shape& shape, DType dtype, int seed) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* bytes = static_cast<uint8_t*>(t.data());
  for (size_t i = 0; i < t.nbytes(); ++i) {
    bytes[i] = dtype == DType::kBool ? static_cast<uint8_t>((i + seed) % 2)
                                     : static_cast<uint8_t>(i * 31 + seed * 7);
  }
  return t;
}

bool same_contents(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

template <typename Fn>
rpc::RemoteError remote_error(Fn fn) {
  try {
    fn();
  } catch (const rpc::RemoteError& e) {
    return e;
  }
  FAIL("expected a RemoteError");
  throw std::logic_error("unreachable");
}

}  // namespace

TEST_CASE("rpc_sync and rpc_async carry ordinary values both ways", "[rpc]") {
  auto cluster = common_cluster(2, std::make_shared<Gate>(kGuard));
  RpcContext& w0 = (*cluster)[0];
  CHECK(w0.rpc_sync<int64_t>("w1", "add", int64_t{2}, int64_t{40}) == 42);
  CHECK(w0.rpc_sync<std::string>("w1", "whoami") == "w1");
  CHECK(w0.rpc_sync<std::string>("w1", "concat", std::string("a"),
                                 std::vector<std::string>{"b", "c"}) == "abc");
  std::map<std::string, int64_t> m{{"one", 1}, {"two", 2}};
  Point p{3, 4, "!"};
  Point out = w0.rpc_sync<Point>("w1", "mixed", true, m, std::optional<std::string>("lr"),
                                 std::vector<uint8_t>{1, 2, 3}, p);
  CHECK(out.x == 4);
  CHECK(out.y == 5);
  CHECK(out.label == "lr!");
  out = w0.rpc_sync<Point>("w1", "mixed", false, std::map<std::string, int64_t>{},
                           std::optional<std::string>(), std::vector<uint8_t>{}, p);
  CHECK(out.x == 3);
  CHECK(out.label == "none!");
  w0.rpc_sync("w1", "noop");

  Future<int64_t> f = w0.rpc_async<int64_t>("w1", "add", int64_t{1}, int64_t{2});
  REQUIRE(f.wait_for(kGuard));
  CHECK(f.done());
  CHECK_FALSE(f.has_error());
  CHECK(f.value() == 3);
  // `to` as a WorkerInfo, an id, and to oneself.
  CHECK(w0.rpc_sync<std::string>(w0.get_worker_info("w1"), "whoami") == "w1");
  CHECK(w0.rpc_sync<std::string>(1, "whoami") == "w1");
  CHECK(w0.rpc_sync<std::string>("w0", "whoami") == "w0");
}

TEST_CASE("future callbacks run on the agent's pool", "[rpc]") {
  auto cluster = common_cluster(2, std::make_shared<Gate>(kGuard));
  RpcContext& w0 = (*cluster)[0];
  auto gate = std::make_shared<Gate>(kGuard);
  std::atomic<bool> on_pool{false};
  Future<int64_t> chained =
      w0.rpc_async<int64_t>("w1", "add", int64_t{1}, int64_t{1})
          .then([&](const Future<int64_t>& sum) {
            on_pool = rpc::ThreadPool::current() != nullptr;
            return sum.value() + 1;
          });
  CHECK(chained.value() == 3);
  CHECK(on_pool.load());
  // Handlers run on the pool too.
  CHECK(w0.rpc_sync<bool>("w1", "on_pool"));
}

TEST_CASE("worker infos name every worker by rank", "[rpc]") {
  auto cluster = common_cluster(3, std::make_shared<Gate>(kGuard));
  for (int rank = 0; rank < 3; ++rank) {
    RpcContext& self = (*cluster)[rank];
    CHECK(self.get_worker_info() == WorkerInfo{fmt::format("w{}", rank), rank});
    CHECK(self.get_worker_info("w2") == WorkerInfo{"w2", 2});
    auto infos = self.get_worker_infos();
    REQUIRE(infos.size() == 3);
    for (int i = 0; i < 3; ++i) CHECK(infos[i] == WorkerInfo{fmt::format("w{}", i), i});
  }
  RpcContext& w0 = (*cluster)[0];
  CHECK_THROWS_AS(w0.get_worker_info("w9"), NotFoundError);
  CHECK_THROWS_WITH(w0.rpc_sync<int64_t>("w9", "add", int64_t{1}, int64_t{2}),
                    Catch::Contains("w9"));
  CHECK_THROWS_AS(w0.rpc_async<int64_t>(7, "add", int64_t{1}, int64_t{2}), NotFoundError);
  CHECK_THROWS_AS(w0.rpc_sync<std::string>(WorkerInfo{"w1", 2}, "whoami"),
                  std::invalid_argument);
}

TEST_CASE("nested calls reach a third worker and the caller", "[rpc]") {
  auto cluster = common_cluster(3, std::make_shared<Gate>(kGuard));
  RpcContext& w0 = (*cluster)[0];
  CHECK(w0.rpc_sync<int64_t>("w1", "nested_add", std::string("w2"), int64_t{1},
                             int64_t{2}) == 4);
  CHECK(w0.rpc_sync<int64_t>("w1", "nested_add", std::string("w0"), int64_t{5},
                             int64_t{5}) == 11);
}

TEST_CASE("nested calls do not starve a one-thread pool", "[rpc]") {
  // Every handler of the chain blocks its pool thread on the next call; the
  // pools grow instead of deadlocking.
  auto cluster = common_cluster(2, std::make_shared<Gate>(kGuard),
                                make_options(30s, {{"num_worker_threads", "1"}}));
  RpcContext& w0 = (*cluster)[0];
  const std::vector<std::string> order{"w0", "w1"};
  CHECK(w0.rpc_sync<int64_t>("w1", "relay", order, int64_t{12}) == 12);
  // Several chains at once.
  std::vector<Future<int64_t>> chains;
  for (int i = 0; i < 4; ++i) {
    chains.push_back(w0.rpc_async<int64_t>("w1", "relay", order, int64_t{6}));
  }
  for (auto& chain : chains) CHECK(chain.value() == 6);
}

TEST_CASE("async handlers reply when their future completes", "[rpc]") {
  auto gate = std::make_shared<Gate>(kGuard);
  auto cluster = common_cluster(3, gate);
  RpcContext& w0 = (*cluster)[0];
  CHECK(w0.rpc_sync<int64_t>("w1", "async_add", std::string("w2"), int64_t{2},
                             int64_t{3}) == 50);
  auto error = remote_error([&] { w0.rpc_sync<int64_t>("w1", "async_fail", std::string("w2")); });
  CHECK(error.worker() == "w1");
  CHECK_THAT(error.what(), Catch::Contains("inner failure"));
  // An async handler waiting on a blocked call holds no thread: the same
  // one-thread worker keeps serving other calls meanwhile.
  auto gated = std::make_unique<Cluster>(
      3,
      [gate](int rank, RpcContext& self) {
        register_common(rank, self, gate);
        self.register_function("async_block", [&self](std::string to) {
          return self.rpc_async<int64_t>(to, "block", int64_t{7});
        });
      },
      make_options(30s, {{"num_worker_threads", "1"}}));
  Future<int64_t> waiting =
      (*gated)[0].rpc_async<int64_t>("w1", "async_block", std::string("w2"));
  REQUIRE(gate->wait_arrived(1));
  CHECK((*gated)[0].rpc_sync<int64_t>("w1", "add", int64_t{1}, int64_t{1}) == 2);
  CHECK_FALSE(waiting.done());
  gate->open();
  CHECK(waiting.value() == 7);
}

TEST_CASE("a remote exception arrives as RemoteError", "[rpc]") {
  auto cluster = common_cluster(2, std::make_shared<Gate>(kGuard));
  RpcContext& w0 = (*cluster)[0];
  auto error = remote_error([&] { w0.rpc_sync<int64_t>("w1", "fail", std::string("boom")); });
  CHECK(error.worker() == "w1");
  CHECK(error.type_name() == "std::runtime_error");
  CHECK(error.remote_message() == "boom");
  error = remote_error([&] { w0.rpc_sync<int64_t>("w1", "fail_domain"); });
  CHECK(error.type_name() == "std::domain_error");
  CHECK_THAT(error.what(), Catch::Contains("negative step size") && Catch::Contains("w1"));
  // Through a future too.
  Future<int64_t> f = w0.rpc_async<int64_t>("w1", "fail", std::string("later"));
  REQUIRE(f.wait_for(kGuard));
  CHECK(f.has_error());
  CHECK_THROWS_AS(f.value(), rpc::RemoteError);
  // The worker keeps serving.
  CHECK(w0.rpc_sync<int64_t>("w1", "add", int64_t{1}, int64_t{1}) == 2);
}

TEST_CASE("unknown functions and wrong arguments are named errors", "[rpc]") {
  auto cluster = common_cluster(2, std::make_shared<Gate>(kGuard));
  RpcContext& w0 = (*cluster)[0];
  auto error = remote_error([&] { w0.rpc_sync<int64_t>("w1", "sub", int64_t{1}); });
  CHECK(error.type_name() == "switchboard::NotFoundError");
  CHECK_THAT(error.remote_message(), Catch::Contains("\"w1\"") && Catch::Contains("\"sub\""));

  error = remote_error(
      [&] { w0.rpc_sync<int64_t>("w1", "add", std::string("1"), int64_t{2}); });
  CHECK(error.type_name() == "switchboard::rpc::ArgumentError");
  CHECK_THAT(error.remote_message(),
             Catch::Contains("\"add\"") && Catch::Contains("(int64, int64)") &&
                 Catch::Contains("str"));
  error = remote_error([&] { w0.rpc_sync<int64_t>("w1", "add", int64_t{1}); });
  CHECK(error.type_name() == "switchboard::rpc::ArgumentError");
  // A result of another type than asked for.
  CHECK_THROWS_AS(w0.rpc_sync<std::string>("w1", "add", int64_t{1}, int64_t{2}),
                  rpc::SerializationError);
  CHECK_THROWS_WITH(w0.rpc_sync<std::string>("w1", "add", int64_t{1}, int64_t{2}),
                    Catch::Contains("\"add\"") && Catch::Contains("str"));
  // An undefined tensor cannot be encoded: thrown at once.
  CHECK_THROWS_AS(w0.rpc_async<Tensor>("w1", "echo", Tensor()), std::invalid_argument);
}

TEST_CASE("a call past its timeout fails with a TimeoutError naming it", "[rpc]") {
  auto gate = std::make_shared<Gate>(kGuard);
  auto cluster = common_cluster(2, gate, make_options(30s));
  RpcContext& w0 = (*cluster)[0];
  Future<int64_t> late = w0.rpc_async<int64_t>("w1", "block", with_timeout(150ms), int64_t{1});
  REQUIRE(late.wait_for(kGuard));
  REQUIRE(late.has_error());
  CHECK_THROWS_AS(late.value(), TimeoutError);
  CHECK_THROWS_WITH(late.value(), Catch::Contains("\"w1\"") &&
                                      Catch::Contains("\"block\"") &&
                                      Catch::Contains("150 ms"));
  CHECK_THROWS_AS(w0.rpc_sync<int64_t>("w1", "block", with_timeout(100ms), int64_t{2}),
                  TimeoutError);
  // Timeout 0: none; the call completes whenever the handler returns.
  Future<int64_t> patient = w0.rpc_async<int64_t>("w1", "block", with_timeout(0ms), int64_t{3});
  CHECK_THROWS_AS(w0.rpc_async<int64_t>("w1", "add", with_timeout(-1ms), int64_t{1},
                                        int64_t{1}),
                  std::invalid_argument);
  gate->open();
  CHECK(patient.value() == 3);
  // The worker still serves after the late replies.
  CHECK(w0.rpc_sync<int64_t>("w1", "add", int64_t{1}, int64_t{1}) == 2);
}

TEST_CASE("the default timeout comes from the options", "[rpc]") {
  auto gate = std::make_shared<Gate>(kGuard);
  auto cluster = common_cluster(2, gate, make_options(200ms));
  RpcContext& w0 = (*cluster)[0];
  CHECK(w0.options()->rpc_timeout == 200ms);
  CHECK_THROWS_WITH(w0.rpc_sync<int64_t>("w1", "block", int64_t{1}),
                    Catch::Contains("\"w1\"") && Catch::Contains("\"block\"") &&
                        Catch::Contains("200 ms"));
  gate->open();
}

TEST_CASE("tensors of every dtype travel, including empty ones", "[rpc][tensor]") {
  auto cluster = common_cluster(2, std::make_shared<Gate>(kGuard));
  RpcContext& w0 = (*cluster)[0];
  int seed = 0;
  for (DType dtype : kAllDTypes) {
    for (const Tensor::Shape& shape :
         {Tensor::Shape{}, Tensor::Shape{0}, Tensor::Shape{7}, Tensor::Shape{3, 5},
          Tensor::Shape{2, 0, 4}}) {
      INFO(dtype_name(dtype) << " numel " << Tensor::numel_of(shape));
      Tensor sent = patterned(shape, dtype, ++seed);
      Tensor back = w0.rpc_sync<Tensor>("w1", "echo", sent);
      CHECK(same_contents(sent, back));
      if (sent.nbytes() > 0) CHECK(back.data() != sent.data());
    }
  }
  // Several tensors in one call, and a non-contiguous one.
  std::vector<Tensor> many;
  for (DType dtype : kAllDTypes) many.push_back(patterned({4}, dtype, ++seed));
  auto back = w0.rpc_sync<std::vector<Tensor>>("w1", "echo_list", many);
  REQUIRE(back.size() == many.size());
  for (size_t i = 0; i < many.size(); ++i) CHECK(same_contents(many[i], back[i]));
}

TEST_CASE("a 64 MiB tensor travels", "[rpc][tensor]") {
  auto cluster = common_cluster(2, std::make_shared<Gate>(kGuard));
  Tensor big = patterned({16 * 1024 * 1024}, DType::kFloat32, 5);
  Tensor back = (*cluster)[0].rpc_sync<Tensor>("w1", "echo", big);
  CHECK(same_contents(big, back));
}

TEST_CASE("many concurrent calls from several threads", "[rpc][concurrency]") {
  auto cluster = common_cluster(3, std::make_shared<Gate>(kGuard));
  constexpr int kThreads = 4;
  constexpr int kCallsPerThread = 150;
  rethrow_first(on_threads(kThreads, [&](int thread) {
    RpcContext& self = (*cluster)[thread % 3];
    std::vector<Future<int64_t>> futures;
    for (int i = 0; i < kCallsPerThread; ++i) {
      const std::string to = fmt::format("w{}", (thread + i) % 3);
      futures.push_back(self.rpc_async<int64_t>(to, "add", int64_t{thread}, int64_t{i}));
    }
    for (int i = 0; i < kCallsPerThread; ++i) {
      if (futures[i].value() != thread + i) {
        throw std::runtime_error(fmt::format("call {} of thread {} got {}", i, thread,
                                             futures[i].value()));
      }
    }
  }));
}

TEST_CASE("init_rpc refuses misuse with named errors", "[rpc][init]") {
  auto cluster = common_cluster(1, std::make_shared<Gate>(kGuard));
  RpcContext& w0 = (*cluster)[0];
  CHECK_THROWS_WITH(
      w0.init_rpc("w0", conformance::backend_under_test(), 0, 1,
                  make_options(), std::make_shared<HashStore>()),
      Catch::Contains("already initialized"));
  CHECK(w0.rpc_sync<int64_t>("w0", "add", int64_t{1}, int64_t{1}) == 2);

  RpcContext fresh;
  const auto backend = conformance::backend_under_test();
  auto store = std::make_shared<HashStore>();
  for (std::string bad : {std::string(""), std::string("has space"), std::string("a/b"),
                          std::string(129, 'x')}) {
    CHECK_THROWS_AS(fresh.init_rpc(bad, backend, 0, 1, make_options(), store),
                    std::invalid_argument);
  }
  CHECK_THROWS_AS(fresh.init_rpc("ok", backend, 1, 1, make_options(), store),
                  std::invalid_argument);
  CHECK_THROWS_AS(fresh.init_rpc("ok", "NO_SUCH_BACKEND", 0, 1, make_options(), store),
                  RegistryError);
  CHECK_FALSE(fresh.initialized());
  CHECK_THROWS_AS(fresh.get_worker_info(), Error);
  CHECK_THROWS_WITH(fresh.rpc_sync("x", "noop"), Catch::Contains("init_rpc"));
  fresh.shutdown();  // a no-op
  // Names may use every allowed character.
  fresh.init_rpc("Trainer-1_a:b", backend, 0, 1, make_options(), store);
  CHECK(fresh.get_worker_info().name == "Trainer-1_a:b");
  fresh.shutdown();
}

TEST_CASE("a duplicate worker name fails on both workers", "[rpc][init]") {
  auto store = std::make_shared<HashStore>();
  const auto backend = conformance::backend_under_test();
  RpcContext a;
  RpcContext b;
  auto errors = on_threads(2, [&](int rank) {
    (rank == 0 ? a : b).init_rpc("same", backend, rank, 2, make_options(5s), store);
  });
  for (const auto& error : errors) {
    REQUIRE(error != nullptr);
    CHECK_THROWS_WITH(std::rethrow_exception(error), Catch::Contains("same"));
  }
  CHECK_FALSE(a.initialized());
  CHECK_FALSE(b.initialized());
}

TEST_CASE("shutdown after a failed init_rpc returns, and init works again", "[rpc][shutdown]") {
  auto store = std::make_shared<HashStore>();
  const auto backend = conformance::backend_under_test();
  RpcContext lonely;
  lonely.register_function("add", [](int64_t a, int64_t b) { return a + b; });
  // Rank 1 of a group whose rank 0 never comes.
  CHECK_THROWS_AS(lonely.init_rpc("w1", backend, 1, 2, make_options(300ms), store),
                  TimeoutError);
  CHECK_FALSE(lonely.initialized());
  lonely.shutdown();
  lonely.shutdown(false);
  // The same context initializes afterwards, with its functions.
  lonely.init_rpc("solo", backend, 0, 1, make_options(), std::make_shared<HashStore>());
  CHECK(lonely.rpc_sync<int64_t>("solo", "add", int64_t{2}, int64_t{2}) == 4);
  lonely.shutdown();
}

TEST_CASE("graceful shutdown waits for calls in flight", "[rpc][shutdown]") {
  auto gate = std::make_shared<Gate>(kGuard);
  auto cluster = common_cluster(3, gate);
  Future<int64_t> in_flight = (*cluster)[0].rpc_async<int64_t>("w1", "block", int64_t{9});
  REQUIRE(gate->wait_arrived(1));
  std::atomic<int> stopped{0};
  std::thread stopper([&] {
    rethrow_first(on_threads(3, [&](int rank) {
      (*cluster)[rank].shutdown(true, kGuard);
      ++stopped;
    }));
  });
  // No worker can pass the barrier while w0's call is in flight.
  gate->open();
  stopper.join();
  CHECK(stopped == 3);
  REQUIRE(in_flight.done());
  CHECK(in_flight.value() == 9);
  for (int rank = 0; rank < 3; ++rank) CHECK_FALSE((*cluster)[rank].initialized());
  CHECK_THROWS_AS((*cluster)[0].rpc_sync<int64_t>("w1", "add", int64_t{1}, int64_t{1}),
                  Error);
}

TEST_CASE("ungraceful shutdown fails pending futures at once", "[rpc][shutdown]") {
  auto gate = std::make_shared<Gate>(kGuard);
  auto cluster = common_cluster(2, gate);
  Future<int64_t> pending = (*cluster)[0].rpc_async<int64_t>("w1", "block", int64_t{1});
  REQUIRE(gate->wait_arrived(1));
  (*cluster)[0].shutdown(false);
  REQUIRE(pending.wait_for(kGuard));
  try {
    pending.value();
    FAIL("expected the pending call to fail");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kCancelled);
  }
  CHECK_FALSE((*cluster)[0].initialized());
  gate->open();
  (*cluster)[1].shutdown(false);
}

TEST_CASE("the group can init again after a shutdown, over the same store", "[rpc][shutdown]") {
  auto store = std::make_shared<HashStore>();
  const auto backend = conformance::backend_under_test();
  RpcContext a;
  RpcContext b;
  for (RpcContext* c : {&a, &b}) {
    c->register_function("add", [](int64_t x, int64_t y) { return x + y; });
  }
  for (int round = 0; round < 3; ++round) {
    rethrow_first(on_threads(2, [&](int rank) {
      (rank == 0 ? a : b).init_rpc(fmt::format("r{}w{}", round, rank), backend, rank, 2,
                                   make_options(), store);
    }));
    CHECK(a.rpc_sync<int64_t>(fmt::format("r{}w1", round), "add", int64_t{round},
                              int64_t{1}) == round + 1);
    rethrow_first(on_threads(2, [&](int rank) { (rank == 0 ? a : b).shutdown(true, kGuard); }));
  }
}

TEST_CASE("one store hosts runs of different sizes one after another, and a run that failed",
          "[rpc][shutdown]") {
  auto store = std::make_shared<HashStore>();
  const auto backend = conformance::backend_under_test();
  std::vector<std::unique_ptr<RpcContext>> contexts;
  for (int rank = 0; rank < 3; ++rank) {
    contexts.push_back(std::make_unique<RpcContext>());
    contexts.back()->register_function("rank", [rank] { return int64_t{rank}; });
  }
  // A static run of `world` workers named "<run>w<rank>": everyone calls
  // the last rank, then all shut down.
  auto run = [&](const std::string& label, int world) {
    INFO("run " << label << ", world " << world);
    rethrow_first(on_threads(world, [&](int rank) {
      contexts[rank]->init_rpc(fmt::format("{}w{}", label, rank), backend, rank, world,
                               make_options(), store);
    }));
    for (int rank = 0; rank < world; ++rank) {
      CHECK(contexts[rank]->rpc_sync<int64_t>(fmt::format("{}w{}", label, world - 1),
                                              "rank") == world - 1);
    }
    rethrow_first(on_threads(world, [&](int rank) { contexts[rank]->shutdown(true, kGuard); }));
  };
  run("a", 3);
  run("b", 2);  // before: the arrival counter split this run across two generations
  run("c", 3);
  // A run of 3 whose rank 2 never comes: ranks 0 and 1 time out.
  auto errors = on_threads(2, [&](int rank) {
    contexts[rank]->init_rpc(fmt::format("dw{}", rank), backend, rank, 3, make_options(300ms),
                             store);
  });
  for (const auto& error : errors) CHECK(error != nullptr);
  // The next run of 3, its rank 2 first: it must not join the failed run.
  std::exception_ptr late_error;
  std::thread rank2([&] {
    try {
      contexts[2]->init_rpc("ew2", backend, 2, 3, make_options(), store);
    } catch (...) {
      late_error = std::current_exception();
    }
  });
  store->wait({"rpc/gen/4/rank/2"}, kGuard);  // rank 2 has claimed its place
  rethrow_first(on_threads(2, [&](int rank) {
    contexts[rank]->init_rpc(fmt::format("ew{}", rank), backend, rank, 3, make_options(),
                             store);
  }));
  rank2.join();
  if (late_error) std::rethrow_exception(late_error);
  for (int rank = 0; rank < 3; ++rank) {
    CHECK(contexts[rank]->rpc_sync<int64_t>("ew2", "rank") == 2);
  }
  rethrow_first(on_threads(3, [&](int rank) { contexts[rank]->shutdown(true, kGuard); }));
}

TEST_CASE("the process-wide free functions use the global context", "[rpc]") {
  rpc::register_function("triple", [](int64_t x) { return 3 * x; });
  auto options = make_options();  // sets the backend up
  rpc::init_rpc("global0", conformance::conformance_backend().name, 0, 1, options,
                std::make_shared<HashStore>());
  CHECK(rpc::get_worker_info().name == "global0");
  CHECK(rpc::get_worker_infos().size() == 1);
  CHECK(rpc::get_worker_info("global0").id == 0);
  CHECK(rpc::rpc_sync<int64_t>("global0", "triple", int64_t{5}) == 15);
  CHECK(rpc::rpc_async<int64_t>("global0", "triple", int64_t{2}).value() == 6);
  CHECK(rpc::get_metrics().at("switchboard_rpc_calls_sent_total{function=\"triple\"}") == 2);
  CHECK(rpc::get_metrics_snapshot().functions.at("triple").requests_served == 2);
  CHECK_FALSE(rpc::metrics_port().has_value());
  rpc::shutdown();
  CHECK_FALSE(RpcContext::global().initialized());
}

// Every agent keeps its calls in rpc::CallTable, which counts them: the
// same numbers over every backend, with nothing written in the agent.
TEST_CASE("get_metrics counts calls sent, answered and failed, and requests served",
          "[rpc][metrics]") {
  auto gate = std::make_shared<Gate>(kGuard);
  auto cluster = common_cluster(2, gate);
  RpcContext& w0 = (*cluster)[0];
  RpcContext& w1 = (*cluster)[1];
  for (int64_t i = 0; i < 3; ++i) CHECK(w0.rpc_sync<int64_t>("w1", "add", i, int64_t{1}) == i + 1);
  CHECK_THROWS_AS(w0.rpc_sync<int64_t>("w1", "fail", std::string("no")), rpc::RemoteError);
  // Held by the gate: in flight on w0, in progress on w1.
  Future<int64_t> held = w0.rpc_async<int64_t>("w1", "block", int64_t{7});
  REQUIRE(gate->wait_arrived(1));
  const rpc::RpcMetrics m0 = w0.get_metrics_snapshot();
  const rpc::RpcMetrics m1 = w1.get_metrics_snapshot();
  CHECK(m0.worker == "w0");
  const rpc::FunctionMetrics& add = m0.functions.at("add");
  CHECK(add.calls_sent == 3);
  CHECK(add.calls_succeeded == 3);
  CHECK(add.latency.count == 3);
  CHECK(add.latency.quantile(0.99) > 0.0);
  CHECK(add.failures() == 0);
  const rpc::FunctionMetrics& fail = m0.functions.at("fail");
  CHECK(fail.calls_sent == 1);
  CHECK(fail.calls_succeeded == 0);
  CHECK(fail.failures(rpc::FailureKind::kRemoteError) == 1);
  CHECK(m0.functions.at("block").calls_sent == 1);
  CHECK(m0.calls_in_flight == 1);
  CHECK(m1.functions.at("add").requests_served == 3);
  CHECK(m1.functions.at("add").requests_failed == 0);
  CHECK(m1.functions.at("add").calls_sent == 0);
  CHECK(m1.functions.at("fail").requests_served == 1);
  CHECK(m1.functions.at("fail").requests_failed == 1);
  CHECK(m1.requests_in_progress == 1);
  CHECK(m1.pool.busy >= 1);  // the held handler
  const auto flat = w0.get_metrics();
  CHECK(flat.at("switchboard_rpc_calls_sent_total{function=\"add\"}") == 3);
  CHECK(flat.at("switchboard_rpc_calls_failed_total{function=\"fail\",kind=\"remote_error\"}") ==
        1);
  CHECK(flat.at("switchboard_rpc_calls_in_flight") == 1);
  gate->open();
  CHECK(held.value() == 7);
}

TEST_CASE("get_metrics counts a timed-out call as a timeout, without a latency",
          "[rpc][metrics]") {
  auto gate = std::make_shared<Gate>(kGuard);
  auto cluster = common_cluster(2, gate);
  RpcContext& w0 = (*cluster)[0];
  CHECK_THROWS_AS(w0.rpc_sync<int64_t>("w1", "block", with_timeout(100ms), int64_t{1}),
                  TimeoutError);
  const rpc::FunctionMetrics block = w0.get_metrics_snapshot().functions.at("block");
  CHECK(block.calls_sent == 1);
  CHECK(block.failures(rpc::FailureKind::kTimeout) == 1);
  CHECK(block.latency.count == 0);
  CHECK(w0.get_metrics().at(
            "switchboard_rpc_calls_failed_total{function=\"block\",kind=\"timeout\"}") == 1);
  gate->open();
}

TEST_CASE("a raw function's response comes back to send() as it was made, tensors included",
          "[rpc]") {
  auto cluster = std::make_unique<Cluster>(
      2,
      [](int rank, RpcContext& self) {
        register_common(rank, self, std::make_shared<Gate>(kGuard));
        self.register_raw_function("raw_reverse", [](const rpc::Message& request) {
          rpc::Message answer;
          answer.payload.assign(request.payload.rbegin(), request.payload.rend());
          for (const Tensor& t : request.tensors) answer.tensors.push_back(t.clone());
          const rpc::CallContext* call = rpc::current_call();
          const std::string caller = call != nullptr ? call->caller.name : "";
          answer.payload.insert(answer.payload.end(), caller.begin(), caller.end());
          return Future<rpc::Message>::ready(std::move(answer));
        });
        self.register_raw_function("raw_fail", [](const rpc::Message&) -> Future<rpc::Message> {
          throw std::runtime_error("not this one");
        });
      },
      make_options(30s));
  RpcContext& w0 = (*cluster)[0];
  rpc::Message request;
  request.type = rpc::MessageType::kRequest;
  request.function = "raw_reverse";
  request.payload = {1, 2, 3};
  request.tensors = {Tensor::from_vector(std::vector<float>{4, 5, 6})};
  const rpc::Message response = w0.send("w1", request, std::nullopt).value();
  CHECK(response.type == rpc::MessageType::kResponse);
  CHECK(response.payload == std::vector<uint8_t>{3, 2, 1, 'w', '0'});
  REQUIRE(response.tensors.size() == 1);
  CHECK(response.tensors[0].to_vector<float>() == std::vector<float>{4, 5, 6});
  request.function = "raw_fail";
  const rpc::Message failed = w0.send("w1", request, std::nullopt).value();
  REQUIRE(failed.type == rpc::MessageType::kError);
  const rpc::RemoteError error = rpc::decode_remote_error(failed);
  CHECK(error.worker() == "w1");
  CHECK(error.remote_message() == "not this one");
}
