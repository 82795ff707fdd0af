// The RpcAgent conformance suite, continued: per-peer metrics, join and
// shutdown (agent_conformance.cc has the rules every case follows).
#include "tests/rpc/agent_conformance_util.h"

using namespace switchboard;
using namespace switchboard::agent_conformance::suite;

// ====================================================================== metrics

namespace {

// `agent`'s metrics entry for peer `id`, once `done` holds for it (polled:
// a transport may count a message a moment after the call completed);
// the last entry seen (or a default one) at kGuard.
rpc::PeerMetricsSnapshot peer_entry(
    const RpcAgent& agent, int id,
    const std::function<bool(const rpc::PeerMetricsSnapshot&)>& done) {
  const auto deadline = std::chrono::steady_clock::now() + kGuard;
  rpc::PeerMetricsSnapshot last;
  for (;;) {
    for (const rpc::PeerMetricsSnapshot& p : agent.metrics_snapshot().peers) {
      if (p.id == id) last = p;
    }
    if ((last.id == id && done(last)) || std::chrono::steady_clock::now() >= deadline) {
      return last;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace

TEST_CASE("per-peer metrics count an echo both ways, connected, then closed at shutdown",
          "[agent][metrics]") {
  if (skipped_unless_workers(2)) return;
  Agents agents = make_group({"w0", "w1"});
  agents[0]->start(echo_handler());
  agents[1]->start(echo_handler());
  const std::string payload(300, 'p');
  const Tensor tensor = patterned({16, 16}, DType::kFloat32, 1);  // 1 KiB
  const uint64_t least = payload.size() + tensor.nbytes();
  Message got = get(send(*agents[0], "w1", request("echo", payload, {tensor})));
  REQUIRE(text(got.payload) == payload);
  REQUIRE(got.tensors.size() == 1);

  // Each side sent one message (the request, the reply) carrying the
  // payload and the tensor, and received one.
  auto counted = [&](const rpc::PeerMetricsSnapshot& p) {
    return p.messages_sent >= 1 && p.messages_received >= 1 && p.bytes_sent >= least &&
           p.bytes_received >= least;
  };
  for (int self = 0; self < 2; ++self) {
    const int other = 1 - self;
    INFO(agent_factory().name() << ": w" << self << "'s entry for w" << other);
    const rpc::PeerMetricsSnapshot p = peer_entry(*agents[self], other, counted);
    REQUIRE(p.id == other);
    CHECK(p.name == fmt::format("w{}", other));
    CHECK(p.messages_sent >= 1);
    CHECK(p.bytes_sent >= least);
    CHECK(p.messages_received >= 1);
    CHECK(p.bytes_received >= least);
    CHECK(rpc::connection_state_name(p.state) == "connected");
    // No entry for the worker itself.
    for (const auto& q : agents[self]->metrics_snapshot().peers) CHECK(q.id != self);
  }
  join_all(agents);

  // w1 shuts down: its own entry for w0 is closed; w0 sees w1 go.
  agents[1]->shutdown();
  const rpc::PeerMetricsSnapshot own = peer_entry(*agents[1], 0, [](const auto& p) {
    return p.state != rpc::ConnectionState::kConnected;
  });
  CHECK(rpc::connection_state_name(own.state) == "closed");
  if (skipped_for(Limitation::kPeerMetricsSeePeerShutdown)) return;
  const rpc::ConnectionState expected = agent_factory().shut_down_peer_state();
  const rpc::PeerMetricsSnapshot seen = peer_entry(
      *agents[0], 1, [&](const rpc::PeerMetricsSnapshot& p) { return p.state == expected; });
  CHECK(rpc::connection_state_name(seen.state) == rpc::connection_state_name(expected));
}

// ====================================================================== join

TEST_CASE("join returns at once with no traffic, repeatedly", "[agent][join]") {
  if (skipped_unless_workers(3)) return;
  Agents agents = make_group({"w0", "w1", "w2"});
  for (auto& agent : agents) agent->start(echo_handler());
  join_all(agents);
  join_all(agents);
}

TEST_CASE("join waits for calls in flight and requests being handled", "[agent][join]") {
  if (skipped_unless_workers(2)) return;
  auto latch = std::make_shared<Gate>(kGuard);
  Agents agents = make_pair_held_at(latch);
  Future<Message> f = send(*agents[0], "w1", request("block", "j"), 0ms);
  REQUIRE(latch->wait_arrived());
  // Neither side can pass its first phase while the call is blocked.
  // Every agent drains through CallTable::drain(): "join on rpc worker
  // "w0": timed out after 300 ms with 1 calls in flight and ...".
  CHECK_THAT(what_thrown<TimeoutError>([&] { agents[0]->join(300ms); }),
             Catch::Matches(R"(join on rpc (worker|agent) "w0": .*\b1 call(s|\(s\))? )"
                            R"((still )?in flight.*)"));
  CHECK_THAT(what_thrown<TimeoutError>([&] { agents[1]->join(300ms); }),
             Catch::Matches(R"(join on rpc (worker|agent) "w1": .*\b1 request(s|\(s\))? )"
                            R"(being handled.*)"));
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

// w0, w1 and w2 started; w0 and w1 join with a timeout of 300 ms, w2 never
// does: what each join threw.
std::vector<std::exception_ptr> join_without_w2() {
  Agents agents = make_group({"w0", "w1", "w2"});
  for (auto& agent : agents) agent->start(echo_handler());
  return on_threads(2, [&](int rank) { agents[rank]->join(300ms); });
}

TEST_CASE("join times out when a worker never joins", "[agent][join][timeout]") {
  if (skipped_unless_workers(3)) return;
  std::vector<std::exception_ptr> errors = join_without_w2();
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    REQUIRE(errors[rank] != nullptr);
    (void)what_thrown<TimeoutError>([&] { rethrow_first({errors[rank]}); });
  }
}

TEST_CASE("join's timeout names the workers that did not arrive",
          "[agent][join][timeout]") {
  if (skipped_unless_workers(3) || skipped_for(Limitation::kJoinNamesMissingWorkers)) {
    return;
  }
  std::vector<std::exception_ptr> errors = join_without_w2();
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    CHECK_THAT(what_thrown<TimeoutError>([&] { rethrow_first({errors[rank]}); }),
               Catch::Contains("waiting for workers [\"w2\"] to join") &&
                   Catch::Contains("300 ms"));
  }
}

// ====================================================================== shutdown

TEST_CASE("shutdown fails a pending call with kCancelled; it is idempotent",
          "[agent][shutdown]") {
  if (skipped_unless_workers(2)) return;
  auto latch = std::make_shared<Gate>(kGuard);
  Agents agents = make_pair_held_at(latch);
  Future<Message> f = send(*agents[0], "w1", request("block", ""), 0ms);
  REQUIRE(latch->wait_arrived());
  agents[0]->shutdown();
  Failure failure = failure_of(f);
  CHECK(failure.kind == "Error");
  CHECK(failure.code == ErrorCode::kCancelled);
  CHECK_THAT(failure.message, Catch::Contains("function \"block\""));
  CHECK_THAT(failure.message, Catch::Contains("rpc agent \"w0\" shut down"));
  agents[0]->shutdown();
  Failure after = failure_of(send(*agents[0], "w1", request("f", ""), 0ms));
  CHECK(after.code == ErrorCode::kCancelled);
  CHECK_THROWS_AS(agents[0]->join(1s), Error);
  latch->open();  // w1's handler returns; its answer goes nowhere
  agents[1]->shutdown();
  agents[1]->shutdown();
  agents.clear();  // destructors after shutdown
}

TEST_CASE("calls to a worker that shut down fail with ConnectionError; the others go on",
          "[agent][shutdown]") {
  if (skipped_unless_workers(3)) return;
  Agents agents = make_group({"w0", "w1", "w2"});
  auto latch = std::make_shared<Gate>(kGuard);
  agents[0]->start(echo_handler());
  agents[1]->start(echo_handler());
  agents[2]->start(blocking_handler(latch));
  Future<Message> f = send(*agents[0], "w2", request("block", ""), 0ms);
  REQUIRE(latch->wait_arrived());
  // w2 leaves at once; its pool then waits for the blocked handler.
  std::thread stopper([&] { agents[2]->shutdown(); });
  Failure failure = failure_of(f);
  latch->open();
  stopper.join();
  const std::string gone = agent_factory().shut_down_peer_phrase("w2");
  CHECK(failure.kind == "ConnectionError");
  CHECK(failure.code == ErrorCode::kUnavailable);
  CHECK_THAT(failure.message, Catch::Contains("rpc to \"w2\" function \"block\": "));
  CHECK_THAT(failure.message, Catch::Contains(gone));
  for (int from : {0, 1}) {
    INFO("from w" << from);
    Failure next = failure_of(send(*agents[from], "w2", request("f", ""), kGuard));
    CHECK(next.kind == "ConnectionError");
    CHECK(next.code == ErrorCode::kUnavailable);
    CHECK_THAT(next.message, Catch::Contains("rpc to \"w2\" function \"f\": "));
    CHECK_THAT(next.message, Catch::Contains("\"w2\""));
  }
  Message got = get(send(*agents[0], "w1", request("f", "still")));
  CHECK(text(got.payload) == "still");
  got = get(send(*agents[1], "w0", request("f", "here")));
  CHECK(text(got.payload) == "here");
}

// w2 shuts down; w0 and w1 join with no timeout: what each join threw.
std::vector<std::exception_ptr> join_after_w2_shut_down() {
  Agents agents = make_group({"w0", "w1", "w2"});
  for (auto& agent : agents) agent->start(echo_handler());
  agents[2]->shutdown();
  // No timeout: the join cannot complete without w2 and must say so.
  std::vector<std::exception_ptr> errors =
      on_threads(2, [&](int rank) { agents[rank]->join(0ms); });
  return errors;
}

TEST_CASE("join fails with ConnectionError, once the workers left have met, when a worker "
          "shut down without joining",
          "[agent][join][shutdown]") {
  if (skipped_unless_workers(3) || skipped_for(Limitation::kJoinSeesWorkersThatShutDown)) {
    return;
  }
  std::vector<std::exception_ptr> errors = join_after_w2_shut_down();
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    REQUIRE(errors[rank] != nullptr);
    (void)what_thrown<ConnectionError>([&] { rethrow_first({errors[rank]}); });
  }
}

TEST_CASE("join's failure names the workers that shut down without joining",
          "[agent][join][shutdown]") {
  if (skipped_unless_workers(3) || skipped_for(Limitation::kJoinSeesWorkersThatShutDown) ||
      skipped_for(Limitation::kJoinNamesMissingWorkers)) {
    return;
  }
  std::vector<std::exception_ptr> errors = join_after_w2_shut_down();
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    CHECK_THAT(what_thrown<ConnectionError>([&] { rethrow_first({errors[rank]}); }),
               Catch::Contains("[\"w2\"] shut down without joining"));
  }
}
