// CallTable: calls made (ids, completion, timeouts, failing by rule,
// cancellation at close), requests served (the handler on the executor,
// error replies for every way a handler can go wrong, requests held until
// start()), draining, and a concurrent mix. Ordering comes from futures and
// promises, never from sleeps; every wait is bounded by kLong.
#include "rpc/call_table.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "rpc/call_context.h"
#include "core/remote_error.h"
#include "rpc/thread_pool.h"

namespace {

using switchboard::Error;
using switchboard::ErrorCode;
using switchboard::TimeoutError;
using switchboard::rpc::CallTable;
using switchboard::rpc::Future;
using switchboard::rpc::Message;
using switchboard::rpc::MessageType;
using switchboard::rpc::Promise;
using switchboard::rpc::ThreadPool;
using switchboard::rpc::WorkerInfo;
using namespace std::chrono_literals;

constexpr std::chrono::milliseconds kLong = 30s;

struct Fixture {
  std::shared_ptr<ThreadPool> pool = std::make_shared<ThreadPool>(2, "call-table-test");
  CallTable table{"w0", pool};
};

CallTable::Call call_to(int dst, std::string function,
                        std::chrono::milliseconds timeout = 0ms) {
  return CallTable::Call{dst, "w" + std::to_string(dst), std::move(function), timeout};
}

Message response(std::string text) {
  Message m;
  m.type = MessageType::kResponse;
  m.payload.assign(text.begin(), text.end());
  return m;
}

std::string text_of(const Message& m) { return std::string(m.payload.begin(), m.payload.end()); }

// The error `f` failed with (bounded wait); fails the test when none.
std::exception_ptr error_of(const Future<Message>& f) {
  REQUIRE(f.wait_for(kLong));
  REQUIRE(f.has_error());
  return f.error();
}

std::string what_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
  return "";
}

ErrorCode code_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& x) {
    return x.code();
  } catch (...) {
  }
  FAIL("not a switchboard::Error");
  return ErrorCode::kInternal;
}

// Collects the replies a table gives, and lets a test wait for them.
struct Replies {
  std::mutex mu;
  std::vector<Message> got;
  Promise<void> first;
  std::function<void(Message)> sink() {
    return [this](Message m) {
      std::lock_guard lock(mu);
      got.push_back(std::move(m));
      if (got.size() == 1) first.set_value();
    };
  }
  Message await_first() {
    REQUIRE(first.get_future().wait_for(kLong));
    std::lock_guard lock(mu);
    return got.front();
  }
};

CallTable::Request request(uint64_t id, std::function<void(Message)> reply,
                           std::string function = "f") {
  CallTable::Request r;
  r.message.type = MessageType::kRequest;
  r.message.id = id;
  r.message.function = std::move(function);
  r.from = WorkerInfo{"w1", 1};
  r.reply = std::move(reply);
  return r;
}

// A handler that answers every request with its function name.
Future<Message> echo_function(Message request, const WorkerInfo&) {
  return Future<Message>::ready(response(request.function));
}

}  // namespace

// Runs each task on the thread that posts it.
struct InlineExecutor : switchboard::rpc::Executor {
  void post(std::function<void()> task) override { task(); }
};

TEST_CASE("a call added while the previous one's future completes is alone in the table",
          "[call_table]") {
  // A sync caller wakes as soon as its future completes and may add its next
  // call before complete() returns. Added::in_flight must not count the
  // answered call then: PIPE sends a call that is alone from the caller's
  // thread instead of handing it to the I/O thread.
  CallTable table{"w0", std::make_shared<InlineExecutor>()};
  auto a = table.add(call_to(1, "f"));
  std::optional<CallTable::Added> next;
  a.future.add_callback([&](const Future<Message>&) { next = table.add(call_to(1, "g")); });
  CHECK(table.complete(a.id, response("one")));
  REQUIRE(next.has_value());
  CHECK(next->in_flight == 1);
  CHECK(table.complete(next->id, response("two")));
  CHECK(table.load().calls_in_flight == 0);
}

