// The LOCAL test backend (tests/rpc/local_agent.h), registered through the
// backend registry and driven through the RpcAgent interface only: workers
// as threads of this process over one HashStore.
//
// Nothing here sleeps hoping for an order: a handler that must still be
// running blocks on a Gate the test opens, and every wait for something
// that must happen is bounded by kGuard so that a hang fails the test.
#include "tests/rpc/local_agent.h"

#include <fmt/format.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "collective/tensor.h"
#include "common/error.h"
#include "rpc/agent.h"
#include "rpc/backend_registry.h"
#include "rpc/future.h"
#include "rpc/message.h"
#include "rpc/remote_error.h"
#include "store/hash_store.h"
#include "tests/util/agent_helpers.h"
#include "tests/util/threads.h"

using namespace switchboard;
using namespace std::chrono_literals;
using rpc::Future;
using rpc::Message;
using rpc::MessageType;
using rpc::Promise;
using rpc::RpcAgent;
using rpc::WorkerInfo;
using switchboard::testing::blocking_handler;
using switchboard::testing::bytes;
using switchboard::testing::echo_handler;
using switchboard::testing::echo_of;
using switchboard::testing::Failure;
using switchboard::testing::Gate;
using switchboard::testing::on_threads;
using switchboard::testing::request;
using switchboard::testing::rethrow_first;
using switchboard::testing::text;

namespace {

// Bounds every wait for something that must happen.
constexpr std::chrono::milliseconds kGuard = 30s;

rpc::BackendType local_backend() {
  return switchboard::testing::register_local_backend();
}

std::shared_ptr<rpc::RpcBackendOptions> test_options(
    std::chrono::milliseconds rpc_timeout = kGuard) {
  return rpc::construct_rpc_backend_options(local_backend(), rpc_timeout, "env://",
                                            {{"num_worker_threads", "4"}});
}

std::unique_ptr<RpcAgent> make_agent(
    std::shared_ptr<Store> store, std::string name, int rank,
    std::optional<int> world_size,
    std::shared_ptr<rpc::RpcBackendOptions> options = test_options()) {
  return rpc::init_backend(
      local_backend(),
      rpc::BackendInit{std::move(store), std::move(name), rank, world_size, options});
}

using Agents = std::vector<std::unique_ptr<RpcAgent>>;

// One agent per name (rank = index), constructed concurrently.
Agents make_agents(const std::vector<std::string>& names,
                   std::shared_ptr<Store> store = std::make_shared<HashStore>()) {
  const int n = static_cast<int>(names.size());
  Agents agents(n);
  rethrow_first(on_threads(
      n, [&](int rank) { agents[rank] = make_agent(store, names[rank], rank, n); }));
  return agents;
}

// tests/util/agent_helpers.h's waits, bounded by this file's kGuard.
Message get(const Future<Message>& f) { return switchboard::testing::get(f, kGuard); }

Failure failure_of(const Future<Message>& f) {
  return switchboard::testing::failure_of(f, kGuard);
}

void join_all(Agents& agents, std::chrono::milliseconds timeout = kGuard) {
  switchboard::testing::join_all(agents, timeout);
}

// The message of what `body` throws as E (fails the test otherwise).
template <typename E>
std::string what_thrown(const std::function<void()>& body) {
  try {
    body();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("threw the wrong exception: " << e.what());
  }
  FAIL("did not throw");
  return "";
}

}  // namespace

TEST_CASE("LOCAL registers once; a second registration returns the same BackendType",
          "[local_agent][registry]") {
  const rpc::BackendType first = switchboard::testing::register_local_backend();
  const rpc::BackendType second = switchboard::testing::register_local_backend();
  CHECK(first == second);
  CHECK(first.name() == "LOCAL");
  CHECK(rpc::backend_registered("local"));
  CHECK(rpc::backend_type("local") == first);
  // A user registering the name again is told it is taken.
  CHECK_THROWS_AS(
      rpc::register_backend(
          "LOCAL",
          [](std::chrono::milliseconds, const std::string&, const rpc::Extras&) {
            return std::make_shared<rpc::RpcBackendOptions>();
          },
          [](const rpc::BackendInit&) { return std::unique_ptr<RpcAgent>(); }),
      RegistryError);
}

