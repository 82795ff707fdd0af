// The RpcAgent conformance suite (see agent_conformance.h): every case
// drives agents of the backend under test through rpc/agent.h only, as
// threads of this process.
//
// Nothing here sleeps hoping for an order: a handler that must still be
// running blocks on a Gate the test opens, and every wait for something
// that must happen is bounded by kGuard so that a hang fails the test.
// The few bounded waits that expect nothing to happen (CHECK_FALSE(
// f.wait_for(...))) can only miss a bug, never fail a correct agent.
#include "tests/rpc/agent_conformance.h"

#include "tests/rpc/agent_conformance_util.h"

namespace switchboard::agent_conformance {

std::string AgentFactory::shut_down_peer_phrase(const std::string& worker) const {
  return fmt::format("connection to worker \"{}\" lost", worker);
}

RegistryAgentFactory::RegistryAgentFactory(std::string backend, rpc::Extras extras,
                                           std::function<void()> setup)
    : backend_(std::move(backend)), extras_(std::move(extras)), setup_(std::move(setup)) {}

std::unique_ptr<rpc::RpcAgent> RegistryAgentFactory::make_agent(const AgentSpec& spec) {
  std::call_once(setup_once_, [this] {
    if (setup_) setup_();
  });
  const rpc::BackendType backend = rpc::backend_type(backend_);
  auto options = rpc::construct_rpc_backend_options(backend, spec.rendezvous_timeout,
                                                    "env://", extras_);
  return rpc::init_backend(
      backend, rpc::BackendInit{spec.store, spec.name, spec.rank, spec.world_size, options});
}

}  // namespace switchboard::agent_conformance

using namespace switchboard;
using namespace switchboard::agent_conformance::suite;

// ====================================================================== echo

TEST_CASE("echo between two workers: the callee and the caller get copies of tensors",
          "[agent]") {
  if (skipped_unless_workers(2)) return;
  Agents agents = make_group({"w0", "w1"});
  // What the handler saw: the address of the request's tensor and of the
  // tensor it answered with; whether it ran on its agent's pool.
  struct Seen {
    const void* received = nullptr;
    const void* answered = nullptr;
    bool on_pool = false;
  };
  Promise<Seen> seen;
  RpcAgent* callee = agents[1].get();
  agents[0]->start(echo_handler());
  agents[1]->start([seen, callee](Message request, const WorkerInfo& from) {
    Tensor& t = request.tensors.at(0);
    const void* received = t.data();
    t.data_as<int32_t>()[0] = 99;  // the caller's tensor must not change
    Message response = echo_of(request);
    response.payload =
        bytes(request.function + ": " + text(request.payload) + " from " + from.name);
    seen.set_value(Seen{received, response.tensors[0].data(),
                        rpc::ThreadPool::current() == callee->pool().get()});
    return Future<Message>::ready(response);
  });
  Tensor sent = Tensor::from_vector(std::vector<int32_t>{1, 2, 3});
  Message got = get(send(*agents[0], "w1", request("echo", "hi", {sent})));
  REQUIRE(seen.get_future().wait_for(kGuard));
  const Seen handler = seen.get_future().value();
  CHECK(handler.on_pool);
  CHECK(got.type == MessageType::kResponse);
  CHECK(got.id != 0);
  CHECK(got.function.empty());  // responses name no function
  CHECK(text(got.payload) == "echo: hi from w0");
  CHECK(sent.to_vector<int32_t>() == std::vector<int32_t>{1, 2, 3});
  CHECK(handler.received != sent.data());
  REQUIRE(got.tensors.size() == 1);
  CHECK(got.tensors[0].to_vector<int32_t>() == std::vector<int32_t>{99, 2, 3});
  CHECK(got.tensors[0].data() != handler.answered);
  join_all(agents);
}