TEST_CASE("add() gives ids and futures that complete() fulfils once", "[call_table]") {
  Fixture fx;
  auto a = fx.table.add(call_to(1, "f"));
  auto b = fx.table.add(call_to(2, "g"));
  CHECK(a.id != b.id);
  CHECK(a.in_flight == 1);
  CHECK(b.in_flight == 2);
  CHECK(fx.table.destination(b.id) == 2);
  CHECK(fx.table.complete(a.id, response("one")));
  CHECK_FALSE(fx.table.complete(a.id, response("again")));
  REQUIRE(a.future.wait_for(kLong));
  CHECK(text_of(a.future.value()) == "one");
  CHECK_FALSE(fx.table.destination(a.id).has_value());
  CHECK(fx.table.load().calls_in_flight == 1);
  CHECK(fx.table.complete(b.id, response("two")));
  CHECK(fx.table.load().calls_in_flight == 0);
}

TEST_CASE("complete() from another worker than the callee is dropped", "[call_table]") {
  Fixture fx;
  auto a = fx.table.add(call_to(1, "f"));
  CHECK_FALSE(fx.table.complete(a.id, response("x"), 2));
  CHECK_FALSE(a.future.done());
  CHECK(fx.table.complete(a.id, response("y"), 1));
  REQUIRE(a.future.wait_for(kLong));
  CHECK(text_of(a.future.value()) == "y");
}

TEST_CASE("a call that is not answered within its timeout fails naming it", "[call_table]") {
  Fixture fx;
  auto slow = fx.table.add(call_to(3, "step", 20ms));
  auto patient = fx.table.add(call_to(3, "step", kLong));
  auto e = error_of(slow.future);
  CHECK_THROWS_AS(std::rethrow_exception(e), TimeoutError);
  CHECK(what_of(e) == "rpc to \"w3\" function \"step\": timed out after 20 ms");
  CHECK_FALSE(fx.table.complete(slow.id, response("late")));
  CHECK(fx.table.complete(patient.id, response("on time")));
  REQUIRE(patient.future.wait_for(kLong));
  CHECK_FALSE(patient.future.has_error());
}

TEST_CASE("an earlier deadline added later still fires first", "[call_table]") {
  Fixture fx;
  auto late = fx.table.add(call_to(1, "late", kLong));
  auto early = fx.table.add(call_to(1, "early", 10ms));
  error_of(early.future);
  CHECK_FALSE(late.future.done());
  CHECK(fx.table.complete(late.id, response("ok")));
}

TEST_CASE("a negative timeout is refused naming the call", "[call_table]") {
  Fixture fx;
  CHECK_THROWS_WITH(fx.table.add(call_to(1, "f", -1ms)),
                    "rpc to \"w1\" function \"f\": negative timeout -1 ms");
}

TEST_CASE("fail_if() fails the calls its rule picks, and only those", "[call_table]") {
  Fixture fx;
  auto to1 = fx.table.add(call_to(1, "f"));
  auto to2 = fx.table.add(call_to(2, "g"));
  auto to1b = fx.table.add(call_to(1, "h", kLong));
  const size_t n = fx.table.fail_if(
      [](const CallTable::Call& c) { return c.dst == 1; },
      [](const CallTable::Call& c) {
        return std::make_exception_ptr(switchboard::ConnectionError(
            fmt::format("{} lost", c.function)));
      });
  CHECK(n == 2);
  CHECK(what_of(error_of(to1.future)) == "f lost");
  CHECK(what_of(error_of(to1b.future)) == "h lost");
  CHECK_FALSE(to2.future.done());
  CHECK(fx.table.load().calls_in_flight == 1);
  CHECK(fx.table.fail(to2.id, std::make_exception_ptr(std::runtime_error("gone"))));
  CHECK(what_of(error_of(to2.future)) == "gone");
  CHECK_FALSE(fx.table.fail(to2.id, std::make_exception_ptr(std::runtime_error("twice"))));
}

