// PipeAgent serving calls under pressure and with a call context: a caller
// that floods a worker (the limit per caller), a function that learns its
// caller is gone or cancelled the call, and options of another backend.
// Workers are PipeAgents on threads over one HashStore on 127.0.0.1; every
// wait is on a future or a gate, bounded by kGuard.
#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "agents/pipe/agent.h"
#include "common/error.h"
#include "common/mutex.h"
#include "core/remote_error.h"
#include "rpc/call_context.h"
#include "rpc/future.h"
#include "rpc/rpc.h"
#include "store/hash_store.h"
#include "tests/agents/pipe/test_util.h"
#include "tests/util/threads.h"

using namespace switchboard;
using namespace std::chrono_literals;
using agents::pipe::PipeAgent;
using agents::pipe::PipeAgentOptions;
using rpc::Future;
using rpc::Message;
using rpc::MessageType;
using rpc::WorkerInfo;
using switchboard::testing::Gate;
using switchboard::testing::on_threads;
using switchboard::testing::rethrow_first;
using namespace switchboard::pipe_test;

namespace {

// A static group of `n` PipeAgents "w<r>" on 127.0.0.1 over one HashStore,
// with `options` (their listen address and timeout set here); not started.
std::vector<std::unique_ptr<PipeAgent>> make_group(int n, PipeAgentOptions options) {
  options.listen_address = "127.0.0.1";
  options.rpc_timeout = 30s;
  auto store = std::make_shared<HashStore>();
  std::vector<std::unique_ptr<PipeAgent>> agents(n);
  rethrow_first(on_threads(n, [&](int rank) {
    agents[rank] = std::make_unique<PipeAgent>(store, worker_name(rank), rank, n, options);
  }));
  return agents;
}

}  // namespace

TEST_CASE("a caller that floods a worker is refused beyond its limit, and the others are "
          "still served",
          "[pipe][limits][flood]") {
  // w0 takes 2 requests of each caller at once; its pool has 4 threads.
  PipeAgentOptions options;
  options.num_worker_threads = 4;
  options.max_requests_per_peer = 2;
  std::vector<std::unique_ptr<PipeAgent>> agents = make_group(3, options);
  auto gate = std::make_shared<Gate>(kGuard);
  for (auto& agent : agents) {
    agent->start([gate](Message m, const WorkerInfo&) {
      if (m.function == "slow") gate->pass();
      Message reply;
      reply.type = MessageType::kResponse;
      reply.payload = std::move(m.payload);
      return Future<Message>::ready(std::move(reply));
    });
  }
  PipeAgent& w0 = *agents[0];
  PipeAgent& w1 = *agents[1];
  PipeAgent& w2 = *agents[2];
  // w1 floods w0 with 200 slow calls: two are taken (and wait at the gate),
  // the rest are refused at once.
  std::vector<Future<Message>> flood;
  for (int i = 0; i < 200; ++i) {
    flood.push_back(w1.send(w1.worker("w0"), request("slow", {1}), kGuard));
  }
  REQUIRE(gate->wait_arrived(2));
  // The calls after the first two (one connection keeps their order) are
  // answered while the gate is still shut: refused, not queued. (An agent
  // delivers an error reply as a kError message; rpc_sync raises it.)
  auto refused_with = [](const Future<Message>& f) -> std::string {
    if (f.has_error() || f.value().type != MessageType::kError) return "";
    return rpc::decode_remote_error(f.value()).what();
  };
  int refused = 0;
  std::string refusal;
  for (size_t i = 2; i < flood.size(); ++i) {
    REQUIRE(flood[i].wait_for(kGuard));
    CHECK_FALSE(refused_with(flood[i]).empty());
  }
  CHECK_FALSE(flood[0].wait_for(0ms));
  CHECK_FALSE(flood[1].wait_for(0ms));
  // w2 is served meanwhile, by the pool's free threads.
  Future<Message> other = w2.send(w2.worker("w0"), request("fast", {2}), kGuard);
  REQUIRE(other.wait_for(kGuard));
  CHECK(refused_with(other).empty());
  CHECK(other.value().type == MessageType::kResponse);
  gate->open();
  for (auto& f : flood) {
    REQUIRE(f.wait_for(kGuard));
    const std::string why = refused_with(f);
    if (!why.empty()) {
      ++refused;
      refusal = why;
    }
  }
  INFO("a refusal: " << refusal);
  CHECK(refused == 198);
  CHECK_THAT(refusal, Catch::Contains("\"w1\" already has 2 requests waiting or running"));
  CHECK_THAT(refusal, Catch::Contains("max_requests_per_peer"));
  // Once answered, w1 is served again.
  Future<Message> again = w1.send(w1.worker("w0"), request("fast", {3}), kGuard);
  REQUIRE(again.wait_for(kGuard));
  CHECK(again.value().type == MessageType::kResponse);
  for (auto& agent : agents) agent->shutdown();
}

