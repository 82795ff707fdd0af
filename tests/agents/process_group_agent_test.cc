// ProcessGroupAgent: ranks as threads of this process over one HashStore,
// Gloo on 127.0.0.1.
//
// Nothing here sleeps hoping for an order: a handler that must still be
// running blocks on a Gate the test opens, and every wait for something
// that must happen is bounded by kGuard so that a hang fails the test.
#include "agents/process_group_agent.h"

#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "collective/gloo_process_group.h"
#include "collective/tensor.h"
#include "common/error.h"
#include "rpc/future.h"
#include "rpc/message.h"
#include "rpc/remote_error.h"
#include "store/hash_store.h"
#include "store/prefix_store.h"
#include "tests/util/agent_helpers.h"
#include "tests/util/threads.h"

using namespace switchboard;
using namespace std::chrono_literals;
using agents::ProcessGroupAgent;
using agents::ProcessGroupAgentOptions;
using rpc::Future;
using rpc::Message;
using rpc::MessageType;
using rpc::Promise;
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
constexpr std::chrono::milliseconds kGuard = 60s;

ProcessGroupAgentOptions test_options() {
  ProcessGroupAgentOptions options;
  options.hostname = "127.0.0.1";
  options.rpc_timeout = 30s;
  options.num_worker_threads = 4;
  return options;
}

using Agents = std::vector<std::unique_ptr<ProcessGroupAgent>>;

// One agent per name (rank = index), constructed concurrently.
Agents make_agents(const std::vector<std::string>& names,
                   std::shared_ptr<Store> store = std::make_shared<HashStore>()) {
  const int n = static_cast<int>(names.size());
  Agents agents(n);
  rethrow_first(on_threads(n, [&](int rank) {
    agents[rank] =
        std::make_unique<ProcessGroupAgent>(store, names[rank], rank, n, test_options());
  }));
  return agents;
}

// A tensor whose bytes follow a pattern seeded by `seed` (bool: 0 or 1).
Tensor patterned(const Tensor::Shape& shape, DType dtype, int seed) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* p = static_cast<uint8_t*>(t.data());
  for (size_t i = 0; i < t.nbytes(); ++i) {
    p[i] = static_cast<uint8_t>(dtype == DType::kBool ? (i + seed) % 2 : i * 131 + seed);
  }
  return t;
}

// Same dtype, shape and bytes (a byte compare: NaN patterns are fine).
bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.dtype() == b.dtype() && a.shape() == b.shape() &&
         a.is_contiguous() && b.is_contiguous() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

// tests/util/agent_helpers.h's waits, bounded by this file's kGuard.
Message get(const Future<Message>& f) { return switchboard::testing::get(f, kGuard); }

Failure failure_of(const Future<Message>& f) {
  return switchboard::testing::failure_of(f, kGuard);
}

void join_all(Agents& agents, std::chrono::milliseconds timeout = kGuard) {
  switchboard::testing::join_all(agents, timeout);
}

}  // namespace

TEST_CASE("echo between three workers carries function, payload and every dtype intact",
          "[agents][pg_agent]") {
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
      int seed = src * 10 + dst;
      for (DType dtype : kAllDTypes) tensors.push_back(patterned({3, 2}, dtype, seed++));
      tensors.push_back(patterned({0}, DType::kFloat32, 0));
      tensors.push_back(patterned({2, 0, 3}, DType::kInt64, 0));
      tensors.push_back(patterned({}, DType::kFloat64, seed));  // 0-dim: one element
      if (src == 0 && dst != 0) {
        tensors.push_back(patterned({4 * 1024 * 1024}, DType::kFloat32, seed));  // 16 MiB
      }
      Message m = request(fmt::format("fn-{}-{}", src, dst),
                          fmt::format("payload from {} to {}", src, dst), tensors);
      Future<Message> f = agents[src]->send(agents[src]->worker(dst), m, kGuard);
      calls.push_back(Call{src, dst, m, f});
    }
  }
  std::set<uint64_t> ids_at_src0;
  for (auto& call : calls) {
    INFO("from w" << call.src << " to w" << call.dst);
    Message got = get(call.future);
    CHECK(got.type == MessageType::kResponse);
    CHECK(got.id != 0);
    if (call.src == 0) CHECK(ids_at_src0.insert(got.id).second);
    CHECK(got.function.empty());  // responses name no function
    CHECK(text(got.payload) == text(call.sent.payload));
    REQUIRE(got.tensors.size() == call.sent.tensors.size());
    for (size_t i = 0; i < got.tensors.size(); ++i) {
      INFO("tensor " << i << ": sent " << call.sent.tensors[i].describe() << ", got "
                     << got.tensors[i].describe());
      CHECK(same_tensor(got.tensors[i], call.sent.tensors[i]));
    }
  }
  join_all(agents);
}

