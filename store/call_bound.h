// StoreCallBound: a bound on every Store call the calling thread makes
// while the bound is in scope.
//
// An operation made of many store calls (a dynamic group's join or leave,
// a static group's rounds) promises one total deadline, not one timeout
// per call: it makes a StoreCallBound at its start, and every call it makes
// (through any store, however deeply nested in helpers) ends by that
// deadline. A long-lived thread that must stop promptly (a membership
// watcher) caps each of its calls instead, so that whoever joins it waits
// for one capped call at most, even with the store unreachable.
//
// Stores apply it to every call that can block: TcpStore to each request
// (connecting included, so a dead server is given up on at the bound) and
// every store to get(), wait() and multi_get(). A call cut short by the
// bound fails as it would on its own timeout: TimeoutError naming the keys
// and the time it was given, or ConnectionError (TcpStore) when the server
// could not be reached in that time.
//
// Bounds nest: the tightest one applies, and the destructor restores the
// enclosing one.
//
// Thread safety: the bound is the calling thread's alone (thread-local); a
// StoreCallBound must be destroyed on the thread that made it, innermost
// first (it is a scope object).
#pragma once

#include <chrono>
#include <optional>

namespace switchboard {

class StoreCallBound {
 public:
  using Clock = std::chrono::steady_clock;
  using Timeout = std::chrono::milliseconds;

  // Every store call on this thread ends by `deadline`.
  explicit StoreCallBound(Clock::time_point deadline);
  // Each store call on this thread takes at most `each` (> 0).
  explicit StoreCallBound(Timeout each);
  ~StoreCallBound();
  StoreCallBound(const StoreCallBound&) = delete;
  StoreCallBound& operator=(const StoreCallBound&) = delete;

  // What a call that would wait `timeout` (Store::kNoTimeout, 0: forever)
  // may wait on this thread now: `timeout` cut to the bounds in force, and
  // at least 1 ms when a bound is in force (0 would mean forever). Without
  // a bound, `timeout` unchanged.
  static Timeout bounded(Timeout timeout);

 private:
  struct Bounds {
    std::optional<Clock::time_point> deadline;
    std::optional<Timeout> each;
  };
  static Bounds& current();

  Bounds enclosing_;
};

}  // namespace switchboard