namespace {

// Lets "hold" calls finish one at a time: each takes a ticket the test hands
// out, and counts its start.
class Tickets {
 public:
  void take() SB_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    ++started_;
    changed_.notify_all();
    changed_.wait_for(mu_, kGuard, [&]() SB_REQUIRES(mu_) { return tickets_ > 0; });
    if (tickets_ > 0) --tickets_;
  }
  void give() SB_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    ++tickets_;
    changed_.notify_all();
  }
  void give_all() SB_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    tickets_ = 1 << 20;
    changed_.notify_all();
  }
  // The other caller's call ran: how many "hold" calls had started then.
  void note_other() SB_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    other_at_ = started_;
    changed_.notify_all();
  }
  int other_at() SB_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return other_at_;
  }
  // Waits until `n` calls started or the other caller's call ran; false
  // after kGuard.
  bool wait_started(int n) SB_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return changed_.wait_for(mu_, kGuard,
                             [&]() SB_REQUIRES(mu_) { return started_ >= n || other_at_ >= 0; });
  }

 private:
  Mutex mu_;
  CondVar changed_;
  int started_ SB_GUARDED_BY(mu_) = 0;
  int tickets_ SB_GUARDED_BY(mu_) = 0;
  int other_at_ SB_GUARDED_BY(mu_) = -1;
};

}  // namespace

TEST_CASE("callers share the pool in turn: one caller's backlog does not make another wait "
          "behind all of it",
          "[pipe][limits][fairness]") {
  // w0's pool has 2 threads; w1 sends 30 calls that each hold a thread
  // until the test hands out a ticket, then w2 sends one.
  PipeAgentOptions options;
  options.num_worker_threads = 2;
  std::vector<std::unique_ptr<PipeAgent>> agents = make_group(3, options);
  auto tickets = std::make_shared<Tickets>();
  for (auto& agent : agents) {
    agent->start([tickets](Message m, const WorkerInfo&) {
      if (m.function == "hold") tickets->take();
      if (m.function == "other") tickets->note_other();
      Message reply;
      reply.type = MessageType::kResponse;
      reply.payload = std::move(m.payload);
      return Future<Message>::ready(std::move(reply));
    });
  }
  PipeAgent& w1 = *agents[1];
  PipeAgent& w2 = *agents[2];
  std::vector<Future<Message>> backlog;
  for (int i = 0; i < 30; ++i) {
    backlog.push_back(w1.send(w1.worker("w0"), request("hold", {1}), kGuard));
  }
  REQUIRE(tickets->wait_started(2));  // both threads held; 28 wait
  // Once w1's 30 requests all arrived, w2's call comes after them.
  PipeAgent& w0 = *agents[0];
  REQUIRE(testing::eventually(
      [&] { return w0.metrics_snapshot().requests_in_progress >= 30; }, kGuard));
  Future<Message> other = w2.send(w2.worker("w0"), request("other", {2}), kGuard);
  // It waits at w0 too before any thread is freed.
  REQUIRE(testing::eventually(
      [&] { return w0.metrics_snapshot().requests_in_progress >= 31; }, kGuard));
  // Threads freed one at a time: w2's call runs within a turn or two,
  // where first in, first out would run it after w1's 28 waiting calls.
  for (int freed = 1; freed <= 29 && tickets->other_at() < 0; ++freed) {
    tickets->give();
    REQUIRE(tickets->wait_started(2 + freed));
  }
  REQUIRE(other.wait_for(kGuard));
  CHECK(other.value().type == MessageType::kResponse);
  INFO("w2's call ran when " << tickets->other_at() << " of w1's calls had started");
  CHECK(tickets->other_at() >= 2);
  CHECK(tickets->other_at() <= 4);
  tickets->give_all();
  for (auto& f : backlog) REQUIRE(f.wait_for(kGuard));
  for (auto& agent : agents) agent->shutdown();
}