TEST_CASE("close() cancels pending calls and refuses new ones", "[call_table]") {
  Fixture fx;
  auto a = fx.table.add(call_to(1, "f", kLong));
  fx.table.close();
  auto e = error_of(a.future);
  CHECK(code_of(e) == ErrorCode::kCancelled);
  CHECK(what_of(e) == "rpc to \"w1\" function \"f\": rpc agent \"w0\" shut down");
  CHECK(fx.table.closed());
  try {
    fx.table.add(call_to(2, "g"));
    FAIL("add() after close() did not throw");
  } catch (const Error& x) {
    CHECK(x.code() == ErrorCode::kCancelled);
    CHECK(std::string(x.what()) == "rpc to \"w2\" function \"g\": rpc agent \"w0\" shut down");
  }
  Replies replies;
  CHECK_FALSE(fx.table.accept(request(7, replies.sink())));
  CHECK(fx.table.wait_idle(std::nullopt) == CallTable::Idle::kClosed);
  fx.table.close();  // idempotent
}

TEST_CASE("requests accepted before start() are served once it is called",
          "[call_table]") {
  Fixture fx;
  Replies replies;
  REQUIRE(fx.table.accept(request(41, replies.sink(), "early")));
  CHECK(fx.table.load().handling == 1);
  CHECK_FALSE(fx.table.started());
  fx.table.start(echo_function);
  CHECK(fx.table.started());
  Message m = replies.await_first();
  CHECK(m.id == 41);
  CHECK(m.type == MessageType::kResponse);
  CHECK(text_of(m) == "early");
  CHECK(fx.table.wait_idle(std::chrono::steady_clock::now() + kLong) ==
        CallTable::Idle::kIdle);
}

TEST_CASE("start() refuses an empty handler, a second call and a closed table",
          "[call_table]") {
  Fixture fx;
  CHECK_THROWS_WITH(fx.table.start(nullptr), "rpc agent \"w0\": start() with an empty handler");
  fx.table.start(echo_function);
  CHECK_THROWS_WITH(fx.table.start(echo_function), "rpc agent \"w0\": start() called twice");
  Fixture closed;
  closed.table.close();
  CHECK_THROWS_WITH(closed.table.start(echo_function),
                    "rpc agent \"w0\": start() after shutdown()");
}

namespace {

// The reply a table gives for one request to `handler`.
Message serve_one(switchboard::rpc::RpcAgent::RequestHandler handler,
                  std::function<void(Message&)> prepare = nullptr) {
  Fixture fx;
  fx.table.start(std::move(handler));
  Replies replies;
  auto r = request(9, replies.sink());
  r.prepare = std::move(prepare);
  REQUIRE(fx.table.accept(std::move(r)));
  Message m = replies.await_first();
  CHECK(fx.table.wait_idle(std::chrono::steady_clock::now() + kLong) ==
        CallTable::Idle::kIdle);
  return m;
}

// The remote error an error reply carries (and that it is one, for call 9).
switchboard::rpc::RemoteError remote_of(const Message& m) {
  CHECK(m.type == MessageType::kError);
  CHECK(m.id == 9);
  return switchboard::rpc::decode_remote_error(m);
}

}  // namespace