TEST_CASE("LOCAL options: common fields, num_worker_threads, unknown extras refused",
          "[local_agent][registry]") {
  auto options = rpc::construct_rpc_backend_options(local_backend(), 1234ms, "tcp://x:1",
                                                    {{"num_worker_threads", "3"}});
  REQUIRE(dynamic_cast<switchboard::testing::LocalBackendOptions*>(options.get()));
  CHECK(options->rpc_timeout == 1234ms);
  CHECK(options->init_method == "tcp://x:1");
  CHECK(options->num_worker_threads == 3);
  CHECK(rpc::construct_rpc_backend_options(local_backend())->num_worker_threads ==
        rpc::kDefaultNumWorkerThreads);

  const std::string unknown = what_thrown<std::invalid_argument>([] {
    (void)rpc::construct_rpc_backend_options(local_backend(), 1s, "env://",
                                             {{"num_worker_thread", "3"}});
  });
  CHECK_THAT(unknown, Catch::Contains("unknown option \"num_worker_thread\""));
  CHECK_THAT(unknown, Catch::Contains("num_worker_threads"));  // the known ones

  for (std::string bad : {"0", "-2", "4097", "many"}) {
    INFO("num_worker_threads=" << bad);
    CHECK_THROWS_WITH(rpc::construct_rpc_backend_options(local_backend(), 1s, "env://",
                                                         {{"num_worker_threads", bad}}),
                      Catch::Contains("num_worker_threads"));
  }
}

TEST_CASE("LOCAL refuses dynamic groups and bad arguments", "[local_agent]") {
  auto store = std::make_shared<HashStore>();
  CHECK_THROWS_WITH(make_agent(store, "w0", 0, std::nullopt),
                    Catch::Contains("LOCAL backend: dynamic groups are not supported"));
  CHECK_THROWS_AS(make_agent(store, "w0", 0, std::nullopt), std::invalid_argument);
  CHECK_THROWS_AS(make_agent(nullptr, "w0", 0, 1), std::invalid_argument);
  CHECK_THROWS_AS(make_agent(store, "w0", 1, 1), std::invalid_argument);
  CHECK_THROWS_AS(make_agent(store, "w0", 0, 0), std::invalid_argument);
  CHECK_THROWS_WITH(make_agent(store, "bad name", 0, 1),
                    Catch::Contains("invalid rpc worker name \"bad name\""));
}

TEST_CASE("echo between two workers: the callee and the caller get copies of tensors",
          "[local_agent]") {
  Agents agents = make_agents({"w0", "w1"});
  // What the handler saw: the address of the request's tensor, and of the
  // tensor it answered with.
  Promise<std::pair<const void*, const void*>> seen;
  agents[0]->start(echo_handler());
  agents[1]->start([seen](Message request, const WorkerInfo& from) {
    Tensor& t = request.tensors.at(0);
    const void* received = t.data();
    t.data_as<int32_t>()[0] = 99;  // the caller's tensor must not change
    Message response = echo_of(request);
    response.payload = bytes(text(request.payload) + " from " + from.name);
    seen.set_value({received, response.tensors[0].data()});
    return Future<Message>::ready(response);
  });
  Tensor sent = Tensor::from_vector(std::vector<int32_t>{1, 2, 3});
  Message got = get(
      agents[0]->send(agents[0]->worker("w1"), request("echo", "hi", {sent}), kGuard));
  REQUIRE(seen.get_future().wait_for(kGuard));
  const auto [received, answered] = seen.get_future().value();
  CHECK(got.type == MessageType::kResponse);
  CHECK(got.id != 0);
  CHECK(got.function.empty());  // responses name no function
  CHECK(text(got.payload) == "hi from w0");
  CHECK(sent.to_vector<int32_t>() == std::vector<int32_t>{1, 2, 3});
  CHECK(received != sent.data());
  REQUIRE(got.tensors.size() == 1);
  CHECK(got.tensors[0].to_vector<int32_t>() == std::vector<int32_t>{99, 2, 3});
  CHECK(got.tensors[0].data() != answered);
  join_all(agents);
}

