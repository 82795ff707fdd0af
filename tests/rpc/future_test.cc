// Future, Promise and ThreadPool: completion paths, callbacks and their
// threads, then() chaining, abandoned promises, concurrency, pool growth
// under nested waits, and shutdown. Ordering comes from latches and
// promises, never from sleeps; every wait is bounded by kLong so a bug fails
// the test instead of hanging it.
#include "rpc/future.h"

#include <pthread.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <latch>
#include <memory>
#include <stdexcept>
#include <string>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "common/error.h"
#include "rpc/thread_pool.h"

namespace {

using switchboard::Error;
using switchboard::ErrorCode;
using switchboard::rpc::Future;
using switchboard::rpc::Promise;
using switchboard::rpc::ThreadPool;
using namespace std::chrono_literals;

constexpr std::chrono::milliseconds kLong = 30s;

// The code of the switchboard::Error that `f` throws.
template <typename F>
ErrorCode code_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  FAIL("no switchboard::Error was thrown");
  return ErrorCode::kInternal;
}

// Waits (bounded) and returns the value.
template <typename T>
const T& await(const Future<T>& f) {
  REQUIRE(f.wait_for(kLong));
  return f.value();
}

std::exception_ptr runtime_error(const char* what) {
  return std::make_exception_ptr(std::runtime_error(what));
}

}  // namespace

TEST_CASE("a promise's value reaches every future of its state", "[future]") {
  Promise<std::string> p;
  Future<std::string> a = p.get_future();
  Future<std::string> b = a;  // NOLINT(performance-unnecessary-copy-initialization)
  REQUIRE(a.valid());
  REQUIRE_FALSE(a.done());
  REQUIRE_FALSE(p.is_completed());
  REQUIRE(p.set_value("hello"));
  REQUIRE(p.is_completed());
  REQUIRE(a.done());
  REQUIRE(b.done());
  REQUIRE(a.value() == "hello");
  REQUIRE(p.get_future().value() == "hello");
  REQUIRE_FALSE(a.has_error());
  REQUIRE(a.error() == nullptr);
}

TEST_CASE("an error set on a promise is rethrown by value()", "[future]") {
  Promise<int> p;
  Future<int> f = p.get_future();
  REQUIRE(f.error() == nullptr);  // pending: no error yet
  REQUIRE(p.set_error(std::make_exception_ptr(switchboard::TimeoutError("late"))));
  REQUIRE(f.done());
  REQUIRE(f.has_error());
  REQUIRE_THROWS_AS(f.value(), switchboard::TimeoutError);
  REQUIRE_THROWS_WITH(f.value(), "late");
  f.wait();  // wait() never throws the error
}

TEST_CASE("Future<void> completes with set_value() and with an error", "[future]") {
  Promise<void> ok;
  Future<void> f = ok.get_future();
  REQUIRE(ok.set_value());
  REQUIRE(f.done());
  REQUIRE_NOTHROW(f.value());

  Promise<void> bad;
  REQUIRE(bad.set_error(runtime_error("void failed")));
  REQUIRE_THROWS_WITH(bad.get_future().value(), "void failed");
  REQUIRE_FALSE(bad.set_value());
}

TEST_CASE("wait_for() returns false before completion and true after", "[future]") {
  Promise<int> p;
  Future<int> f = p.get_future();
  REQUIRE_FALSE(f.wait_for(1ms));
  REQUIRE_FALSE(f.wait_for(0ms));
  std::thread setter([p] { p.set_value(7); });
  REQUIRE(f.wait_for(kLong));
  setter.join();
  REQUIRE(f.wait_for(0ms));
  REQUIRE(f.value() == 7);
}

TEST_CASE("set_value() and set_error() return false once completed", "[future]") {
  Promise<int> p;
  REQUIRE(p.set_value(1));
  REQUIRE_FALSE(p.set_value(2));
  REQUIRE_FALSE(p.set_error(runtime_error("too late")));
  REQUIRE(p.get_future().value() == 1);

  Promise<int> q;
  REQUIRE(q.set_error(runtime_error("first")));
  REQUIRE_FALSE(q.set_value(3));
  REQUIRE_THROWS_WITH(q.get_future().value(), "first");
}