TEST_CASE("every way a handler fails becomes an error reply naming this worker",
          "[call_table]") {
  SECTION("it throws") {
    auto e = remote_of(serve_one([](Message, const WorkerInfo&) -> Future<Message> {
      throw std::invalid_argument("bad argument 3");
    }));
    CHECK(e.worker() == "w0");
    CHECK(e.remote_message() == "bad argument 3");
  }
  SECTION("it returns an invalid future") {
    auto e = remote_of(serve_one([](Message, const WorkerInfo&) { return Future<Message>(); }));
    CHECK_THAT(e.remote_message(), Catch::Contains("invalid future"));
  }
  SECTION("its future fails later") {
    auto pending = std::make_shared<Promise<Message>>();
    std::thread failer;
    auto e = remote_of(serve_one([&](Message, const WorkerInfo&) {
      failer = std::thread([pending] {
        pending->set_error(std::make_exception_ptr(std::runtime_error("async failure")));
      });
      return pending->get_future();
    }));
    failer.join();
    CHECK(e.remote_message() == "async failure");
  }
  SECTION("it answers with a request") {
    auto e = remote_of(serve_one([](Message m, const WorkerInfo&) {
      return Future<Message>::ready(std::move(m));
    }));
    CHECK_THAT(e.remote_message(), Catch::Contains("answered with message type 1"));
  }
  SECTION("it answers naming a function") {
    auto e = remote_of(serve_one([](Message m, const WorkerInfo&) {
      Message answer = response("x");
      answer.function = m.function;
      return Future<Message>::ready(std::move(answer));
    }));
    CHECK_THAT(e.remote_message(), Catch::Contains("answered naming function \"f\""));
  }
  SECTION("preparing the request throws") {
    bool ran = false;
    auto e = remote_of(serve_one(
        [&](Message m, const WorkerInfo&) {
          ran = true;
          return echo_function(std::move(m), {});
        },
        [](Message&) { throw std::invalid_argument("tensor 0 is for cuda:3"); }));
    CHECK_FALSE(ran);
    CHECK(e.remote_message() == "tensor 0 is for cuda:3");
  }
}

TEST_CASE("a reply the agent cannot send is followed by an error reply saying why",
          "[call_table]") {
  Fixture f;
  f.table.start(&echo_function);
  Replies replies;
  auto sink = replies.sink();
  int tries = 0;
  REQUIRE(f.table.accept(request(4, [&](Message m) {
    if (++tries == 1) throw std::invalid_argument("tensor 0 cannot be encoded");
    sink(std::move(m));
  })));
  Message m = replies.await_first();
  CHECK(tries == 2);
  REQUIRE(m.type == MessageType::kError);
  CHECK(m.id == 4);
  auto e = switchboard::rpc::decode_remote_error(m);
  CHECK(e.worker() == "w0");
  CHECK(e.remote_message() == "tensor 0 cannot be encoded");
  CHECK(f.table.wait_idle(std::chrono::steady_clock::now() + kLong) ==
        CallTable::Idle::kIdle);
}

TEST_CASE("the handler gets the request and its sender; the reply keeps the id",
          "[call_table]") {
  WorkerInfo seen;
  Message m = serve_one([&](Message request, const WorkerInfo& from) {
    seen = from;
    return Future<Message>::ready(response(request.function + "!"));
  });
  CHECK(seen == WorkerInfo{"w1", 1});
  CHECK(m.id == 9);
  CHECK(text_of(m) == "f!");
}

TEST_CASE("wait_idle() waits for calls and for handlers, bounded by its deadline",
          "[call_table]") {
  Fixture fx;
  auto deadline = [] { return std::chrono::steady_clock::now() + 10ms; };
  CHECK(fx.table.wait_idle(deadline()) == CallTable::Idle::kIdle);
  auto a = fx.table.add(call_to(1, "f"));
  CHECK(fx.table.wait_idle(deadline()) == CallTable::Idle::kTimedOut);
  std::thread completer([&] { fx.table.complete(a.id, response("x")); });
  CHECK(fx.table.wait_idle(std::chrono::steady_clock::now() + kLong) ==
        CallTable::Idle::kIdle);
  completer.join();

  // A handler whose future is not done yet holds the table busy.
  Promise<Message> answer;
  fx.table.start([&](Message, const WorkerInfo&) { return answer.get_future(); });
  Replies replies;
  REQUIRE(fx.table.accept(request(5, replies.sink())));
  CHECK(fx.table.wait_idle(deadline()) == CallTable::Idle::kTimedOut);
  CHECK(fx.table.load().handling == 1);
  answer.set_value(response("done"));
  CHECK(fx.table.wait_idle(std::chrono::steady_clock::now() + kLong) ==
        CallTable::Idle::kIdle);
  CHECK(replies.await_first().id == 5);
}

