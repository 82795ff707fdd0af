// Threads for tests that run ranks (workers, agents, callers) as threads of
// the test process, and a gate for holding a handler until the test lets it
// go.
//
//   std::vector<std::exception_ptr> errors = on_threads(3, [&](int rank) {
//     contexts[rank]->init_rpc(fmt::format("w{}", rank), ...);
//   });
//   rethrow_first(errors);  // or inspect errors[rank] one by one
//
//   auto gate = std::make_shared<Gate>(kGuard);
//   ... a handler calls gate->pass() ...
//   REQUIRE(gate->wait_arrived(1));  // the handler is running
//   gate->open();                    // and now it may return
//
// Nothing here sleeps: every wait is on a condition and bounded by a guard
// timeout the test chooses, so a hang fails the test instead of stalling it.
//
// Thread safety: on_threads() and rethrow_first() may be called from any
// thread; a Gate may be used from any number of threads at once.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace switchboard::testing {

// Polls `done` every millisecond until it returns true or `guard` passes;
// returns whether it did. For conditions that nothing signals (a count that
// messages bring down), not for an order of events.
template <typename Predicate>
bool eventually(Predicate done, std::chrono::milliseconds guard = std::chrono::seconds(60)) {
  const auto deadline = std::chrono::steady_clock::now() + guard;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// Runs body(0), ..., body(n - 1) concurrently, each on a thread of its own,
// and returns once every one has returned or thrown. Element `rank` of the
// result is what body(rank) threw, or null where it returned normally; the
// exceptions are caught, never rethrown here (see rethrow_first()).
//
// `body` is called from n threads at once and must be safe to run so; it is
// borrowed only until on_threads() returns. n <= 0 runs nothing and returns
// an empty vector. Should the system refuse to start a thread, the
// std::system_error ends the process (std::terminate) with the threads
// already started still running: a test cannot go on with ranks missing.
inline std::vector<std::exception_ptr> on_threads(int n,
                                                  const std::function<void(int)>& body) {
  std::vector<std::exception_ptr> errors(n > 0 ? n : 0);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank) {
    // Each thread writes only its own element of `errors`.
    threads.emplace_back([&, rank] {
      try {
        body(rank);
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return errors;
}

// Rethrows the first non-null exception of `errors` (lowest index first);
// returns normally when every element is null or `errors` is empty. The
// other exceptions are dropped.
inline void rethrow_first(const std::vector<std::exception_ptr>& errors) {
  for (const auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
}

// A one-shot gate: pass() blocks until open(), bounded by the guard given at
// construction; pass() also counts arrivals, so the test can wait until a
// handler has got there (wait_arrived()). Once open, the gate stays open and
// pass() returns at once.
//
// Thread-safe. Share it (std::shared_ptr) with the handlers that pass it:
// it must outlive every call of its methods.
class Gate {
 public:
  // `guard` bounds each wait of pass() and wait_arrived().
  explicit Gate(std::chrono::milliseconds guard) : guard_(guard) {}
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

  // Opens the gate: every pass(), waiting or to come, returns true.
  void open() SB_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

  // Called by a handler: records its arrival, then waits for open(). Returns
  // true once the gate is open, false when the guard ran out first (the
  // arrival stays counted either way).
  bool pass() SB_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    ++arrived_;
    cv_.notify_all();
    return cv_.wait_for(mu_, guard_, [&]() SB_REQUIRES(mu_) { return open_; });
  }

  // Waits until at least `count` calls of pass() have arrived (whether or not
  // they have returned since). Returns true when they have, false when the
  // guard ran out first.
  bool wait_arrived(int count = 1) SB_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return cv_.wait_for(mu_, guard_,
                        [&]() SB_REQUIRES(mu_) { return arrived_ >= count; });
  }

 private:
  const std::chrono::milliseconds guard_;
  Mutex mu_;
  CondVar cv_;
  bool open_ SB_GUARDED_BY(mu_) = false;
  int arrived_ SB_GUARDED_BY(mu_) = 0;
};

}  // namespace switchboard::testing