TEST_CASE("ready() and failed() futures are already complete", "[future]") {
  Future<int> r = Future<int>::ready(5);
  REQUIRE(r.done());
  REQUIRE(r.value() == 5);
  Future<void> v = Future<void>::ready();
  REQUIRE(v.done());
  REQUIRE_NOTHROW(v.value());
  Future<int> e = Future<int>::failed(runtime_error("nope"));
  REQUIRE(e.done());
  REQUIRE(e.has_error());
  REQUIRE_THROWS_WITH(e.value(), "nope");
  Future<void> ve = Future<void>::failed(runtime_error("void nope"));
  REQUIRE_THROWS_WITH(ve.value(), "void nope");
}

TEST_CASE("an invalid future, a moved-from promise and null errors are caller bugs",
          "[future]") {
  Future<int> invalid;
  REQUIRE_FALSE(invalid.valid());
  REQUIRE_THROWS_AS(invalid.wait(), std::invalid_argument);
  REQUIRE_THROWS_AS(invalid.done(), std::invalid_argument);
  REQUIRE_THROWS_AS(invalid.value(), std::invalid_argument);
  REQUIRE_THROWS_AS(invalid.add_callback([](const Future<int>&) {}),
                    std::invalid_argument);

  Promise<int> p;
  Promise<int> moved = std::move(p);
  // NOLINTNEXTLINE(bugprone-use-after-move): using it is the point
  REQUIRE_THROWS_AS(p.set_value(1), std::invalid_argument);
  REQUIRE_THROWS_AS(moved.set_error(nullptr), std::invalid_argument);
  REQUIRE_THROWS_AS(Future<int>::failed(nullptr), std::invalid_argument);
  REQUIRE(moved.set_value(2));
}

TEST_CASE("a promise whose last handle is destroyed fails its future with kCancelled",
          "[future]") {
  Future<int> f;
  {
    Promise<int> p;
    f = p.get_future();
    {
      // Destroying one copy abandons nothing.
      Promise<int> copy = p;  // NOLINT(performance-unnecessary-copy-initialization)
    }
    REQUIRE_FALSE(f.done());
  }
  REQUIRE(f.done());
  REQUIRE(code_of([&] { (void)f.value(); }) == ErrorCode::kCancelled);
  REQUIRE_THROWS_WITH(f.value(), Catch::Contains("promise abandoned"));

  SECTION("a completed promise is not failed when it goes away") {
    Future<int> g;
    {
      Promise<int> p;
      g = p.get_future();
      p.set_value(3);
    }
    REQUIRE(g.value() == 3);
  }
  SECTION("the abandonment reaches then() continuations") {
    Future<int> chained;
    {
      Promise<int> p;
      chained = p.get_future().then([](const Future<int>& f) { return f.value() + 1; });
    }
    REQUIRE(code_of([&] { (void)chained.value(); }) == ErrorCode::kCancelled);
  }
}

TEST_CASE(
    "callbacks added before completion run once, in order, on the completing thread",
    "[future][callback]") {
  Promise<int> p;
  std::vector<int> order;
  std::thread::id ran_on;
  for (int i = 0; i < 3; ++i) {
    p.get_future().add_callback([&order, &ran_on, i](const Future<int>& f) {
      order.push_back(i * 10 + f.value());
      ran_on = std::this_thread::get_id();
    });
  }
  REQUIRE(order.empty());
  std::thread completer([p] { p.set_value(1); });
  completer.join();
  REQUIRE(order == std::vector<int>{1, 11, 21});
  REQUIRE(ran_on != std::this_thread::get_id());
  REQUIRE_FALSE(p.set_value(2));  // no second run
  REQUIRE(order.size() == 3);
}

TEST_CASE("add_callback() after completion runs immediately on the calling thread",
          "[future][callback]") {
  Future<int> f = Future<int>::ready(4);
  int seen = 0;
  std::thread::id ran_on;
  f.add_callback([&](const Future<int>& done) {
    seen = done.value();
    ran_on = std::this_thread::get_id();
  });
  REQUIRE(seen == 4);
  REQUIRE(ran_on == std::this_thread::get_id());
}