namespace {

// A handler for the cancellation cases: "work" says it started, waits for
// the test to let it go on, and says whether its call context was
// cancelled by then; "hold" answers only when the test says so (an async
// handler); anything else is echoed.
struct CancelWatch {
  std::shared_ptr<rpc::Promise<void>> entered = std::make_shared<rpc::Promise<void>>();
  std::shared_ptr<rpc::Promise<void>> go_on = std::make_shared<rpc::Promise<void>>();
  std::shared_ptr<rpc::Promise<bool>> noticed = std::make_shared<rpc::Promise<bool>>();
  std::shared_ptr<rpc::Promise<Message>> held = std::make_shared<rpc::Promise<Message>>();

  rpc::RpcAgent::RequestHandler handler() const {
    return [entered = entered, go_on = go_on, noticed = noticed, held = held](
               Message m, const WorkerInfo&) {
      if (m.function == "hold") return held->get_future();
      if (m.function == "work") {
        const rpc::CallContext* call = rpc::current_call();
        entered->set_value();
        (void)go_on->get_future().wait_for(kGuard);
        noticed->set_value(call != nullptr && call->cancelled());
      }
      Message reply;
      reply.type = MessageType::kResponse;
      reply.payload = std::move(m.payload);
      return Future<Message>::ready(std::move(reply));
    };
  }
  // Lets "work" go on and returns what it saw.
  bool saw_cancelled() const {
    go_on->set_value();
    Future<bool> outcome = noticed->get_future();
    REQUIRE(outcome.wait_for(kGuard));
    return outcome.value();
  }
};

}  // namespace

TEST_CASE("a function learns that its caller is gone: its call context says cancelled",
          "[pipe][context]") {
  PipeAgentOptions options;
  options.num_worker_threads = 2;
  std::vector<std::unique_ptr<PipeAgent>> agents = make_group(2, options);
  const CancelWatch watch;
  for (auto& agent : agents) agent->start(watch.handler());
  // w0 waits on w1 too, so that it learns when w1's connection is gone: that
  // call fails once w0 has dealt with the loss.
  Future<Message> waiting = agents[0]->send(agents[0]->worker("w1"), request("hold", {}), kGuard);
  Future<Message> call = agents[1]->send(agents[1]->worker("w0"), request("work", {1}), kGuard);
  REQUIRE(watch.entered->get_future().wait_for(kGuard));
  agents[1]->shutdown();  // the caller goes away mid-call
  CHECK(outcome_of(waiting).kind == "ConnectionError");
  CHECK(watch.saw_cancelled());
  agents[0]->shutdown();
}

TEST_CASE("a caller that cancels a call fails its future at once, and the function learns it",
          "[pipe][context][cancel]") {
  PipeAgentOptions options;
  options.num_worker_threads = 2;
  std::vector<std::unique_ptr<PipeAgent>> agents = make_group(2, options);
  const CancelWatch watch;
  for (auto& agent : agents) agent->start(watch.handler());
  Future<Message> call = agents[1]->send(agents[1]->worker("w0"), request("work", {1}), kGuard);
  REQUIRE(watch.entered->get_future().wait_for(kGuard));
  CHECK(call.cancel());
  CHECK(outcome_of(call).kind == "Error(Cancelled)");
  // A call after it on the same connection: once it is answered, w0 has
  // read the cancel frame that went before it.
  Future<Message> next = agents[1]->send(agents[1]->worker("w0"), request("echo", {2}), kGuard);
  REQUIRE(next.wait_for(kGuard));
  CHECK(next.value().payload == std::vector<uint8_t>{2});
  CHECK(watch.saw_cancelled());
  for (auto& agent : agents) agent->shutdown();
}

TEST_CASE("a backend given another backend's options refuses them, naming the type it "
          "expects",
          "[pipe][options]") {
  auto store = std::make_shared<HashStore>();
  for (const auto& [backend, other, expected] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"PIPE", "PROCESS_GROUP", "PipeRpcBackendOptions"},
           {"PROCESS_GROUP", "PIPE", "ProcessGroupRpcBackendOptions"}}) {
    INFO(backend << " given " << other << "'s options");
    rpc::RpcContext ctx;
    const auto options =
        rpc::construct_rpc_backend_options(rpc::backend_type(other), 30s, "env://", {});
    try {
      ctx.init_rpc("w0", backend, 0, 1, options, store);
      FAIL("init_rpc took the options");
    } catch (const std::invalid_argument& e) {
      CHECK_THAT(e.what(), Catch::Contains("not a switchboard::agents::" + expected));
      CHECK_THAT(e.what(), Catch::Contains("RpcBackendOptions, not"));
    }
    CHECK_FALSE(ctx.initialized());
  }
}