TEST_CASE("echo between three workers, every pair, every dtype; strided ones travel",
          "[local_agent]") {
  Agents agents = make_agents({"w0", "w1", "w2"});
  for (auto& agent : agents) agent->start(echo_handler());
  struct Call {
    int src, dst;
    Message sent;
    Future<Message> future;
  };
  std::vector<Call> calls;
  for (int src = 0; src < 3; ++src) {
    for (int dst = 0; dst < 3; ++dst) {
      std::vector<Tensor> tensors;
      for (DType dtype : kAllDTypes) tensors.push_back(Tensor::zeros({3, 2}, dtype));
      tensors.push_back(Tensor::zeros({0}, DType::kFloat32));
      tensors.push_back(Tensor::from_vector(std::vector<int64_t>{src, dst}));
      Message m = request(fmt::format("fn-{}-{}", src, dst),
                          fmt::format("payload from {} to {}", src, dst), tensors);
      calls.push_back(
          Call{src, dst, m, agents[src]->send(agents[src]->worker(dst), m, kGuard)});
    }
  }
  for (auto& call : calls) {
    INFO("from w" << call.src << " to w" << call.dst);
    Message got = get(call.future);
    CHECK(got.function.empty());  // responses name no function
    CHECK(text(got.payload) == text(call.sent.payload));
    REQUIRE(got.tensors.size() == call.sent.tensors.size());
    for (size_t i = 0; i < got.tensors.size(); ++i) {
      CHECK(got.tensors[i].dtype() == call.sent.tensors[i].dtype());
      CHECK(got.tensors[i].equal(call.sent.tensors[i]));
    }
  }
  auto buffer = std::make_shared<std::vector<float>>(std::vector<float>{0, 1, 2, 3});
  Tensor transposed = Tensor::from_blob(buffer->data(), {2, 2}, DType::kFloat32,
                                        Device::cpu(), buffer, {1, 2});
  REQUIRE_FALSE(transposed.is_contiguous());
  Message got = get(
      agents[2]->send(agents[2]->worker("w0"), request("t", "", {transposed}), kGuard));
  REQUIRE(got.tensors.size() == 1);
  CHECK(got.tensors[0].is_contiguous());
  CHECK(got.tensors[0].to_vector<float>() == std::vector<float>{0, 2, 1, 3});
  join_all(agents);
}

TEST_CASE("4 threads x 100 concurrent sends each way are all answered with their own ids",
          "[local_agent]") {
  Agents agents = make_agents({"a", "b"});
  for (auto& agent : agents) agent->start(echo_handler());
  constexpr int kThreads = 4;
  constexpr int kPerThread = 100;
  // failures[t]: what thread t saw go wrong (Catch2 is not thread-safe).
  std::vector<std::vector<std::string>> failures(2 * kThreads);
  std::vector<std::set<uint64_t>> ids(2 * kThreads);
  rethrow_first(on_threads(2 * kThreads, [&](int t) {
    RpcAgent& agent = *agents[t % 2];
    const WorkerInfo to = agent.worker(1 - t % 2);
    std::vector<Future<Message>> futures;
    for (int i = 0; i < kPerThread; ++i) {
      Tensor tag = Tensor::from_vector(std::vector<int64_t>{t, i});
      futures.push_back(
          agent.send(to, request("echo", fmt::format("{}:{}", t, i), {tag}), kGuard));
    }
    for (int i = 0; i < kPerThread; ++i) {
      if (!futures[i].wait_for(kGuard) || futures[i].has_error()) {
        failures[t].push_back(fmt::format("call {} failed or never completed", i));
        continue;
      }
      const Message& got = futures[i].value();
      if (text(got.payload) != fmt::format("{}:{}", t, i) || got.tensors.size() != 1 ||
          got.tensors[0].to_vector<int64_t>() != std::vector<int64_t>{t, i}) {
        failures[t].push_back(fmt::format("call {} got the answer to another call", i));
      }
      ids[t].insert(got.id);
    }
  }));
  for (int t = 0; t < 2 * kThreads; ++t) {
    for (const auto& failure : failures[t]) FAIL_CHECK("thread " << t << ": " << failure);
  }
  for (int side = 0; side < 2; ++side) {
    std::set<uint64_t> all;
    for (int t = side; t < 2 * kThreads; t += 2) all.insert(ids[t].begin(), ids[t].end());
    CHECK(all.size() == size_t{kThreads * kPerThread});
  }
  join_all(agents);
}