TEST_CASE("a callback that throws is logged and the others still run",
          "[future][callback]") {
  Promise<int> p;
  bool second_ran = false;
  p.get_future().add_callback([](const Future<int>&) {
    throw std::runtime_error("callback failure (expected)");
  });
  p.get_future().add_callback([&](const Future<int>&) { second_ran = true; });
  REQUIRE(p.set_value(1));
  REQUIRE(second_ran);
}

TEST_CASE("then() maps values and chains", "[future][then]") {
  Promise<int> p;
  Future<std::string> text = p.get_future().then(
      [](const Future<int>& f) { return std::to_string(f.value() * 2); });
  Future<size_t> length =
      text.then([](const Future<std::string>& f) { return f.value().size(); });
  Future<void> done = length.then([](const Future<size_t>& f) { (void)f.value(); });
  REQUIRE_FALSE(length.done());
  p.set_value(21);
  REQUIRE(text.value() == "42");
  REQUIRE(length.value() == 2);
  REQUIRE_NOTHROW(done.value());
}

TEST_CASE("then() hands the source's error to f and the result fails with it",
          "[future][then]") {
  Promise<int> p;
  bool f_ran = false;
  Future<int> next = p.get_future().then([&](const Future<int>& f) {
    f_ran = true;
    return f.value() + 1;  // rethrows the source's error
  });
  p.set_error(std::make_exception_ptr(switchboard::ConnectionError("peer gone")));
  REQUIRE(f_ran);
  REQUIRE(code_of([&] { (void)next.value(); }) == ErrorCode::kUnavailable);

  SECTION("f may recover from the error") {
    Future<int> recovered = p.get_future().then(
        [](const Future<int>& f) { return f.has_error() ? -1 : f.value(); });
    REQUIRE(recovered.value() == -1);
  }
}

TEST_CASE("an exception thrown in then()'s f fails the result future", "[future][then]") {
  Future<int> source = Future<int>::ready(1);
  Future<int> thrown =
      source.then([](const Future<int>&) -> int { throw std::out_of_range("f threw"); });
  REQUIRE(thrown.has_error());
  REQUIRE_THROWS_AS(thrown.value(), std::out_of_range);

  Future<void> void_thrown = source.then(
      [](const Future<int>&) { throw Error(ErrorCode::kNotFound, "missing"); });
  REQUIRE(code_of([&] { void_thrown.value(); }) == ErrorCode::kNotFound);
}

TEST_CASE("then() flattens a future returned by f", "[future][then]") {
  Promise<int> outer;
  Promise<std::string> inner;
  Future<std::string> flat = outer.get_future().then(
      [inner](const Future<int>& f) { return inner.get_future(); });
  static_assert(std::is_same_v<decltype(flat), Future<std::string>>);
  outer.set_value(1);
  REQUIRE_FALSE(flat.done());  // waits for the inner future
  inner.set_value("inner");
  REQUIRE(flat.value() == "inner");

  SECTION("an inner error fails the flattened future") {
    Promise<void> failing;
    Future<void> flat_void = Future<int>::ready(0).then(
        [failing](const Future<int>&) { return failing.get_future(); });
    REQUIRE_FALSE(flat_void.done());
    failing.set_error(runtime_error("inner failed"));
    REQUIRE_THROWS_WITH(flat_void.value(), "inner failed");
  }
  SECTION("an invalid inner future fails it with invalid_argument") {
    Future<int> bad =
        Future<int>::ready(0).then([](const Future<int>&) { return Future<int>(); });
    REQUIRE_THROWS_AS(bad.value(), std::invalid_argument);
  }
}

TEST_CASE("then() accepts a move-only function", "[future][then]") {
  auto owned = std::make_unique<int>(9);
  Future<int> result = Future<int>::ready(1).then(
      [owned = std::move(owned)](const Future<int>& f) { return *owned + f.value(); });
  REQUIRE(result.value() == 10);
}