TEST_CASE("at debug level, wait_idle() logs whom it waits on", "[call_table]") {
  std::ostringstream out;
  auto previous = spdlog::default_logger();
  auto logger = std::make_shared<spdlog::logger>(
      "call_table_test", std::make_shared<spdlog::sinks::ostream_sink_mt>(out));
  logger->set_level(spdlog::level::debug);
  spdlog::set_default_logger(logger);
  {
    Fixture fx;
    auto a = fx.table.add(call_to(1, "slow"));
    CHECK(fx.table.wait_idle(std::chrono::steady_clock::now() + 10ms) ==
          CallTable::Idle::kTimedOut);
    fx.table.complete(a.id, response("x"));
  }
  spdlog::set_default_logger(previous);
  const std::string text = out.str();
  INFO(text);
  const std::string waits =
      "1 call in flight (to \"w1\": \"slow\" (id 1)) and 0 requests being handled";
  CHECK(text.find("rpc agent \"w0\": waiting for " + waits) != std::string::npos);
  CHECK(text.find("rpc agent \"w0\": stopped waiting at the deadline for " + waits) !=
        std::string::npos);
}

TEST_CASE("drain() returns when idle, names what is in flight at its timeout, and "
          "is cancelled by close()",
          "[call_table]") {
  Fixture fx;
  fx.table.drain(10ms, "join on rpc worker \"w0\"");
  auto a = fx.table.add(call_to(1, "f"));
  try {
    fx.table.drain(10ms, "join on rpc worker \"w0\"");
    FAIL("drain() returned with a call in flight");
  } catch (const TimeoutError& e) {
    CHECK(std::string(e.what()) ==
          "join on rpc worker \"w0\": timed out after 10 ms with 1 calls in flight and 0 "
          "requests being handled");
  }
  std::thread closer([&] { fx.table.close(); });
  try {
    fx.table.drain(0ms, "join on rpc worker \"w0\"");
    FAIL("drain() returned on a closed table");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kCancelled);
    CHECK(std::string(e.what()) ==
          "join on rpc worker \"w0\": rpc agent \"w0\" shut down");
  }
  closer.join();
  (void)a;
}

TEST_CASE("close() wakes a wait_idle() that waits for ever", "[call_table]") {
  Fixture fx;
  fx.table.add(call_to(1, "f"));
  std::thread closer([&] { fx.table.close(); });
  CHECK(fx.table.wait_idle(std::nullopt) == CallTable::Idle::kClosed);
  closer.join();
}

TEST_CASE("a handler that answers after its table is gone is dropped", "[call_table]") {
  auto pool = std::make_shared<ThreadPool>(2, "call-table-test");
  Promise<Message> answer;
  Promise<void> handled;
  std::atomic<int> replies{0};
  {
    CallTable table("w0", pool);
    table.start([&](Message, const WorkerInfo&) {
      handled.set_value();
      return answer.get_future();
    });
    REQUIRE(table.accept(request(1, [&](Message) { ++replies; })));
    REQUIRE(handled.get_future().wait_for(kLong));
  }
  answer.set_value(response("late"));
  pool->shutdown();
  CHECK(replies == 0);
}