TEST_CASE("a send to self is served through the pool, on copies of the tensors",
          "[local_agent]") {
  auto store = std::make_shared<HashStore>();
  auto agent = make_agent(store, "solo", 0, 1);
  std::atomic<bool> on_pool{false};
  agent->start([&](Message request, const WorkerInfo& from) {
    on_pool = rpc::ThreadPool::current() == agent->pool().get() && from.name == "solo";
    return Future<Message>::ready(echo_of(request));
  });
  Tensor t = Tensor::from_vector(std::vector<double>{1.5, 2.5});
  Message got = get(agent->send(agent->self(), request("echo", "hi", {t}), kGuard));
  CHECK(on_pool);
  CHECK(text(got.payload) == "hi");
  REQUIRE(got.tensors.size() == 1);
  CHECK(got.tensors[0].equal(t));
  CHECK(got.tensors[0].data() != t.data());
  CHECK(agent->workers() == std::vector<WorkerInfo>{{"solo", 0}});
  agent->join(kGuard);
}

TEST_CASE("unknown workers are NotFoundError naming them", "[local_agent]") {
  Agents agents = make_agents({"w0", "w1"});
  for (auto& agent : agents) agent->start(echo_handler());
  RpcAgent& a = *agents[0];
  CHECK(a.workers() == std::vector<WorkerInfo>{{"w0", 0}, {"w1", 1}});
  CHECK(a.worker("w1") == WorkerInfo{"w1", 1});
  CHECK(a.worker(1) == WorkerInfo{"w1", 1});
  CHECK_THROWS_AS(a.worker("nobody"), NotFoundError);
  CHECK_THROWS_WITH(a.worker("nobody"), Catch::Contains("\"nobody\""));
  CHECK_THROWS_AS(a.worker(7), NotFoundError);
  CHECK_THROWS_WITH(a.worker(7), Catch::Contains("7"));
  CHECK_THROWS_AS(a.worker(-1), NotFoundError);
  Failure failure = failure_of(a.send(WorkerInfo{"nobody", 1}, request("f", ""), kGuard));
  CHECK(failure.kind == "NotFoundError");
  CHECK_THAT(failure.message, Catch::Contains("\"nobody\""));
  join_all(agents);
}

TEST_CASE("send() misuse fails the future with invalid_argument; send never throws",
          "[local_agent]") {
  Agents agents = make_agents({"w0", "w1"});
  RpcAgent& a = *agents[0];
  Failure before = failure_of(a.send(a.worker("w1"), request("f", ""), kGuard));
  CHECK(before.kind == "invalid_argument");
  CHECK_THAT(before.message, Catch::Contains("before start()"));
  a.start(echo_handler());
  agents[1]->start(echo_handler());
  CHECK_THROWS_AS(a.start(echo_handler()), std::invalid_argument);
  Message response = request("f", "");
  response.type = MessageType::kResponse;
  CHECK(failure_of(a.send(a.worker("w1"), response, kGuard)).kind == "invalid_argument");
  CHECK(failure_of(a.send(a.worker("w1"), request("f", ""), -1ms)).kind ==
        "invalid_argument");
  Failure undefined =
      failure_of(a.send(a.worker("w1"), request("f", "", {Tensor()}), 0ms));
  CHECK(undefined.kind == "invalid_argument");
  CHECK_THAT(undefined.message, Catch::Contains("tensor 0 is undefined"));
  join_all(agents);
}

TEST_CASE("a request that reaches a worker before its start() waits for it",
          "[local_agent]") {
  Agents agents = make_agents({"w0", "w1"});
  agents[0]->start(echo_handler());
  Future<Message> f =
      agents[0]->send(agents[0]->worker("w1"), request("early", "e"), kGuard);
  CHECK_FALSE(f.wait_for(100ms));  // w1 has no handler yet: it cannot be done
  agents[1]->start(echo_handler());
  CHECK(text(get(f).payload) == "e");
  join_all(agents);
}