TEST_CASE("callbacks of a promise with an executor run on the pool", "[future][pool]") {
  auto pool = std::make_shared<ThreadPool>(2, "callbacks");
  Promise<int> p(pool);
  Promise<ThreadPool*> before;
  Promise<ThreadPool*> after;
  p.get_future().add_callback(
      [before](const Future<int>&) { before.set_value(ThreadPool::current()); });
  Future<ThreadPool*> then_ran_on = p.get_future().then([](const Future<int>& f) {
    (void)f.value();
    return ThreadPool::current();
  });
  Future<ThreadPool*> chained_ran_on =
      then_ran_on.then([](const Future<ThreadPool*>&) { return ThreadPool::current(); });
  std::thread completer([p] { p.set_value(1); });
  completer.join();
  p.get_future().add_callback(
      [after](const Future<int>&) { after.set_value(ThreadPool::current()); });
  REQUIRE(await(before.get_future()) == pool.get());
  REQUIRE(await(after.get_future()) == pool.get());
  REQUIRE(await(then_ran_on) == pool.get());
  REQUIRE(await(chained_ran_on) == pool.get());
  REQUIRE(ThreadPool::current() == nullptr);
}

TEST_CASE("then_inline() runs f on the completing thread and its result's callbacks on "
          "the pool",
          "[future][pool][then]") {
  auto pool = std::make_shared<ThreadPool>(2, "inline");
  Promise<int> p(pool);
  std::thread::id f_thread;
  Future<int> doubled = p.get_future().then_inline([&](const Future<int>& f) {
    f_thread = std::this_thread::get_id();
    return f.value() * 2;
  });
  Promise<ThreadPool*> callback_ran_on;
  doubled.add_callback([callback_ran_on](const Future<int>&) {
    callback_ran_on.set_value(ThreadPool::current());
  });
  std::thread::id completer_id;
  std::thread completer([&] {
    completer_id = std::this_thread::get_id();
    p.set_value(21);
  });
  completer.join();
  // f ran inside set_value(), on the completer, not on the pool.
  REQUIRE(doubled.done());
  CHECK(f_thread == completer_id);
  CHECK(await(doubled) == 42);
  CHECK(await(callback_ran_on.get_future()) == pool.get());
  // Already complete: f runs on the calling thread, errors still propagate.
  Future<int> failed = p.get_future().then_inline([](const Future<int>&) -> int {
    throw std::runtime_error("decode failed");
  });
  REQUIRE(failed.done());
  CHECK_THROWS_WITH(failed.value(), "decode failed");
}

TEST_CASE("a callback refused by a shut-down executor runs inline", "[future][pool]") {
  auto pool = std::make_shared<ThreadPool>(1, "closed");
  pool->shutdown();
  Promise<int> p(pool);
  std::thread::id ran_on;
  p.get_future().add_callback(
      [&](const Future<int>&) { ran_on = std::this_thread::get_id(); });
  REQUIRE(p.set_value(1));
  REQUIRE(ran_on == std::this_thread::get_id());
}

TEST_CASE("many threads completing, waiting and adding callbacks see one result",
          "[future][concurrency]") {
  constexpr int kRounds = 200;
  constexpr std::ptrdiff_t kPerRole = 4;
  for (int round = 0; round < kRounds; ++round) {
    Promise<int> p;
    Future<int> f = p.get_future();
    std::latch start(3 * kPerRole);
    std::atomic<int> winners{0};
    std::atomic<int> callbacks{0};
    std::vector<int> seen(kPerRole, -2);
    std::vector<std::thread> threads;
    for (int t = 0; t < kPerRole; ++t) {
      threads.emplace_back([&, t] {
        start.arrive_and_wait();
        bool won = t % 2 == 0 ? p.set_value(t) : p.set_error(runtime_error("lost"));
        if (won) ++winners;
      });
      threads.emplace_back([&, t] {
        start.arrive_and_wait();
        f.wait();
        seen[t] = f.has_error() ? -1 : f.value();
      });
      threads.emplace_back([&] {
        start.arrive_and_wait();
        f.add_callback([&](const Future<int>&) { ++callbacks; });
      });
    }
    for (auto& t : threads) t.join();
    REQUIRE(winners == 1);
    REQUIRE(callbacks == kPerRole);
    int expected = f.has_error() ? -1 : f.value();
    for (int v : seen) REQUIRE(v == expected);
  }
}