TEST_CASE("concurrent calls, answers and timeouts complete every future once",
          "[call_table]") {
  Fixture fx;
  constexpr int kThreads = 4;
  constexpr int kCalls = 500;
  std::vector<std::thread> threads;
  std::vector<std::vector<CallTable::Added>> added(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCalls; ++i) {
        // Every third call is never answered and times out (1 ms).
        auto a = fx.table.add(call_to(t, "f", i % 3 == 0 ? 1ms : kLong));
        if (i % 3 != 0) fx.table.complete(a.id, response(std::to_string(i)));
        added[t].push_back(std::move(a));
      }
    });
  }
  for (auto& thread : threads) thread.join();
  int answered = 0;
  int failed = 0;
  for (auto& per_thread : added) {
    for (auto& a : per_thread) {
      REQUIRE(a.future.wait_for(kLong));
      if (a.future.has_error()) {
        ++failed;
      } else {
        ++answered;
      }
    }
  }
  const int unanswered = kThreads * ((kCalls + 2) / 3);
  CHECK(failed == unanswered);
  CHECK(answered == kThreads * kCalls - unanswered);
  CHECK(fx.table.wait_idle(std::chrono::steady_clock::now() + kLong) ==
        CallTable::Idle::kIdle);
}

TEST_CASE("a handler that answers after close() is not replied to, and stops counting",
          "[call_table]") {
  Fixture fx;
  Promise<Message> answer;
  Promise<void> handled;
  std::atomic<int> replies{0};
  fx.table.start([&](Message, const WorkerInfo&) {
    handled.set_value();
    return answer.get_future();
  });
  REQUIRE(fx.table.accept(request(1, [&](Message) { ++replies; })));
  REQUIRE(handled.get_future().wait_for(kLong));
  fx.table.close();
  answer.set_value(response("late"));
  fx.pool->shutdown();  // runs the reply callback
  CHECK(replies == 0);
  CHECK(fx.table.load().handling == 0);
}

TEST_CASE("a handler sees its call's context: caller, deadline, and cancellation when its "
          "caller is gone",
          "[call_table][context]") {
  Fixture fx;
  Promise<void> go;
  Future<void> released = go.get_future();
  std::atomic<int> seen_before{-1};
  std::atomic<int> seen_after{-1};
  std::atomic<bool> had_deadline{false};
  std::string caller;
  Promise<void> entered;
  fx.table.start([&](Message m, const WorkerInfo&) {
    // No Catch2 assertion here: this is a pool thread.
    const switchboard::rpc::CallContext* call = switchboard::rpc::current_call();
    if (call == nullptr) return Future<Message>::ready(response("no context"));
    if (m.function == "slow") {
      caller = call->caller.name;
      had_deadline = call->deadline.has_value();
      seen_before = call->cancelled();
      entered.set_value();
      (void)released.wait_for(kLong);
      seen_after = call->cancelled();
    }
    return Future<Message>::ready(response("ok"));
  });
  Replies replies;
  CallTable::Request slow = request(1, replies.sink(), "slow");
  slow.message.timeout_ms = 60'000;
  REQUIRE(fx.table.accept(std::move(slow)));
  REQUIRE(entered.get_future().wait_for(kLong));
  // Another peer going away cancels nothing of w1's.
  fx.table.cancel_requests_from(2);
  // w1 going away does.
  fx.table.cancel_requests_from(1);
  go.set_value();
  CHECK(text_of(replies.await_first()) == "ok");
  CHECK(caller == "w1");
  CHECK(had_deadline);
  CHECK(seen_before == 0);
  CHECK(seen_after == 1);
  // A request that arrives after its caller came back starts uncancelled,
  // and one whose deadline has passed is cancelled.
  Replies more;
  std::atomic<int> fresh{-1};
  Fixture fx2;
  fx2.table.start([&](Message, const WorkerInfo&) {
    const switchboard::rpc::CallContext* call = switchboard::rpc::current_call();
    fresh = call == nullptr ? -2 : call->cancelled();
    return Future<Message>::ready(response("ok"));
  });
  fx2.table.cancel_requests_from(1);
  REQUIRE(fx2.table.accept(request(2, more.sink(), "f")));
  more.await_first();
  CHECK(fresh == 0);
  switchboard::rpc::CallContext past;
  past.deadline = std::chrono::steady_clock::now() - 1ms;
  CHECK(past.cancelled());
}
