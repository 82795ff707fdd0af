#include "tools/bench/store_load.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <exception>
#include <memory>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "store/tcp_store.h"

namespace switchboard::bench {

namespace {

using Clock = std::chrono::steady_clock;

const Bytes kValue = to_bytes("0123456789abcdef");  // the 16-byte value

// The keys one client owns; no two clients share a key.
struct ClientKeys {
  explicit ClientKeys(const std::string& prefix)
      : key(prefix + "/key"), counter(prefix + "/counter") {}
  std::string key;
  std::string counter;
};

// One set, get and add; throws when the store answers something impossible.
void set_get_add(TcpStore& store, const ClientKeys& keys) {
  store.set(keys.key, kValue);
  if (store.get(keys.key) != kValue) {
    throw std::runtime_error(fmt::format("get({}) returned a wrong value", keys.key));
  }
  if (store.add(keys.counter, 1) <= 0) {
    throw std::runtime_error(fmt::format("add({}) did not count up", keys.counter));
  }
}

// Loops set/get/add until `until`; returns the calls completed (3 per loop).
uint64_t run_until(TcpStore& store, const ClientKeys& keys, Clock::time_point until) {
  uint64_t ops = 0;
  while (Clock::now() < until) {
    set_get_add(store, keys);
    ops += 3;
  }
  return ops;
}

std::unique_ptr<TcpStore> connect(const std::string& host, uint16_t port,
                                  std::chrono::milliseconds timeout) {
  TcpStoreOptions options;
  options.timeout = timeout;
  return std::make_unique<TcpStore>(host, port, options);
}

// The first error seen by any thread, kept for the report.
class FirstError {
 public:
  void record(std::exception_ptr error) SB_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    if (!error_) error_ = error;
  }
  std::exception_ptr get() SB_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    return error_;
  }
  std::string message() {
    try {
      if (auto error = get()) std::rethrow_exception(error);
    } catch (const std::exception& e) {
      return e.what();
    }
    return {};
  }

 private:
  Mutex mutex_;
  std::exception_ptr error_ SB_GUARDED_BY(mutex_);
};

}  // namespace

LoadResult run_store_load(const std::string& host, uint16_t port,
                          const LoadOptions& options) {
  // Connections are opened before the clock starts: this measures requests.
  std::vector<std::unique_ptr<TcpStore>> stores;
  for (int i = 0; i < options.clients; ++i) stores.push_back(connect(host, port, options.timeout));

  // Every client starts at once; the barrier's completion sets the clock.
  Clock::time_point warm_end, end;
  auto start_clock = [&]() noexcept {
    warm_end = Clock::now() + std::chrono::duration_cast<Clock::duration>(options.warmup);
    end = warm_end + std::chrono::duration_cast<Clock::duration>(options.measure);
  };
  std::barrier start(options.clients, start_clock);
  std::vector<uint64_t> ops(options.clients, 0);
  std::vector<uint64_t> warm_ops(options.clients, 0);
  std::vector<Clock::time_point> finished(options.clients);
  FirstError error;
  std::vector<std::thread> threads;
  for (int i = 0; i < options.clients; ++i) {
    threads.emplace_back([&, i] {
      ClientKeys keys(fmt::format("bench/c{}/t{}", options.clients, i));
      start.arrive_and_wait();
      try {
        warm_ops[i] = run_until(*stores[i], keys, warm_end);  // not in ops/s
        ops[i] = run_until(*stores[i], keys, end);
      } catch (...) {
        error.record(std::current_exception());
      }
      finished[i] = Clock::now();
    });
  }
  for (auto& thread : threads) thread.join();
  if (auto first = error.get()) std::rethrow_exception(first);

  LoadResult result;
  for (int i = 0; i < options.clients; ++i) {
    result.ops += ops[i];
    result.all_ops += warm_ops[i] + ops[i];
  }
  Clock::time_point last = *std::max_element(finished.begin(), finished.end());
  result.seconds = Seconds(last - warm_end).count();
  return result;
}

namespace {

// What the threads of run_held_connections() share.
struct HeldRun {
  explicit HeldRun(const HeldOptions& options)
      : options(options), all_open(options.threads), all_used(options.threads) {}
  const HeldOptions& options;
  std::atomic<int> opened{0};
  std::atomic<int> completed{0};
  FirstError error;
  std::barrier<> all_open;  // nothing is used before every thread opened its own
  std::barrier<> all_used;  // nothing closes before every thread used its own
};

std::chrono::milliseconds time_left(Clock::time_point end) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now());
}

// Opens thread `t`'s connections, uses each once, closes them on return.
// Opening and using each get one budget of options.timeout per thread, so a
// failing server (or fd limit: connecting retries until its timeout) costs
// one timeout per phase, not one per connection.
void hold_and_use(HeldRun& run, const std::string& host, uint16_t port, int t) {
  std::vector<std::unique_ptr<TcpStore>> mine;
  auto budget_end = Clock::now() + run.options.timeout;
  for (int i = 0; i < run.options.per_thread && time_left(budget_end).count() > 0; ++i) {
    try {
      mine.push_back(connect(host, port, time_left(budget_end)));
      run.opened.fetch_add(1);
    } catch (...) {
      run.error.record(std::current_exception());
    }
  }
  run.all_open.arrive_and_wait();
  budget_end = Clock::now() + run.options.timeout;
  for (size_t i = 0; i < mine.size() && time_left(budget_end).count() > 0; ++i) {
    try {
      mine[i]->set_timeout(time_left(budget_end));
      set_get_add(*mine[i], ClientKeys(fmt::format("held/t{}/{}", t, i)));
      run.completed.fetch_add(1);
    } catch (...) {
      run.error.record(std::current_exception());
    }
  }
  run.all_used.arrive_and_wait();
}

}  // namespace

HeldResult run_held_connections(const std::string& host, uint16_t port,
                                const HeldOptions& options) {
  HeldRun run(options);
  auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < options.threads; ++t) {
    threads.emplace_back([&, t] { hold_and_use(run, host, port, t); });
  }
  for (auto& thread : threads) thread.join();
  // No connection closes before all_used, so `opened` were all open at once.
  return HeldResult{run.opened.load(), run.completed.load(),
                    Seconds(Clock::now() - start).count(), run.error.message()};
}

}  // namespace switchboard::bench