TEST_CASE("a handler's future completed later by another thread answers the call",
          "[local_agent]") {
  Agents agents = make_agents({"w0", "w1"});
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<Promise<Message>, Message>> parked;  // GUARDED_BY(mu)
  agents[0]->start(echo_handler());
  agents[1]->start([&](Message request, const WorkerInfo&) {
    Promise<Message> promise;
    std::lock_guard lock(mu);
    parked.emplace_back(promise, echo_of(request));
    cv.notify_all();
    return promise.get_future();
  });
  Future<Message> f =
      agents[0]->send(agents[0]->worker("w1"), request("later", "x"), kGuard);
  std::pair<Promise<Message>, Message> entry;
  {
    std::unique_lock lock(mu);
    REQUIRE(cv.wait_for(lock, kGuard, [&] { return !parked.empty(); }));
    entry = parked.front();
    parked.pop_front();
  }
  CHECK_FALSE(f.done());  // the handler returned, its future has not completed
  std::thread completer([&] { entry.first.set_value(entry.second); });
  Message got = get(f);
  completer.join();
  CHECK(text(got.payload) == "x");
  join_all(agents);
}

TEST_CASE("a handler that throws or fails its future answers kError naming the worker",
          "[local_agent]") {
  Agents agents = make_agents({"w0", "w1"});
  agents[0]->start(echo_handler());
  agents[1]->start([](Message request, const WorkerInfo&) -> Future<Message> {
    if (request.function == "throws") throw std::runtime_error("boom in the handler");
    if (request.function == "invalid") return Future<Message>();
    return Future<Message>::failed(
        std::make_exception_ptr(NotFoundError("boom in the future")));
  });
  struct Case {
    std::string function, type, message;
  };
  for (const Case& c : {Case{"throws", "std::runtime_error", "boom in the handler"},
                        Case{"fails", "switchboard::NotFoundError", "boom in the future"},
                        Case{"invalid", "switchboard::Error", "invalid future"}}) {
    INFO(c.function);
    Message got =
        get(agents[0]->send(agents[0]->worker("w1"), request(c.function, ""), kGuard));
    REQUIRE(got.type == MessageType::kError);
    CHECK(got.tensors.empty());
    rpc::RemoteError error = rpc::decode_remote_error(got);
    CHECK(error.worker() == "w1");
    CHECK(error.type_name() == c.type);
    CHECK_THAT(error.remote_message(), Catch::Contains(c.message));
  }
  join_all(agents);
}

TEST_CASE(
    "a call times out naming worker, function and timeout; the late answer is dropped",
    "[local_agent][timeout]") {
  Agents agents = make_agents({"w0", "w1"});
  auto latch = std::make_shared<Gate>(kGuard);
  agents[0]->start(echo_handler());
  agents[1]->start(blocking_handler(latch));
  const auto start = std::chrono::steady_clock::now();
  Future<Message> f =
      agents[0]->send(agents[0]->worker("w1"), request("block", ""), 200ms);
  Failure failure = failure_of(f);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  CHECK(failure.kind == "TimeoutError");
  CHECK(failure.code == ErrorCode::kDeadlineExceeded);
  CHECK_THAT(failure.message,
             Catch::Contains("rpc to \"w1\" function \"block\": timed out after 200 ms"));
  CHECK(elapsed >= 200ms);
  CHECK(latch->wait_arrived());
  latch->open();
  // w1's join drains its handler, whose late answer was dropped by w0.
  join_all(agents);
  Message got =
      get(agents[0]->send(agents[0]->worker("w1"), request("echo", "after"), kGuard));
  CHECK(text(got.payload) == "after");
  join_all(agents);
}

TEST_CASE("a timeout of 0 never expires", "[local_agent][timeout]") {
  Agents agents = make_agents({"w0", "w1"});
  auto latch = std::make_shared<Gate>(kGuard);
  agents[0]->start(echo_handler());
  agents[1]->start(blocking_handler(latch));
  Future<Message> f =
      agents[0]->send(agents[0]->worker("w1"), request("block", "z"), 0ms);
  REQUIRE(latch->wait_arrived());
  CHECK_FALSE(f.wait_for(300ms));
  latch->open();
  CHECK(text(get(f).payload) == "z");
  join_all(agents);
}