TEST_CASE("echo between three workers, every pair: every dtype, empty, 0-dim and 16 MiB "
          "tensors arrive intact",
          "[agent][tensor]") {
  if (skipped_unless_workers(3)) return;
  Agents agents = make_group({"w0", "w1", "w2"});
  for (auto& agent : agents) agent->start(function_echo_handler());
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
      tensors.push_back(Tensor::from_vector(std::vector<int64_t>{src, dst}));
      if (src == 0 && dst != 0) {
        tensors.push_back(patterned({4 * 1024 * 1024}, DType::kFloat32, seed));  // 16 MiB
      }
      Message m = request(fmt::format("fn-{}-{}", src, dst),
                          fmt::format("payload from {} to {}", src, dst), tensors);
      Future<Message> f = send(*agents[src], agents[src]->worker(dst), m, kGuard);
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
    CHECK(got.function.empty());
    CHECK(text(got.payload) == call.sent.function + ": " + text(call.sent.payload));
    REQUIRE(got.tensors.size() == call.sent.tensors.size());
    for (size_t i = 0; i < got.tensors.size(); ++i) {
      INFO("tensor " << i << ": sent " << call.sent.tensors[i].describe() << ", got "
                     << got.tensors[i].describe());
      CHECK(same_tensor(got.tensors[i], call.sent.tensors[i]));
    }
  }
  join_all(agents);
}

TEST_CASE("a strided tensor travels as a contiguous copy", "[agent][tensor]") {
  if (skipped_unless_workers(2)) return;
  Agents agents = make_group({"w0", "w1"});
  for (auto& agent : agents) agent->start(echo_handler());
  auto buffer = std::make_shared<std::vector<float>>(std::vector<float>{0, 1, 2, 3});
  Tensor transposed = Tensor::from_blob(buffer->data(), {2, 2}, DType::kFloat32,
                                        Device::cpu(), buffer, {1, 2});
  REQUIRE_FALSE(transposed.is_contiguous());
  Message got = get(send(*agents[1], "w0", request("t", "", {transposed})));
  REQUIRE(got.tensors.size() == 1);
  CHECK(got.tensors[0].is_contiguous());
  CHECK(got.tensors[0].shape() == Tensor::Shape{2, 2});
  CHECK(got.tensors[0].to_vector<float>() == std::vector<float>{0, 2, 1, 3});
  join_all(agents);
}

TEST_CASE("50 tensors of one message, every third empty, arrive in order",
          "[agent][tensor]") {
  if (skipped_unless_workers(2)) return;
  Agents agents = make_group({"w0", "w1"});
  for (auto& agent : agents) agent->start(echo_handler());
  std::vector<Tensor> tensors;
  for (int i = 0; i < 50; ++i) {
    // The empty ones carry no bytes and must not shift the rest.
    tensors.push_back(patterned({i % 3 == 0 ? 0 : i}, kAllDTypes[i % 9], i));
  }
  Message got = get(send(*agents[0], "w1", request("many", "", tensors)));
  REQUIRE(got.tensors.size() == tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    INFO("tensor " << i);
    CHECK(same_tensor(got.tensors[i], tensors[i]));
  }
  join_all(agents);
}

TEST_CASE("a CUDA or undefined tensor fails send() with invalid_argument naming it",
          "[agent][tensor]") {
  if (skipped_unless_workers(2)) return;
  Agents agents = make_group({"w0", "w1"});
  for (auto& agent : agents) agent->start(echo_handler());
  auto buffer = std::make_shared<std::vector<float>>(std::vector<float>{0, 1, 2, 3});
  Tensor on_gpu =
      Tensor::from_blob(buffer->data(), {4}, DType::kFloat32, Device::cuda(0), buffer);
  Failure cuda = failure_of(send(*agents[0], "w1", request("f", "", {on_gpu})));
  CHECK(cuda.kind == "invalid_argument");
  CHECK_THAT(cuda.message, Catch::Contains("tensor 0"));
  CHECK_THAT(cuda.message, Catch::Contains("cuda:0"));
  Failure undefined =
      failure_of(send(*agents[0], "w1", request("f", "", {Tensor()}), 0ms));
  CHECK(undefined.kind == "invalid_argument");
  CHECK_THAT(undefined.message, Catch::Contains("tensor 0 is undefined"));
  // The agent goes on.
  CHECK(text(get(send(*agents[0], "w1", request("f", "after"))).payload) == "after");
  join_all(agents);
}