TEST_CASE("pool threads carry the pool's name, truncated to 15 characters", "[pool]") {
  ThreadPool pool(1, "a-very-long-pool-name");
  REQUIRE(pool.name() == "a-very-long-pool-name");
  Promise<std::string> name;
  pool.post([name] {
    char buf[32] = {};
    pthread_getname_np(pthread_self(), buf, sizeof buf);
    name.set_value(buf);
  });
  REQUIRE(await(name.get_future()) == "a-very-long-poo");
}

TEST_CASE("a one-thread pool starts tasks in the order they were posted", "[pool]") {
  std::vector<int> order;
  {
    ThreadPool pool(1, "fifo");
    for (int i = 0; i < 50; ++i) pool.post([&order, i] { order.push_back(i); });
  }  // the destructor drains and joins
  REQUIRE(order.size() == 50);
  for (int i = 0; i < 50; ++i) REQUIRE(order[i] == i);
}

TEST_CASE("a task that throws does not stop the pool", "[pool]") {
  ThreadPool pool(1, "throws");
  pool.post([] { throw std::runtime_error("task failure (expected)"); });
  Promise<bool> after;
  pool.post([after] { after.set_value(true); });
  REQUIRE(await(after.get_future()));
}

TEST_CASE("bad pool sizes and empty tasks are caller bugs", "[pool]") {
  REQUIRE_THROWS_AS(ThreadPool(0, "none"), std::invalid_argument);
  REQUIRE_THROWS_AS(ThreadPool(4, "small-max", 2), std::invalid_argument);
  ThreadPool pool(1, "empty-task");
  REQUIRE_THROWS_AS(pool.post(nullptr), std::invalid_argument);
}

// post() wakes one idle thread at a time and each woken thread wakes the
// next while work is queued; a burst of tasks that only finish once all of
// them have started must therefore still start on every idle thread.
TEST_CASE("a burst of tasks that wait for each other starts on every idle thread",
          "[pool]") {
  constexpr int kTasks = 8;
  ThreadPool pool(kTasks, "burst", kTasks);  // no growth: only the idle threads
  // Start every thread once so that all of them are idle in their wait.
  std::vector<Promise<void>> warm(kTasks);
  for (auto& p : warm) pool.post([p] { p.set_value(); });
  for (auto& p : warm) REQUIRE(p.get_future().wait_for(kLong));
  std::mutex mu;
  std::condition_variable cv;
  int started = 0;
  std::vector<Promise<bool>> all_met(kTasks);
  for (int i = 0; i < kTasks; ++i) {
    pool.post([&, done = all_met[i]] {
      std::unique_lock lock(mu);
      ++started;
      cv.notify_all();
      done.set_value(cv.wait_for(lock, kLong, [&] { return started == kTasks; }));
    });
  }
  for (auto& p : all_met) REQUIRE(await(p.get_future()));
}

TEST_CASE("a pool of 2 threads runs 8 tasks that each wait for the next one",
          "[pool][growth]") {
  constexpr int kTasks = 8;
  constexpr size_t kMax = 16;
  std::vector<Promise<void>> done(kTasks);
  ThreadPool pool(2, "nested", kMax);
  REQUIRE(pool.size() == 2);
  for (int i = 0; i < kTasks; ++i) {
    Future<void> next = i + 1 < kTasks ? done[i + 1].get_future() : Future<void>();
    pool.post([next, mine = done[i]] {
      // Without growth, tasks 0 and 1 would hold both threads forever.
      if (next.valid()) next.wait();
      mine.set_value();
    });
  }
  REQUIRE(done[0].get_future().wait_for(kLong));
  REQUIRE(pool.size() > 2);
  REQUIRE(pool.size() <= kMax);
}

TEST_CASE("a task entering BlockedScope while work is queued gets another thread",
          "[pool][growth]") {
  ThreadPool pool(1, "blocked-scope");
  Promise<bool> finished;
  pool.post([&pool, finished] {
    auto inner_ran = std::make_shared<std::latch>(1);     // outlives both tasks' use
    pool.post([inner_ran] { inner_ran->count_down(); });  // queued behind us
    ThreadPool::BlockedScope blocked;
    ThreadPool::BlockedScope nested;  // nesting counts once
    inner_ran->wait();
    finished.set_value(true);
  });
  REQUIRE(await(finished.get_future()));
  REQUIRE(pool.size() == 2);
}