TEST_CASE("join waits for calls in flight and requests being handled",
          "[local_agent][join]") {
  Agents agents = make_agents({"w0", "w1"});
  auto latch = std::make_shared<Gate>(kGuard);
  agents[0]->start(echo_handler());
  agents[1]->start(blocking_handler(latch));
  Future<Message> f =
      agents[0]->send(agents[0]->worker("w1"), request("block", "j"), 0ms);
  REQUIRE(latch->wait_arrived());
  CHECK_THAT(what_thrown<TimeoutError>([&] { agents[0]->join(200ms); }),
             Catch::Contains("join on rpc worker \"w0\"") &&
                 Catch::Contains("1 calls in flight"));
  CHECK_THAT(what_thrown<TimeoutError>([&] { agents[1]->join(200ms); }),
             Catch::Contains("1 requests being handled"));
  std::atomic<bool> done_when_joined{false};
  std::thread joiner0([&] {
    agents[0]->join(kGuard);
    done_when_joined = f.done();
  });
  std::thread joiner1([&] { agents[1]->join(kGuard); });
  latch->open();
  joiner0.join();
  joiner1.join();
  CHECK(done_when_joined);
  CHECK(text(get(f).payload) == "j");
  join_all(agents);  // and again, with no traffic
}

TEST_CASE("join times out naming the workers that did not arrive",
          "[local_agent][join][timeout]") {
  Agents agents = make_agents({"w0", "w1", "w2"});
  for (auto& agent : agents) agent->start(echo_handler());
  std::vector<std::exception_ptr> errors =
      on_threads(2, [&](int rank) { agents[rank]->join(300ms); });
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    CHECK_THAT(what_thrown<TimeoutError>([&] { rethrow_first({errors[rank]}); }),
               Catch::Contains("waiting for workers [\"w2\"] to join") &&
                   Catch::Contains("300 ms"));
  }
}

TEST_CASE("shutdown fails a pending call with kCancelled; it is idempotent",
          "[local_agent][shutdown]") {
  Agents agents = make_agents({"w0", "w1"});
  auto latch = std::make_shared<Gate>(kGuard);
  agents[0]->start(echo_handler());
  agents[1]->start(blocking_handler(latch));
  Future<Message> f = agents[0]->send(agents[0]->worker("w1"), request("block", ""), 0ms);
  REQUIRE(latch->wait_arrived());
  agents[0]->shutdown();
  Failure failure = failure_of(f);
  CHECK(failure.kind == "Error");
  CHECK(failure.code == ErrorCode::kCancelled);
  CHECK_THAT(failure.message, Catch::Contains("function \"block\""));
  CHECK_THAT(failure.message, Catch::Contains("rpc agent \"w0\" shut down"));
  agents[0]->shutdown();
  Failure after =
      failure_of(agents[0]->send(agents[0]->worker("w1"), request("f", ""), 0ms));
  CHECK(after.code == ErrorCode::kCancelled);
  CHECK_THROWS_AS(agents[0]->join(1s), Error);
  latch->open();  // w1's handler returns; its answer goes nowhere
  agents[1]->shutdown();
  agents[1]->shutdown();
  agents.clear();  // destructors after shutdown
}

