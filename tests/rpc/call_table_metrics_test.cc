// CallTable's counts (rpc/metrics.h): calls sent, answered and failed by
// kind, their latency, requests served and failed, in flight and in
// progress, with exact values; and the table finding its agent's metrics
// through the pool. Ordering comes from futures, promises and the table's
// own synchronous completion, never from sleeps.
#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>

#include "common/error.h"
#include "rpc/call_table.h"
#include "rpc/metrics.h"
#include "core/remote_error.h"
#include "rpc/thread_pool.h"

namespace {

using switchboard::ConnectionError;
using switchboard::rpc::AgentMetrics;
using switchboard::rpc::CallTable;
using switchboard::rpc::FailureKind;
using switchboard::rpc::Future;
using switchboard::rpc::FunctionMetrics;
using switchboard::rpc::Message;
using switchboard::rpc::MessageType;
using switchboard::rpc::Promise;
using switchboard::rpc::RpcMetrics;
using switchboard::rpc::ThreadPool;
using switchboard::rpc::WorkerInfo;
using namespace std::chrono_literals;

constexpr std::chrono::milliseconds kLong = 30s;

RpcMetrics collect(const CallTable& table) {
  RpcMetrics m;
  table.collect_metrics(m);
  return m;
}

Message reply_of(MessageType type) {
  Message m;
  m.type = type;
  return m;
}

CallTable::Call call_to(std::string function, std::chrono::milliseconds timeout = 0ms) {
  return CallTable::Call{1, "w1", std::move(function), timeout};
}

}  // namespace

TEST_CASE("the table counts calls by function and failures by kind", "[call_table][metrics]") {
  auto pool = std::make_shared<ThreadPool>(2, "metrics-test");
  CallTable table("w0", pool);

  auto ok = table.add(call_to("f"));
  auto remote = table.add(call_to("f"));
  auto lost = table.add(call_to("g"));
  auto other = table.add(call_to("g"));
  auto timed = table.add(call_to("slow", 20ms));
  RpcMetrics m = collect(table);
  CHECK(m.calls_in_flight == 5);
  CHECK(m.functions.at("f").calls_sent == 2);
  CHECK(m.functions.at("g").calls_sent == 2);

  // complete() and fail() settle before they return: exact counts at once.
  REQUIRE(table.complete(ok.id, reply_of(MessageType::kResponse)));
  REQUIRE(table.complete(remote.id, reply_of(MessageType::kError)));
  REQUIRE(table.fail(lost.id, std::make_exception_ptr(ConnectionError("peer gone"))));
  REQUIRE(table.fail(other.id, std::make_exception_ptr(std::runtime_error("refused"))));
  CHECK(collect(table).calls_in_flight == 1);
  REQUIRE(timed.future.wait_for(kLong));  // the timer fails it
  // Taken out of the table before its future failed: never seen in flight
  // once its future is done.
  CHECK(collect(table).calls_in_flight == 0);

  auto cancelled = table.add(call_to("h"));
  CHECK(collect(table).calls_in_flight == 1);
  table.close();  // settles before it returns
  REQUIRE(cancelled.future.has_error());

  m = collect(table);
  CHECK(m.calls_in_flight == 0);
  const FunctionMetrics& f = m.functions.at("f");
  CHECK(f.calls_succeeded == 1);
  CHECK(f.failures(FailureKind::kRemoteError) == 1);
  CHECK(f.latency.count == 2);  // both were answered
  const FunctionMetrics& g = m.functions.at("g");
  CHECK(g.calls_succeeded == 0);
  CHECK(g.failures(FailureKind::kConnection) == 1);
  CHECK(g.failures(FailureKind::kOther) == 1);
  CHECK(g.latency.count == 0);  // no answer, no latency
  CHECK(m.functions.at("slow").failures(FailureKind::kTimeout) == 1);
  CHECK(m.functions.at("h").failures(FailureKind::kCancelled) == 1);
  CHECK(m.requests_in_progress == 0);
}

TEST_CASE("fail_if counts each call it fails by the error it gets", "[call_table][metrics]") {
  auto pool = std::make_shared<ThreadPool>(1, "metrics-test");
  CallTable table("w0", pool);
  auto a = table.add(call_to("f"));
  auto b = table.add(call_to("f"));
  CHECK(table.fail_if([](const CallTable::Call&) { return true; },
                      [](const CallTable::Call&) {
                        return std::make_exception_ptr(ConnectionError("left"));
                      }) == 2);
  const RpcMetrics m = collect(table);
  CHECK(m.functions.at("f").failures(FailureKind::kConnection) == 2);
  CHECK(m.calls_in_flight == 0);
}