TEST_CASE("BlockedScope off a pool thread does nothing", "[pool][growth]") {
  ThreadPool pool(1, "not-mine");
  { ThreadPool::BlockedScope blocked; }
  REQUIRE(pool.size() == 1);
}

TEST_CASE("threads started for blocked tasks exit after the idle timeout",
          "[pool][growth]") {
  constexpr int kTasks = 4;
  std::vector<Promise<void>> done(kTasks);
  ThreadPool pool(1, "shrinks", 8);
  pool.set_idle_timeout(20ms);
  for (int i = 0; i < kTasks; ++i) {
    Future<void> next = i + 1 < kTasks ? done[i + 1].get_future() : Future<void>();
    pool.post([next, mine = done[i]] {
      if (next.valid()) next.wait();
      mine.set_value();
    });
  }
  REQUIRE(done[0].get_future().wait_for(kLong));
  REQUIRE(pool.size() > 1);
  auto deadline = std::chrono::steady_clock::now() + kLong;
  while (pool.size() > 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);  // polls a condition; no order depends on it
  }
  REQUIRE(pool.size() == 1);
  Promise<bool> still_works;
  pool.post([still_works] { still_works.set_value(true); });
  REQUIRE(await(still_works.get_future()));
}

TEST_CASE("at_thread_exit off a pool thread drops the hook", "[pool][exit]") {
  bool ran = false;
  REQUIRE_FALSE(ThreadPool::at_thread_exit([&ran] { ran = true; }));
  ThreadPool pool(1, "not-here");
  pool.shutdown();
  REQUIRE_FALSE(ran);
}

TEST_CASE("a pool thread's exit hooks run on it, newest first, before shutdown() returns",
          "[pool][exit]") {
  ThreadPool pool(1, "hooks");
  std::mutex mu;
  std::vector<std::string> order;
  std::thread::id task_thread, hook_thread;
  Promise<bool> registered;
  pool.post([&, registered] {
    task_thread = std::this_thread::get_id();
    const bool first = ThreadPool::at_thread_exit([&] {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back("first");
      hook_thread = std::this_thread::get_id();
    });
    const bool second = ThreadPool::at_thread_exit([&] {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back("second");
      throw std::runtime_error("logged, and the next hook still runs");
    });
    registered.set_value(first && second);
  });
  REQUIRE(await(registered.get_future()));
  {
    std::lock_guard<std::mutex> lock(mu);
    REQUIRE(order.empty());  // not while the thread stays in its pool
  }
  pool.shutdown();
  std::lock_guard<std::mutex> lock(mu);
  REQUIRE(order == std::vector<std::string>{"second", "first"});
  REQUIRE(hook_thread == task_thread);
}

TEST_CASE("while a retiring thread runs its exit hooks, tasks still find a thread",
          "[pool][exit][growth]") {
  // Two threads (one started for a blocked task), each with an exit hook
  // that holds it until the test lets go: the one that retires first must
  // neither keep a task posted meanwhile from running nor hold up post().
  std::latch release(1);
  Promise<void> hook_started;
  std::atomic<bool> started_once{false};
  auto hold = [&release, &hook_started, &started_once] {
    if (!started_once.exchange(true)) hook_started.set_value();
    release.wait();
  };
  Promise<void> unblock;
  Promise<void> second_ran;
  ThreadPool pool(1, "retiring", 8);
  pool.set_idle_timeout(20ms);
  pool.post([hold, unblock] {
    ThreadPool::at_thread_exit(hold);
    unblock.get_future().wait();  // a BlockedScope: the pool starts a thread
  });
  pool.post([hold, unblock, second_ran] {  // so it runs on that second thread
    ThreadPool::at_thread_exit(hold);
    unblock.set_value();
    second_ran.set_value();
  });
  REQUIRE(second_ran.get_future().wait_for(kLong));
  REQUIRE(hook_started.get_future().wait_for(kLong));  // one retires (idle timeout)
  Promise<bool> ran;
  pool.post([ran] { ran.set_value(true); });
  REQUIRE(await(ran.get_future()));
  release.count_down();
  auto deadline = std::chrono::steady_clock::now() + kLong;
  while (pool.size() > 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);  // polls a condition; no order depends on it
  }
  REQUIRE(pool.size() == 1);
  pool.shutdown();  // the last thread's hook runs (released already)
}