TEST_CASE("calls to a worker that shut down fail with ConnectionError; others go on",
          "[local_agent][shutdown]") {
  Agents agents = make_agents({"w0", "w1", "w2"});
  auto latch = std::make_shared<Gate>(kGuard);
  agents[0]->start(echo_handler());
  agents[1]->start(echo_handler());
  agents[2]->start(blocking_handler(latch));
  Future<Message> f = agents[0]->send(agents[0]->worker("w2"), request("block", ""), 0ms);
  REQUIRE(latch->wait_arrived());
  // w2 leaves at once; its pool then waits for the blocked handler.
  std::thread stopper([&] { agents[2]->shutdown(); });
  Failure failure = failure_of(f);
  latch->open();
  stopper.join();
  CHECK(failure.kind == "ConnectionError");
  CHECK(failure.code == ErrorCode::kUnavailable);
  CHECK_THAT(failure.message, Catch::Contains("rpc to \"w2\" function \"block\""));
  CHECK_THAT(failure.message, Catch::Contains("connection to worker \"w2\" lost"));
  for (int from : {0, 1}) {
    Failure next = failure_of(
        agents[from]->send(agents[from]->worker("w2"), request("f", ""), kGuard));
    CHECK(next.kind == "ConnectionError");
    CHECK_THAT(next.message, Catch::Contains("\"w2\""));
  }
  Message got =
      get(agents[0]->send(agents[0]->worker("w1"), request("f", "still"), kGuard));
  CHECK(text(got.payload) == "still");
  got = get(agents[1]->send(agents[1]->worker("w0"), request("f", "here"), kGuard));
  CHECK(text(got.payload) == "here");
  // A join cannot complete without w2: it says so instead of hanging.
  std::vector<std::exception_ptr> errors =
      on_threads(2, [&](int rank) { agents[rank]->join(0ms); });
  for (int rank = 0; rank < 2; ++rank) {
    CHECK_THAT(what_thrown<ConnectionError>([&] { rethrow_first({errors[rank]}); }),
               Catch::Contains("[\"w2\"] shut down without joining"));
  }
}

TEST_CASE("duplicate worker names fail on every worker, naming the name and its ranks",
          "[local_agent][names]") {
  auto store = std::make_shared<HashStore>();
  const std::vector<std::string> names = {"a", "b", "a"};
  Agents agents(3);
  auto errors = on_threads(
      3, [&](int rank) { agents[rank] = make_agent(store, names[rank], rank, 3); });
  for (int rank = 0; rank < 3; ++rank) {
    INFO("rank " << rank);
    CHECK_THAT(what_thrown<std::invalid_argument>([&] { rethrow_first({errors[rank]}); }),
               Catch::Contains("\"a\" is used by ranks 0 and 2"));
  }
}

TEST_CASE("construction times out naming the ranks that never came",
          "[local_agent][timeout]") {
  auto store = std::make_shared<HashStore>();
  const std::string message = what_thrown<TimeoutError>(
      [&] { (void)make_agent(store, "w0", 0, 3, test_options(300ms)); });
  CHECK_THAT(message, Catch::Contains("300 ms"));
  CHECK_THAT(message, Catch::Contains("ranks [1, 2]"));
}

TEST_CASE("two groups with the same names over different stores stay apart",
          "[local_agent]") {
  Agents first = make_agents({"w0", "w1"});
  Agents second = make_agents({"w0", "w1"});
  for (Agents* group : {&first, &second}) {
    const std::string tag = group == &first ? "first" : "second";
    (*group)[0]->start(echo_handler());
    (*group)[1]->start([tag](Message request, const WorkerInfo&) {
      Message response = echo_of(request);
      response.payload = bytes(tag);
      return Future<Message>::ready(response);
    });
  }
  CHECK(text(get(first[0]->send(first[0]->worker("w1"), request("f", ""), kGuard))
                 .payload) == "first");
  CHECK(text(get(second[0]->send(second[0]->worker("w1"), request("f", ""), kGuard))
                 .payload) == "second");
  join_all(first);
  join_all(second);
}

TEST_CASE("a second worker claiming a taken rank is refused; the owner keeps working",
          "[local_agent][names]") {
  auto store = std::make_shared<HashStore>();
  auto owner = make_agent(store, "owner", 0, 1);
  owner->start(echo_handler());
  CHECK_THAT(what_thrown<std::invalid_argument>(
                 [&] { (void)make_agent(store, "intruder", 0, 1); }),
             Catch::Contains("both claim rank 0"));
  Message got = get(owner->send(owner->self(), request("f", "mine"), kGuard));
  CHECK(text(got.payload) == "mine");
  owner->join(kGuard);
}

TEST_CASE("a store whose group is gone is refused, naming the fabric", "[local_agent]") {
  auto store = std::make_shared<HashStore>();
  make_agent(store, "w0", 0, 1).reset();
  try {
    (void)make_agent(store, "w0", 0, 1);
    FAIL("joined a group that no longer exists");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kFailedPrecondition);
    CHECK_THAT(e.what(), Catch::Contains("no longer exists"));
  }
}