TEST_CASE("requests served and failed are counted before the reply goes out",
          "[call_table][metrics]") {
  auto pool = std::make_shared<ThreadPool>(2, "metrics-test");
  CallTable table("w1", pool);
  Promise<Message> held(pool);
  table.start([&](Message request, const WorkerInfo&) -> Future<Message> {
    if (request.function == "boom") throw std::runtime_error("boom");
    if (request.function == "held") return held.get_future();
    return Future<Message>::ready(reply_of(MessageType::kResponse));
  });
  auto serve = [&](std::string function) {
    auto seen = std::make_shared<Promise<RpcMetrics>>(pool);
    CallTable::Request r;
    r.message.type = MessageType::kRequest;
    r.message.function = std::move(function);
    r.from = WorkerInfo{"w0", 0};
    // What the table counted when it replied: the count came first.
    r.reply = [&table, seen](Message) { seen->set_value(collect(table)); };
    REQUIRE(table.accept(std::move(r)));
    return seen->get_future();
  };
  Future<RpcMetrics> ok = serve("ok");
  REQUIRE(ok.wait_for(kLong));
  CHECK(ok.value().functions.at("ok").requests_served == 1);
  CHECK(ok.value().functions.at("ok").requests_failed == 0);
  Future<RpcMetrics> boom = serve("boom");
  REQUIRE(boom.wait_for(kLong));
  CHECK(boom.value().functions.at("boom").requests_served == 1);
  CHECK(boom.value().functions.at("boom").requests_failed == 1);

  // A request counts as in progress until its reply returns.
  REQUIRE(table.wait_idle(std::chrono::steady_clock::now() + kLong) == CallTable::Idle::kIdle);
  CHECK(collect(table).requests_in_progress == 0);
  Future<RpcMetrics> later = serve("held");  // accept() counts it at once
  RpcMetrics m = collect(table);
  CHECK(m.requests_in_progress == 1);
  CHECK((m.functions.count("held") == 0 || m.functions.at("held").requests_served == 0));
  held.set_value(reply_of(MessageType::kResponse));
  REQUIRE(later.wait_for(kLong));
  CHECK(later.value().functions.at("held").requests_served == 1);
  REQUIRE(table.wait_idle(std::chrono::steady_clock::now() + kLong) == CallTable::Idle::kIdle);
  CHECK(collect(table).requests_in_progress == 0);
  CHECK(collect(table).functions.at("ok").calls_sent == 0);
}

TEST_CASE("a table on an agent's pool counts into the agent's metrics",
          "[call_table][metrics]") {
  auto pool = std::make_shared<ThreadPool>(1, "metrics-test");
  auto metrics = std::make_shared<AgentMetrics>("w0");
  pool->set_agent_metrics(metrics);
  REQUIRE(pool->agent_metrics() == metrics);
  {
    CallTable first("w0", pool);
    CallTable second("w0", pool);
    auto a = first.add(call_to("f"));
    auto b = second.add(call_to("f"));
    REQUIRE(first.complete(a.id, reply_of(MessageType::kResponse)));
    RpcMetrics m;
    metrics->collect(m);
    CHECK(m.functions.at("f").calls_sent == 2);  // both tables, summed
    CHECK(m.functions.at("f").calls_succeeded == 1);
    CHECK(m.calls_in_flight == 1);
  }
  // Tables that are gone are no longer asked.
  RpcMetrics after;
  metrics->collect(after);
  CHECK(after.functions.empty());
}

TEST_CASE("request function names past the limit count as \"(other)\"",
          "[call_table][metrics]") {
  auto pool = std::make_shared<ThreadPool>(1, "metrics-test");
  CallTable table("w0", pool);
  for (int i = 0; i < 1030; ++i) {
    auto call = table.add(call_to("f" + std::to_string(i)));
    REQUIRE(table.complete(call.id, reply_of(MessageType::kResponse)));
  }
  const RpcMetrics m = collect(table);
  CHECK(m.functions.size() == 1025);
  CHECK(m.functions.at("(other)").calls_sent == 6);
}