TEST_CASE("shutdown() runs the queued tasks, joins, and post() then throws kCancelled",
          "[pool][shutdown]") {
  ThreadPool pool(1, "drains");
  std::latch started(1);
  std::latch release(1);
  std::atomic<int> ran{0};
  pool.post([&] {
    started.count_down();
    release.wait();  // a plain latch: no BlockedScope, so no growth
  });
  started.wait();
  int posted = 10;
  for (int i = 0; i < 10; ++i) pool.post([&ran] { ++ran; });
  std::thread closer([&pool] { pool.shutdown(); });
  for (;;) {  // until shutdown() has closed the pool
    try {
      pool.post([&ran] { ++ran; });
      ++posted;
      std::this_thread::yield();
    } catch (const Error& e) {
      REQUIRE(e.code() == ErrorCode::kCancelled);
      REQUIRE_THAT(e.what(), Catch::Contains("drains"));
      break;
    }
  }
  release.count_down();
  closer.join();
  REQUIRE(ran == posted);
  REQUIRE(pool.size() == 0);
  REQUIRE(code_of([&] { pool.post([] {}); }) == ErrorCode::kCancelled);
  pool.shutdown();  // idempotent
  REQUIRE(pool.size() == 0);
}

TEST_CASE("shutdown() from inside a pool task does not deadlock", "[pool][shutdown]") {
  ThreadPool pool(1, "self-stop");
  std::latch release(1);
  std::atomic<int> later{0};
  Promise<bool> stopped;
  pool.post([&release] { release.wait(); });
  pool.post([&pool, stopped] {
    pool.shutdown();  // closes and returns: it cannot join its own thread
    stopped.set_value(ThreadPool::current() == &pool);
  });
  pool.post([&later] { ++later; });  // queued before the shutdown: still runs
  release.count_down();
  REQUIRE(await(stopped.get_future()));
  REQUIRE(code_of([&] { pool.post([] {}); }) == ErrorCode::kCancelled);
  pool.shutdown();  // from outside: waits for the queue and joins
  REQUIRE(later == 1);
  REQUIRE(pool.size() == 0);
}

namespace {
// Holds the last handle to a pool; destroyed by a task of that pool.
struct LastHandle {
  std::shared_ptr<ThreadPool> pool;
  Promise<bool> destroyed_on_pool;
  ~LastHandle() {
    bool on_pool = pool != nullptr && ThreadPool::current() == pool.get();
    pool.reset();  // ~ThreadPool runs here, on one of the pool's threads
    destroyed_on_pool.set_value(on_pool);
  }
};
}  // namespace

TEST_CASE("destroying a pool on one of its own threads does not deadlock",
          "[pool][shutdown]") {
  auto pool = std::make_shared<ThreadPool>(2, "self-drop");
  auto handle = std::make_shared<LastHandle>();
  handle->pool = pool;
  Future<bool> destroyed = handle->destroyed_on_pool.get_future();
  std::latch release(1);
  pool->post([handle, &release] { release.wait(); });
  handle.reset();
  pool.reset();  // the task's copy of `handle` is now the last owner
  release.count_down();
  REQUIRE(await(destroyed));
}

TEST_CASE("cancel() fails a pending future with kCancelled and runs its producer's canceller "
          "once; a completed one is left alone",
          "[future][cancel]") {
  Promise<int> p;
  std::atomic<int> runs{0};
  p.on_cancel([&] { ++runs; });
  Future<int> f = p.get_future();
  CHECK(f.cancel());
  CHECK_FALSE(f.cancel());
  CHECK(runs == 1);
  REQUIRE(f.has_error());
  try {
    f.value();
    FAIL("no error");
  } catch (const switchboard::Error& e) {
    CHECK(e.code() == switchboard::ErrorCode::kCancelled);
    CHECK_THAT(e.what(), Catch::Contains("Future::cancel()"));
  }
  CHECK_FALSE(p.set_value(3));  // the producer's late answer is dropped

  Promise<int> done;
  std::atomic<int> never{0};
  done.on_cancel([&] { ++never; });
  done.set_value(7);
  CHECK_FALSE(done.get_future().cancel());
  CHECK(never == 0);
  CHECK(done.get_future().value() == 7);
}