TEST_CASE("4 threads x 200 concurrent sends each way are all answered with their own ids",
          "[agent][concurrency]") {
  if (skipped_unless_workers(2)) return;
  Agents agents = make_group({"a", "b"});
  for (auto& agent : agents) agent->start(echo_handler());
  constexpr int kThreads = 4;
  constexpr int kPerThread = 200;
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

// ====================================================================== self

TEST_CASE("a send to self is served on the pool, from self, on copies of the tensors",
          "[agent][self]") {
  Agents agents = make_group({"solo"});
  RpcAgent& agent = *agents[0];
  std::atomic<bool> on_pool{false};
  std::atomic<bool> from_self{false};
  agent.start([&](Message request, const WorkerInfo& from) {
    on_pool = rpc::ThreadPool::current() == agent.pool().get();
    from_self = from == WorkerInfo{"solo", 0};
    return Future<Message>::ready(echo_of(request));
  });
  Tensor t = patterned({5}, DType::kInt32, 3);
  Message got = get(send(agent, agent.self(), request("echo", "hi", {t}), kGuard));
  CHECK(on_pool);
  CHECK(from_self);
  CHECK(got.type == MessageType::kResponse);
  CHECK(text(got.payload) == "hi");
  REQUIRE(got.tensors.size() == 1);
  CHECK(same_tensor(got.tensors[0], t));
  CHECK(got.tensors[0].data() != t.data());
  CHECK(agent.self() == WorkerInfo{"solo", 0});
  CHECK(agent.workers() == std::vector<WorkerInfo>{{"solo", 0}});
  agent.join(kGuard);
}

// ====================================================================== names

TEST_CASE("unknown workers are NotFoundError naming them", "[agent][names]") {
  if (skipped_unless_workers(2)) return;
  Agents agents = make_group({"w0", "w1"});
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
  Failure failure = failure_of(send(a, WorkerInfo{"nobody", 1}, request("f", ""), kGuard));
  CHECK(failure.kind == "NotFoundError");
  CHECK_THAT(failure.message, Catch::Contains("\"nobody\""));
  join_all(agents);
}

TEST_CASE("duplicate worker names fail on every worker, naming the name and its ranks",
          "[agent][names]") {
  if (skipped_unless_workers(3)) return;
  auto store = std::make_shared<HashStore>();
  const std::vector<std::string> names = {"a", "b", "a"};
  Agents agents(3);
  auto errors = on_threads(3, [&](int rank) {
    agents[rank] = agent_factory().make_agent(spec(store, names[rank], rank, 3));
  });
  for (int rank = 0; rank < 3; ++rank) {
    INFO("rank " << rank);
    REQUIRE(errors[rank] != nullptr);
    // "ranks 0 and 2" (LOCAL, PROCESS_GROUP) or "ranks 0, 2" (PIPE); a
    // DuplicateNameError (a std::invalid_argument), so that callers tell it
    // by its type.
    CHECK_THAT(what_thrown<DuplicateNameError>([&] { rethrow_first({errors[rank]}); }),
               Catch::Matches(R"(.*"a" is used by ranks 0(,| and) 2\b.*)"));
  }
}

TEST_CASE("construction times out naming the ranks that never came",
          "[agent][timeout]") {
  if (skipped_unless_workers(3)) return;
  auto store = std::make_shared<HashStore>();
  const std::string message = what_thrown<TimeoutError>(
      [&] { (void)agent_factory().make_agent(spec(store, "w0", 0, 3, 300ms)); });
  CHECK_THAT(message, Catch::Contains("300 ms"));
  CHECK_THAT(message, Catch::Contains("ranks [1, 2]"));
}

TEST_CASE("two groups with the same names over different stores stay apart", "[agent]") {
  if (skipped_unless_workers(2)) return;
  Agents first = make_group({"w0", "w1"});
  Agents second = make_group({"w0", "w1"});
  for (Agents* group : {&first, &second}) {
    const std::string tag = group == &first ? "first" : "second";
    (*group)[0]->start(echo_handler());
    (*group)[1]->start([tag](Message request, const WorkerInfo&) {
      Message response = echo_of(request);
      response.payload = bytes(tag);
      return Future<Message>::ready(response);
    });
  }
  CHECK(text(get(send(*first[0], "w1", request("f", ""))).payload) == "first");
  CHECK(text(get(send(*second[0], "w1", request("f", ""))).payload) == "second");
  join_all(first);
  join_all(second);
}

// ====================================================================== misuse

TEST_CASE("send() misuse fails the future with invalid_argument; send() never throws",
          "[agent]") {
  if (skipped_unless_workers(2)) return;
  Agents agents = make_group({"w0", "w1"});
  RpcAgent& a = *agents[0];
  Failure before = failure_of(send(a, "w1", request("f", "")));
  CHECK(before.kind == "invalid_argument");
  CHECK_THAT(before.message, Catch::Contains("before start()"));
  a.start(echo_handler());
  agents[1]->start(echo_handler());
  CHECK_THROWS_AS(a.start(echo_handler()), std::invalid_argument);
  Message response = request("f", "");
  response.type = MessageType::kResponse;
  CHECK(failure_of(send(a, "w1", response)).kind == "invalid_argument");
  Message error = request("f", "");
  error.type = MessageType::kError;
  CHECK(failure_of(send(a, "w1", error)).kind == "invalid_argument");
  CHECK(failure_of(send(a, "w1", request("f", ""), -1ms)).kind == "invalid_argument");
  // The agent goes on.
  CHECK(text(get(send(a, "w1", request("f", "after"))).payload) == "after");
  join_all(agents);
}

// ====================================================================== handlers

TEST_CASE("a request that reaches a worker before its start() waits for it",
          "[agent][handler]") {
  if (skipped_unless_workers(2)) return;
  Agents agents = make_group({"w0", "w1"});
  agents[0]->start(echo_handler());
  Future<Message> f = send(*agents[0], "w1", request("early", "e"));
  CHECK_FALSE(f.wait_for(100ms));  // w1 has no handler yet: it cannot be done
  agents[1]->start(echo_handler());
  CHECK(text(get(f).payload) == "e");
  join_all(agents);
}

TEST_CASE("a handler's future completed later by another thread answers the call",
          "[agent][handler]") {
  if (skipped_unless_workers(2)) return;
  Agents agents = make_group({"w0", "w1"});
  // The handler parks its promise and answer here for the test to complete.
  Promise<std::pair<Promise<Message>, Message>> parked;
  agents[0]->start(echo_handler());
  agents[1]->start([parked](Message request, const WorkerInfo& from) {
    Promise<Message> promise;
    Message response = echo_of(request);
    response.payload = bytes(text(request.payload) + " from " + from.name);
    parked.set_value({promise, response});
    return promise.get_future();
  });
  Future<Message> f = send(*agents[0], "w1", request("later", "x"));
  REQUIRE(parked.get_future().wait_for(kGuard));
  const std::pair<Promise<Message>, Message> entry = parked.get_future().value();
  CHECK_FALSE(f.done());  // the handler returned, its future has not completed
  std::thread completer([&] { entry.first.set_value(entry.second); });
  Message got = get(f);
  completer.join();
  CHECK(text(got.payload) == "x from w0");
  join_all(agents);
}

TEST_CASE("a handler that throws, returns an invalid future, fails its future or answers "
          "with a request, a function or a tensor that cannot travel is answered kError "
          "naming the worker",
          "[agent][handler]") {
  if (skipped_unless_workers(2)) return;
  Agents agents = make_group({"w0", "w1"});
  agents[0]->start(echo_handler());
  agents[1]->start([](Message request, const WorkerInfo&) -> Future<Message> {
    if (request.function == "throws") throw std::runtime_error("boom in the handler");
    if (request.function == "invalid") return Future<Message>();
    if (request.function == "request") {
      return Future<Message>::ready(request);  // type kRequest: not an answer
    }
    if (request.function == "names_function") {
      Message response = echo_of(request);
      response.function = request.function;  // responses name none
      return Future<Message>::ready(response);
    }
    if (request.function == "undefined_tensor") {
      Message response = echo_of(request);
      response.tensors = {Tensor()};
      return Future<Message>::ready(response);
    }
    if (request.function == "fails_runtime") {
      return Future<Message>::failed(
          std::make_exception_ptr(std::runtime_error("boom in the future")));
    }
    return Future<Message>::failed(
        std::make_exception_ptr(NotFoundError("boom in the future")));
  });
  struct Case {
    std::string function, type, message;
  };
  for (const Case& c :
       {Case{"throws", "std::runtime_error", "boom in the handler"},
        Case{"fails", "switchboard::NotFoundError", "boom in the future"},
        Case{"fails_runtime", "std::runtime_error", "boom in the future"},
        Case{"invalid", "switchboard::Error", "invalid future"},
        Case{"request", "switchboard::Error", "answered with message type 1"},
        Case{"names_function", "switchboard::Error",
             "answered naming function \"names_function\""},
        Case{"undefined_tensor", "std::invalid_argument", "undefined"}}) {
    INFO(c.function);
    Message got = get(send(*agents[0], "w1", request(c.function, "")));
    REQUIRE(got.type == MessageType::kError);
    CHECK(got.tensors.empty());
    rpc::RemoteError error = rpc::decode_remote_error(got);
    CHECK(error.worker() == "w1");
    CHECK(error.type_name() == c.type);
    CHECK_THAT(error.remote_message(), Catch::Contains(c.message));
  }
  // The worker goes on serving.
  Message got = get(send(*agents[0], "w1", request("fine", "")));
  CHECK(got.type == MessageType::kError);  // this handler fails everything else
  join_all(agents);
}

// ====================================================================== timeouts

TEST_CASE(
    "a call times out naming worker, function and timeout; the late answer is dropped",
    "[agent][timeout]") {
  if (skipped_unless_workers(2)) return;
  auto latch = std::make_shared<Gate>(kGuard);
  Agents agents = make_pair_held_at(latch);
  const auto start = std::chrono::steady_clock::now();
  Future<Message> f = send(*agents[0], "w1", request("block", ""), 200ms);
  Failure failure = failure_of(f);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  CHECK(failure.kind == "TimeoutError");
  CHECK(failure.code == ErrorCode::kDeadlineExceeded);
  CHECK_THAT(failure.message,
             Catch::Contains("rpc to \"w1\" function \"block\": timed out after 200 ms"));
  CHECK(elapsed >= 200ms);
  CHECK(latch->wait_arrived());
  latch->open();
  // w1's join drains its handler, whose late answer w0 then drops.
  join_all(agents);
  Message got = get(send(*agents[0], "w1", request("echo", "after")));
  CHECK(text(got.payload) == "after");
  join_all(agents);
}

TEST_CASE("a timeout of 0 never expires", "[agent][timeout]") {
  if (skipped_unless_workers(2)) return;
  auto latch = std::make_shared<Gate>(kGuard);
  Agents agents = make_pair_held_at(latch);
  Future<Message> f = send(*agents[0], "w1", request("block", "z"), 0ms);
  REQUIRE(latch->wait_arrived());
  CHECK_FALSE(f.wait_for(300ms));
  latch->open();
  CHECK(text(get(f).payload) == "z");
  join_all(agents);
}

TEST_CASE("dropping a call's future cancels nothing: the handler runs, the call drains",
          "[agent][cancel]") {
  if (skipped_unless_workers(2)) return;
  auto latch = std::make_shared<Gate>(kGuard);
  Agents agents = make_pair_held_at(latch);
  (void)send(*agents[0], "w1", request("block", "dropped"), 0ms);
  REQUIRE(latch->wait_arrived());
  latch->open();
  join_all(agents);  // the call was in flight until its answer came back
  CHECK(text(get(send(*agents[0], "w1", request("echo", "next"))).payload) == "next");
  join_all(agents);
}