TEST_CASE("a message with more tensors than the agent posts at once arrives in order",
          "[agents][pg_agent]") {
  Agents agents = make_agents({"w0", "w1"});
  for (auto& agent : agents) agent->start(echo_handler());
  std::vector<Tensor> tensors;
  for (int i = 0; i < 50; ++i) {
    // Every third one is empty: those send nothing and must not shift the rest.
    tensors.push_back(patterned({i % 3 == 0 ? 0 : i}, kAllDTypes[i % 9], i));
  }
  Message got =
      get(agents[0]->send(agents[0]->worker("w1"), request("many", "", tensors), kGuard));
  REQUIRE(got.tensors.size() == tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    INFO("tensor " << i);
    CHECK(same_tensor(got.tensors[i], tensors[i]));
  }
  join_all(agents);
}

TEST_CASE("4 threads x 200 concurrent sends each way are all answered with their own ids",
          "[agents][pg_agent]") {
  Agents agents = make_agents({"a", "b"});
  for (auto& agent : agents) agent->start(echo_handler());
  constexpr int kThreads = 4;
  constexpr int kPerThread = 200;
  // failures[t]: what thread t saw go wrong (Catch2 is not thread-safe).
  std::vector<std::vector<std::string>> failures(2 * kThreads);
  std::vector<std::set<uint64_t>> ids(2 * kThreads);
  rethrow_first(on_threads(2 * kThreads, [&](int t) {
    ProcessGroupAgent& agent = *agents[t % 2];
    const WorkerInfo to = agent.worker(1 - t % 2);
    std::vector<Future<Message>> futures;
    for (int i = 0; i < kPerThread; ++i) {
      Tensor tag = Tensor::from_vector(std::vector<int64_t>{t, i});
      futures.push_back(
          agent.send(to, request("echo", fmt::format("{}:{}", t, i), {tag}), kGuard));
    }
    for (int i = 0; i < kPerThread; ++i) {
      if (!futures[i].wait_for(kGuard)) {
        failures[t].push_back(fmt::format("call {} never completed", i));
        continue;
      }
      if (futures[i].has_error()) {
        failures[t].push_back(fmt::format("call {} failed", i));
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
  // Ids are unique per sending agent.
  for (int side = 0; side < 2; ++side) {
    std::set<uint64_t> all;
    for (int t = side; t < 2 * kThreads; t += 2) all.insert(ids[t].begin(), ids[t].end());
    CHECK(all.size() == size_t{kThreads * kPerThread});
  }
  join_all(agents);
}

TEST_CASE("a send to self is served through the pool, on copies of the tensors",
          "[agents][pg_agent]") {
  auto store = std::make_shared<HashStore>();
  ProcessGroupAgent agent(store, "solo", 0, 1, test_options());
  agent.start(echo_handler());
  Tensor t = patterned({5}, DType::kInt32, 3);
  Message got = get(agent.send(agent.self(), request("echo", "hi", {t}), kGuard));
  CHECK(got.type == MessageType::kResponse);
  CHECK(text(got.payload) == "hi");
  REQUIRE(got.tensors.size() == 1);
  CHECK(same_tensor(got.tensors[0], t));
  CHECK(got.tensors[0].data() != t.data());
  CHECK(agent.workers() == std::vector<WorkerInfo>{{"solo", 0}});
  agent.join(kGuard);
}

TEST_CASE("a handler's future completed later by another thread answers the call",
          "[agents][pg_agent]") {
  Agents agents = make_agents({"w0", "w1"});
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<Promise<Message>, Message>> parked;  // GUARDED_BY(mu)
  agents[0]->start(echo_handler());
  agents[1]->start([&](Message request, const WorkerInfo& from) {
    Promise<Message> promise;
    std::lock_guard lock(mu);
    Message response = echo_of(request);
    response.payload = bytes(text(request.payload) + " from " + from.name);
    parked.emplace_back(promise, response);
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
  CHECK(text(got.payload) == "x from w0");
  join_all(agents);
}

TEST_CASE("a handler that throws or fails its future answers kError naming the worker",
          "[agents][pg_agent]") {
  Agents agents = make_agents({"w0", "w1"});
  agents[0]->start(echo_handler());
  agents[1]->start([](Message request, const WorkerInfo&) -> Future<Message> {
    if (request.function == "throws") throw std::runtime_error("boom in the handler");
    return Future<Message>::failed(
        std::make_exception_ptr(std::runtime_error("boom in the future")));
  });
  for (std::string fn : {"throws", "fails"}) {
    INFO(fn);
    Message got = get(agents[0]->send(agents[0]->worker("w1"), request(fn, ""), kGuard));
    REQUIRE(got.type == MessageType::kError);
    rpc::RemoteError error = rpc::decode_remote_error(got);
    CHECK(error.worker() == "w1");
    CHECK_THAT(error.remote_message(), Catch::Contains("boom in the"));
  }
  join_all(agents);
}

TEST_CASE(
    "a call times out naming worker, function and timeout; the late answer is dropped",
    "[agents][pg_agent][timeout]") {
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
  CHECK_THAT(failure.message,
             Catch::Contains("rpc to \"w1\" function \"block\": timed out after 200 ms"));
  CHECK(elapsed >= 200ms);
  CHECK(latch->wait_arrived());
  latch->open();
  // w1 enqueues the late response before its join() drains, so by the time
  // w0's next call is answered, w0 has received (and dropped) it.
  join_all(agents);
  Message got =
      get(agents[0]->send(agents[0]->worker("w1"), request("echo", "after"), kGuard));
  CHECK(text(got.payload) == "after");
  join_all(agents);
}

TEST_CASE("a timeout of 0 never expires", "[agents][pg_agent][timeout]") {
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

TEST_CASE("duplicate worker names fail on every worker, naming the name and its ranks",
          "[agents][pg_agent][names]") {
  auto store = std::make_shared<HashStore>();
  const std::vector<std::string> names = {"a", "b", "a"};
  std::vector<std::unique_ptr<ProcessGroupAgent>> agents(3);
  auto errors = on_threads(3, [&](int rank) {
    agents[rank] =
        std::make_unique<ProcessGroupAgent>(store, names[rank], rank, 3, test_options());
  });
  for (int rank = 0; rank < 3; ++rank) {
    INFO("rank " << rank);
    REQUIRE(errors[rank] != nullptr);
    try {
      std::rethrow_exception(errors[rank]);
    } catch (const std::invalid_argument& e) {
      CHECK_THAT(e.what(), Catch::Contains("\"a\" is used by ranks 0 and 2"));
    } catch (const std::exception& e) {
      FAIL("wrong exception: " << e.what());
    }
  }
}

TEST_CASE("invalid worker names are refused, naming the name",
          "[agents][pg_agent][names]") {
  const std::string name = GENERATE(as<std::string>{}, "", "bad name", "dot.name",
                                    "slash/name", std::string(129, 'x'));
  INFO("name \"" << name << "\"");
  auto store = std::make_shared<HashStore>();
  try {
    ProcessGroupAgent agent(store, name, 0, 1, test_options());
    FAIL("accepted");
  } catch (const std::invalid_argument& e) {
    CHECK_THAT(e.what(),
               Catch::Contains(fmt::format("invalid rpc worker name \"{}\"", name)));
  }
}

TEST_CASE("valid worker names of letters, digits, '_', '-' and ':' are accepted",
          "[agents][pg_agent][names]") {
  const std::string name =
      GENERATE(as<std::string>{}, "trainer:0", "ps-1_A", std::string(128, 'x'));
  auto store = std::make_shared<HashStore>();
  ProcessGroupAgent agent(store, name, 0, 1, test_options());
  CHECK(agent.self() == WorkerInfo{name, 0});
  CHECK(agent.worker(name) == WorkerInfo{name, 0});
}

TEST_CASE("bad constructor arguments are refused", "[agents][pg_agent]") {
  auto store = std::make_shared<HashStore>();
  CHECK_THROWS_AS(ProcessGroupAgent(nullptr, "w", 0, 1, test_options()),
                  std::invalid_argument);
  CHECK_THROWS_AS(ProcessGroupAgent(store, "w", 1, 1, test_options()),
                  std::invalid_argument);
  CHECK_THROWS_AS(ProcessGroupAgent(store, "w", 0, 0, test_options()),
                  std::invalid_argument);
  auto options = test_options();
  options.num_worker_threads = 0;
  CHECK_THROWS_AS(ProcessGroupAgent(store, "w", 0, 1, options), std::invalid_argument);
}

TEST_CASE("construction times out naming the ranks that never came",
          "[agents][pg_agent][timeout]") {
  auto store = std::make_shared<HashStore>();
  auto options = test_options();
  options.rpc_timeout = 300ms;
  try {
    ProcessGroupAgent agent(store, "w0", 0, 3, options);
    FAIL("constructed without its peers");
  } catch (const TimeoutError& e) {
    CHECK_THAT(e.what(), Catch::Contains("300 ms"));
    CHECK_THAT(e.what(), Catch::Contains("ranks [1, 2]"));
  }
}

TEST_CASE("unknown workers are NotFoundError naming them", "[agents][pg_agent]") {
  Agents agents = make_agents({"w0", "w1"});
  agents[0]->start(echo_handler());
  agents[1]->start(echo_handler());
  ProcessGroupAgent& a = *agents[0];
  CHECK(a.workers() == std::vector<WorkerInfo>{{"w0", 0}, {"w1", 1}});
  CHECK(a.worker("w1") == WorkerInfo{"w1", 1});
  CHECK(a.worker(1) == WorkerInfo{"w1", 1});
  CHECK_THROWS_WITH(a.worker("nobody"), Catch::Contains("\"nobody\""));
  CHECK_THROWS_AS(a.worker("nobody"), NotFoundError);
  CHECK_THROWS_WITH(a.worker(7), Catch::Contains("7"));
  CHECK_THROWS_AS(a.worker(-1), NotFoundError);
  Failure failure = failure_of(a.send(WorkerInfo{"nobody", 1}, request("f", ""), kGuard));
  CHECK(failure.kind == "NotFoundError");
  CHECK_THAT(failure.message, Catch::Contains("\"nobody\""));
  join_all(agents);
}

TEST_CASE("tensors that cannot travel are refused; strided ones travel contiguous",
          "[agents][pg_agent]") {
  Agents agents = make_agents({"w0", "w1"});
  for (auto& agent : agents) agent->start(echo_handler());
  ProcessGroupAgent& a = *agents[0];
  auto buffer = std::make_shared<std::vector<float>>(std::vector<float>{0, 1, 2, 3});
  Tensor on_gpu =
      Tensor::from_blob(buffer->data(), {4}, DType::kFloat32, Device::cuda(0), buffer);
  Failure failure =
      failure_of(a.send(a.worker("w1"), request("f", "", {on_gpu}), kGuard));
  CHECK(failure.kind == "invalid_argument");
  CHECK_THAT(failure.message, Catch::Contains("tensor 0"));
  CHECK_THAT(failure.message, Catch::Contains("cuda:0"));
  CHECK(failure_of(a.send(a.worker("w1"), request("f", "", {Tensor()}), kGuard)).kind ==
        "invalid_argument");

  Tensor transposed = Tensor::from_blob(buffer->data(), {2, 2}, DType::kFloat32,
                                        Device::cpu(), buffer, {1, 2});
  REQUIRE_FALSE(transposed.is_contiguous());
  Message got = get(a.send(a.worker("w1"), request("f", "", {transposed}), kGuard));
  REQUIRE(got.tensors.size() == 1);
  CHECK(got.tensors[0].shape() == Tensor::Shape{2, 2});
  CHECK(got.tensors[0].to_vector<float>() == std::vector<float>{0, 2, 1, 3});
  join_all(agents);
}

TEST_CASE("send() misuse fails the future with invalid_argument", "[agents][pg_agent]") {
  Agents agents = make_agents({"w0", "w1"});
  ProcessGroupAgent& a = *agents[0];
  CHECK(failure_of(a.send(a.worker("w1"), request("f", ""), kGuard)).kind ==
        "invalid_argument");  // before start()
  a.start(echo_handler());
  agents[1]->start(echo_handler());
  CHECK_THROWS_AS(a.start(echo_handler()), std::invalid_argument);
  Message response = request("f", "");
  response.type = MessageType::kResponse;
  CHECK(failure_of(a.send(a.worker("w1"), response, kGuard)).kind == "invalid_argument");
  join_all(agents);
}

TEST_CASE("join returns at once with no traffic, repeatedly",
          "[agents][pg_agent][join]") {
  Agents agents = make_agents({"w0", "w1", "w2"});
  for (auto& agent : agents) agent->start(echo_handler());
  join_all(agents);
  join_all(agents);
}

TEST_CASE("join waits for calls in flight and requests being handled",
          "[agents][pg_agent][join]") {
  Agents agents = make_agents({"w0", "w1"});
  auto latch = std::make_shared<Gate>(kGuard);
  agents[0]->start(echo_handler());
  agents[1]->start(blocking_handler(latch));
  Future<Message> f =
      agents[0]->send(agents[0]->worker("w1"), request("block", "j"), 0ms);
  REQUIRE(latch->wait_arrived());
  // Neither side can pass its first phase while the call is blocked.
  try {
    agents[0]->join(300ms);
    FAIL("w0 joined with a call in flight");
  } catch (const TimeoutError& e) {
    CHECK_THAT(e.what(), Catch::Contains("join on rpc worker \"w0\""));
    CHECK_THAT(e.what(), Catch::Contains("1 calls in flight"));
  }
  try {
    agents[1]->join(300ms);
    FAIL("w1 joined while handling a request");
  } catch (const TimeoutError& e) {
    CHECK_THAT(e.what(), Catch::Contains("1 requests being handled"));
  }
  bool done_when_joined = false;
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
}

TEST_CASE("join times out naming the workers that did not arrive",
          "[agents][pg_agent][join][timeout]") {
  Agents agents = make_agents({"w0", "w1", "w2"});
  for (auto& agent : agents) agent->start(echo_handler());
  std::vector<std::exception_ptr> errors =
      on_threads(2, [&](int rank) { agents[rank]->join(400ms); });
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    REQUIRE(errors[rank] != nullptr);
    try {
      std::rethrow_exception(errors[rank]);
    } catch (const TimeoutError& e) {
      CHECK_THAT(e.what(), Catch::Contains("waiting for workers [\"w2\"] to join"));
      CHECK_THAT(e.what(), Catch::Contains("400 ms"));
    }
  }
}

TEST_CASE("shutdown fails a pending call with kCancelled; it is idempotent",
          "[agents][pg_agent][shutdown]") {
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
  latch->open();  // w1's pool can finish; its answer goes nowhere
  agents[1]->shutdown();
  agents[1]->shutdown();
  agents.clear();  // destructors after shutdown
}

TEST_CASE("a worker that goes away fails calls to it with ConnectionError; others go on",
          "[agents][pg_agent][shutdown]") {
  Agents agents = make_agents({"w0", "w1", "w2"});
  auto latch = std::make_shared<Gate>(kGuard);
  agents[0]->start(echo_handler());
  agents[1]->start(echo_handler());
  agents[2]->start(blocking_handler(latch));
  Future<Message> f = agents[0]->send(agents[0]->worker("w2"), request("block", ""), 0ms);
  REQUIRE(latch->wait_arrived());
  // w2 shuts down: its group goes away at once, its pool waits for the latch.
  std::thread stopper([&] { agents[2]->shutdown(); });
  Failure failure = failure_of(f);
  latch->open();
  stopper.join();
  CHECK(failure.kind == "ConnectionError");
  CHECK_THAT(failure.message, Catch::Contains("rpc to \"w2\" function \"block\""));
  CHECK_THAT(failure.message, Catch::Contains("connection to worker \"w2\" lost"));
  Failure next =
      failure_of(agents[0]->send(agents[0]->worker("w2"), request("f", ""), 0ms));
  CHECK(next.kind == "ConnectionError");
  // w0 and w1 keep talking.
  Message got =
      get(agents[0]->send(agents[0]->worker("w1"), request("f", "still"), kGuard));
  CHECK(text(got.payload) == "still");
  got = get(agents[1]->send(agents[1]->worker("w0"), request("f", "here"), kGuard));
  CHECK(text(got.payload) == "here");
}

TEST_CASE("a malformed frame fails calls to its sender with ConnectionError",
          "[agents][pg_agent][wire]") {
  namespace wire = agents::process_group_wire;
  const std::string defect =
      GENERATE(as<std::string>{}, "magic", "version", "type", "sizes");
  INFO("defect: " << defect);
  auto store = std::make_shared<HashStore>();
  std::unique_ptr<ProcessGroupAgent> agent;
  std::unique_ptr<collective::GlooProcessGroup> raw;  // rank 1, speaking bytes
  rethrow_first(on_threads(2, [&](int rank) {
    if (rank == 0) {
      agent = std::make_unique<ProcessGroupAgent>(store, "w0", 0, 2, test_options());
      return;
    }
    store->set(std::string(wire::kNamesKey) + "1", "raw");
    store->wait({std::string(wire::kNamesKey) + "0"}, kGuard);
    collective::GlooOptions options;
    options.group_name = wire::kGroupName;
    options.timeout = kGuard;
    options.hostname = "127.0.0.1";
    PrefixStore prefixed(wire::kStorePrefix, store);
    raw = std::make_unique<collective::GlooProcessGroup>(prefixed, 1, 2, options);
  }));
  agent->start(echo_handler());
  Future<Message> f = agent->send(agent->worker("raw"), request("hello", "pay"), 0ms);

  // The frame as documented: header, then function + payload in one body.
  Tensor header = Tensor::zeros({static_cast<int64_t>(wire::kHeaderSize)}, DType::kUInt8);
  raw->recv(header, 0, wire::kHeaderTag).wait();
  const auto* h = static_cast<const uint8_t*>(header.data());
  CHECK(std::string(reinterpret_cast<const char*>(h), 4) == "SBPG");
  CHECK(h[4] == wire::kVersion);
  CHECK(h[5] == static_cast<uint8_t>(MessageType::kRequest));
  CHECK(h[16] == 5);  // function length
  CHECK(h[24] == 3);  // payload length
  Tensor body = Tensor::zeros({8}, DType::kUInt8);
  raw->recv(body, 0, wire::kDataTag).wait();
  CHECK(std::string(static_cast<const char*>(body.data()), 8) == "hellopay");

  // Answer with a broken header.
  Tensor bad = Tensor::zeros({static_cast<int64_t>(wire::kHeaderSize)}, DType::kUInt8);
  std::memcpy(bad.data(), header.data(), wire::kHeaderSize);
  auto* b = static_cast<uint8_t*>(bad.data());
  b[5] = static_cast<uint8_t>(MessageType::kResponse);
  std::string expected;
  if (defect == "magic") {
    b[0] = 'X';
    expected = "bad magic";
  } else if (defect == "version") {
    b[4] = 99;
    expected = "unsupported version 99";
  } else if (defect == "type") {
    b[5] = 7;
    expected = "unknown message type 7";
  } else {
    b[19] = 0x7f;  // function length ~2 GiB
    expected = "sizes out of range";
  }
  raw->send(bad, 0, wire::kHeaderTag).wait();
  Failure failure = failure_of(f);
  CHECK(failure.kind == "ConnectionError");
  CHECK_THAT(failure.message, Catch::Contains("connection to worker \"raw\" lost"));
  CHECK_THAT(failure.message, Catch::Contains("protocol error"));
  CHECK_THAT(failure.message, Catch::Contains(expected));
  agent->shutdown();
  raw.reset();
}