TEST_CASE("cancelling a future made by then() cancels the future it came from", "[future][cancel]") {
  Promise<int> source;
  std::atomic<int> told{0};
  source.on_cancel([&] { ++told; });
  Future<std::string> derived =
      source.get_future().then([](const Future<int>& f) { return std::to_string(f.value()); });
  CHECK(derived.cancel());
  CHECK(told == 1);
  CHECK(source.get_future().has_error());
  CHECK(derived.has_error());
}

TEST_CASE("past its shutdown deadline a pool leaves a running task to finish on its own",
          "[pool][shutdown]") {
  auto let_go = std::make_shared<Promise<void>>();
  auto started = std::make_shared<Promise<void>>();
  auto finished = std::make_shared<Promise<void>>();
  {
    ThreadPool pool(2, "deadline");
    pool.post([let_go, started, finished] {
      started->set_value();
      (void)let_go->get_future().wait_for(60s);  // a task that does not return
      finished->set_value();
    });
    REQUIRE(started->get_future().wait_for(60s));
    pool.set_shutdown_deadline(std::chrono::steady_clock::now() + 50ms);
    pool.shutdown();  // returns although the task still runs
    CHECK_FALSE(finished->get_future().done());
    CHECK_THROWS_AS(pool.post([] {}), Error);
  }  // nor does the destructor wait
  let_go->set_value();
  // The task goes on, on its own thread, after the pool object is gone.
  CHECK(finished->get_future().wait_for(60s));
}

// torch's test_futures.py: test_collect_all, test_wait_all,
// test_wait_all_exception, test_collect_all_empty.
TEST_CASE("collect_all completes once every future did, with all of them, failures "
          "included",
          "[future][combinators]") {
  Promise<int> a;
  Promise<int> b;
  Future<std::vector<Future<int>>> all =
      switchboard::rpc::collect_all(std::vector<Future<int>>{a.get_future(), b.get_future()});
  a.set_value(1);
  CHECK_FALSE(all.done());
  b.set_error(std::make_exception_ptr(std::runtime_error("b failed")));
  REQUIRE(all.done());
  REQUIRE_FALSE(all.has_error());
  const std::vector<Future<int>>& got = all.value();
  REQUIRE(got.size() == 2);
  CHECK(got[0].value() == 1);
  CHECK_THROWS_WITH(got[1].value(), "b failed");
  CHECK(switchboard::rpc::collect_all(std::vector<Future<int>>{}).value().empty());
}

TEST_CASE("wait_all returns the values in order, or throws the first failure",
          "[future][combinators]") {
  Promise<int> a;
  Promise<int> b;
  std::thread completer([&] {
    b.set_value(2);
    a.set_value(1);
  });
  CHECK(switchboard::rpc::wait_all(std::vector<Future<int>>{a.get_future(), b.get_future()}) ==
        std::vector<int>{1, 2});
  completer.join();

  Promise<void> ok;
  Promise<void> bad;
  ok.set_value();
  bad.set_error(std::make_exception_ptr(std::runtime_error("second failed")));
  CHECK_THROWS_WITH(
      switchboard::rpc::wait_all(std::vector<Future<void>>{ok.get_future(), bad.get_future()}),
      "second failed");
}

TEST_CASE("wait_all throws a failure at once, without waiting for the futures still "
          "pending (torch's wait_all exits early)",
          "[future][combinators]") {
  Promise<int> never;  // completed only after wait_all returned
  Promise<int> failing;
  std::thread failer([&] {
    failing.set_error(std::make_exception_ptr(std::runtime_error("failed early")));
  });
  CHECK_THROWS_WITH(switchboard::rpc::wait_all(
                        std::vector<Future<int>>{never.get_future(), failing.get_future()}),
                    "failed early");
  failer.join();
  CHECK_FALSE(never.get_future().done());
  never.set_value(1);
}
