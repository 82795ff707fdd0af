// Future and Promise: the one async result type of the RPC layer.
//
// A Promise<T> and the Future<T>s it hands out are handles to one shared
// state that completes exactly once, with a value or with an error (an
// std::exception_ptr, normally a switchboard::Error from common/error.h).
// The producer (an agent, a handler) keeps a Promise and completes it; the
// consumer waits on the Future or registers callbacks on it.
//
// Which thread runs a callback (add_callback, then): a Promise made with an
// Executor (e.g. the agent's ThreadPool) posts every callback of its state
// to that executor, also callbacks added after completion. Without an
// executor, a callback runs inline: on the thread that completes the
// promise, or on the thread calling add_callback()/then() when the state is
// already complete. If the executor refuses the task (post() throws, e.g. a
// pool that has shut down), the callback runs inline on the thread that
// tried to post it. Each callback runs exactly once. Callbacks run outside
// every lock, so they may use the same Future and Promise freely.
// Exceptions that escape an add_callback() callback are logged and dropped;
// then() turns them into the result future's error instead.
//
// Cancellation: Future::cancel() fails a pending future with
// Error(kCancelled) and runs the canceller its producer set
// (Promise::on_cancel(): an RPC call tells its callee, for example); a
// future from then() passes the cancellation on to the future it came
// from. Dropping a Future cancels nothing, and timeouts are the producer's
// business (agents fail the future with a TimeoutError). When the last handle to a Promise is destroyed before it
// completed, the state completes with Error(ErrorCode::kCancelled, "promise
// abandoned ...") so nothing waits forever; callbacks that captured their
// own Promise keep it alive and prevent this.
//
// Blocking on a pool thread: wait(), wait_for() and value() hold a
// ThreadPool::BlockedScope while they block, so that the pool starts
// another thread when needed (see rpc/thread_pool.h); nested waits on a
// pool thread therefore cannot starve the pool.
//
// Thread safety: every method of Future and Promise may be called
// concurrently from any number of threads, on the same handle or on
// copies. Assigning to a handle object while another thread uses that same
// object is a data race, as with std::shared_ptr.
//
// Errors: using an invalid Future (default-constructed) or a moved-from
// Promise throws std::invalid_argument (a caller bug), as does completing
// with a null exception_ptr.
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "common/check.h"
#include "common/error.h"
#include "common/mutex.h"
#include "rpc/thread_pool.h"

namespace switchboard::rpc {

template <typename T>
class Future;
template <typename T>
class Promise;

namespace detail {

// What the state stores for T (void stores nothing).
template <typename T>
using Stored = std::conditional_t<std::is_void_v<T>, std::monostate, T>;

template <typename T>
class State;

// What a state's cancel() tells, without allocating: the state a then()
// result came from (cancelled in turn), or a producer's hook with the id
// it gave (the call table: the call's id).
class Cancellable {
 public:
  virtual bool cancel() = 0;

 protected:
  ~Cancellable() = default;
};

}  // namespace detail

// A producer's cancellation hook (see Promise::on_cancel(hook, id)).
class CancelHook {
 public:
  virtual void on_cancelled(uint64_t id) = 0;

 protected:
  ~CancelHook() = default;
};

namespace detail {

// Builds handles from a state (their constructors are private).
struct Access {
  template <typename T>
  static Future<T> make(std::shared_ptr<State<T>> state) {
    return Future<T>(std::move(state));
  }
};

// The shared state. Invariants: `done_` goes from false to true once, under
// `mu_`; `value_` (success) or `error_` (failure) is set in the same
// critical section and never changes afterwards, so it may be read without
// the lock by a thread that saw done_ == true under the lock.
template <typename T>
class State : public std::enable_shared_from_this<State<T>>, public Cancellable {
 public:
  using Callback = std::function<void(const Future<T>&)>;

  explicit State(std::shared_ptr<Executor> executor) : executor_(std::move(executor)) {}
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  const std::shared_ptr<Executor>& executor() const { return executor_; }

  bool complete_value(Stored<T>&& value) { return complete(&value, nullptr); }
  bool complete_error(std::exception_ptr error) { return complete(nullptr, error); }

  // What cancel() runs or tells (once, on the cancelling thread); dropped
  // when the state completes otherwise.
  void set_canceller(std::function<void()> canceller) SB_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (!done_) canceller_ = std::move(canceller);
  }
  // The next two: only while no other thread can reach the state yet (a
  // producer that has not handed it out), so they take no lock.
  void set_cancel_hook(std::weak_ptr<CancelHook> hook,
                       uint64_t id) SB_NO_THREAD_SAFETY_ANALYSIS {
    hook_ = std::move(hook);
    hook_id_ = id;
  }
  void set_upstream(std::weak_ptr<Cancellable> upstream) SB_NO_THREAD_SAFETY_ANALYSIS {
    upstream_ = std::move(upstream);
  }
  // Fails the state with Error(kCancelled), then tells its producer; false
  // when it was already complete.
  bool cancel() override SB_EXCLUDES(mu_) {
    std::function<void()> canceller;
    std::weak_ptr<CancelHook> hook;
    std::weak_ptr<Cancellable> upstream;
    uint64_t hook_id = 0;
    {
      MutexLock lock(mu_);
      if (done_) return false;
      canceller = std::move(canceller_);
      hook = std::move(hook_);
      upstream = std::move(upstream_);
      hook_id = hook_id_;
    }
    if (!complete_error(std::make_exception_ptr(
            Error(ErrorCode::kCancelled, "cancelled by the caller (Future::cancel())")))) {
      return false;
    }
    try {
      if (canceller) canceller();
      if (auto h = hook.lock()) h->on_cancelled(hook_id);
      if (auto u = upstream.lock()) u->cancel();
    } catch (...) {
      log_uncaught("Future canceller", std::current_exception());
    }
    return true;
  }

  bool done() const SB_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return done_;
  }

  void wait() const SB_EXCLUDES(mu_) {
    if (done()) return;
    ThreadPool::BlockedScope blocked;
    MutexLock lock(mu_);
    cv_.wait(mu_, [&]() SB_REQUIRES(mu_) { return done_; });
  }

  bool wait_for(std::chrono::milliseconds timeout) const SB_EXCLUDES(mu_) {
    if (done()) return true;
    if (timeout.count() <= 0) return false;
    ThreadPool::BlockedScope blocked;
    MutexLock lock(mu_);
    return cv_.wait_for(mu_, timeout, [&]() SB_REQUIRES(mu_) { return done_; });
  }

  std::exception_ptr error() const SB_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return done_ ? error_ : nullptr;
  }

  // Only after this thread saw done() == true (see the invariants).
  const Stored<T>& value_when_done() const { return *value_; }
  std::exception_ptr error_when_done() const { return error_; }

  // `run_inline`: bypass the executor (see FutureCommon::then_inline).
  void add_callback(Callback callback, bool run_inline = false) SB_EXCLUDES(mu_) {
    {
      MutexLock lock(mu_);
      if (!done_) {
        callbacks_.push_back({std::move(callback), run_inline});
        return;
      }
    }
    dispatch(std::move(callback), run_inline);
  }

 private:
  bool complete(Stored<T>* value, std::exception_ptr error) SB_EXCLUDES(mu_) {
    std::vector<Queued> callbacks;
    {
      MutexLock lock(mu_);
      if (done_) return false;
      if (value != nullptr) {
        value_.emplace(std::move(*value));
      } else {
        error_ = std::move(error);
      }
      done_ = true;
      callbacks.swap(callbacks_);
      canceller_ = nullptr;
      hook_.reset();
      upstream_.reset();
    }
    cv_.notify_all();
    for (auto& queued : callbacks) dispatch(std::move(queued.callback), queued.run_inline);
    return true;
  }

  // Runs `callback` on the executor, or inline (without one, when asked
  // to, or when the executor refuses it). Called without the lock, after
  // completion.
  void dispatch(Callback callback, bool run_inline) SB_EXCLUDES(mu_) {
    Future<T> self = Access::make<T>(this->shared_from_this());
    if (executor_ == nullptr || run_inline) {
      invoke(callback, self);
      return;
    }
    auto shared = std::make_shared<Callback>(std::move(callback));
    try {
      executor_->post([self, shared] { invoke(*shared, self); });
      return;
    } catch (...) {
      // The executor refused the task and dropped it: run it here instead.
    }
    invoke(*shared, self);
  }

  static void invoke(Callback& callback, const Future<T>& self) noexcept {
    try {
      callback(self);
    } catch (...) {
      log_uncaught("Future callback", std::current_exception());
    }
  }

  const std::shared_ptr<Executor> executor_;
  mutable Mutex mu_;
  mutable CondVar cv_;
  bool done_ SB_GUARDED_BY(mu_) = false;
  // Written under mu_, read without it once done (see the invariants), so
  // not SB_GUARDED_BY.
  std::optional<Stored<T>> value_;
  std::exception_ptr error_;
  struct Queued {
    Callback callback;
    bool run_inline;
  };
  std::vector<Queued> callbacks_ SB_GUARDED_BY(mu_);
  std::function<void()> canceller_ SB_GUARDED_BY(mu_);
  std::weak_ptr<CancelHook> hook_ SB_GUARDED_BY(mu_);
  uint64_t hook_id_ SB_GUARDED_BY(mu_) = 0;
  std::weak_ptr<Cancellable> upstream_ SB_GUARDED_BY(mu_);
};

// Owned by every copy of one Promise; abandons the state when the last
// copy goes away without having completed it.
template <typename T>
struct PromiseCore {
  explicit PromiseCore(std::shared_ptr<State<T>> state) : state(std::move(state)) {}
  PromiseCore(const PromiseCore&) = delete;
  PromiseCore& operator=(const PromiseCore&) = delete;
  ~PromiseCore() {
    if (state->done()) return;
    try {
      state->complete_error(std::make_exception_ptr(
          Error(ErrorCode::kCancelled,
                "promise abandoned: its last Promise handle was destroyed before "
                "it was given a value or an error")));
    } catch (...) {
      log_uncaught("Promise destructor", std::current_exception());
    }
  }
  const std::shared_ptr<State<T>> state;
};

// then(): Future<V> results are flattened.
template <typename R>
struct Unwrap {
  using type = R;
  static constexpr bool kIsFuture = false;
};
template <typename V>
struct Unwrap<Future<V>> {
  using type = V;
  static constexpr bool kIsFuture = true;
};

// Completes `promise` the way `from` completed.
template <typename V>
void forward_result(const Promise<V>& promise, const Future<V>& from) {
  if (auto error = from.error()) {
    promise.set_error(error);
  } else if constexpr (std::is_void_v<V>) {
    promise.set_value();
  } else {
    promise.set_value(from.value());
  }
}

// What Future<T> and Future<void> share; use Future<T>.
template <typename T>
class FutureCommon {
 public:
  // False for a default-constructed Future; every other method then throws
  // std::invalid_argument.
  bool valid() const { return state_ != nullptr; }

  // True once completed (with a value or an error). Never blocks for long.
  bool done() const { return state().done(); }

  // Blocks until completed; never throws the future's error (value() does).
  // On a pool thread, holds a ThreadPool::BlockedScope while blocked.
  void wait() const { state().wait(); }

  // Blocks at most `timeout`; true when completed (then or before).
  bool wait_for(std::chrono::milliseconds timeout) const {
    return state().wait_for(timeout);
  }

  // The error once completed with one, else nullptr (also while pending).
  std::exception_ptr error() const { return state().error(); }
  bool has_error() const { return error() != nullptr; }

  // Fails the future with Error(kCancelled) when still pending, and tells
  // its producer (see the top of this file); true when it did. Thread-safe.
  bool cancel() const { return state().cancel(); }

  // Runs `callback(future)` once after completion; see the top of this file
  // for the thread. The state owns `callback` until it has run.
  void add_callback(std::function<void(const Future<T>&)> callback) const {
    SB_REQUIRE(callback != nullptr, "Future::add_callback() with an empty callback");
    state().add_callback(std::move(callback));
  }

  // Returns a Future<U> (with this state's executor) completed with
  // f(completed future) or failed with what f threw. f runs like an
  // add_callback() callback; it must accept `const Future<T>&` (call
  // value() in it to get the value or rethrow the error). When f returns a
  // Future<V>, the result is a Future<V> that completes when that one does.
  // F may be move-only; it is destroyed after it ran (or with the state).
  template <typename F>
  auto then(F f) const {
    return then_impl(std::move(f), /*run_inline=*/false);
  }

  // Like then(), except that f itself runs inline on the thread that
  // completes this future (or on the calling thread when it is already
  // complete), even when the state has an executor; the result future
  // keeps this state's executor, so callbacks added to it run there. For
  // short continuations inside the library that never block (decoding a
  // response), to save a thread hop; never for user code.
  template <typename F>
  auto then_inline(F f) const {
    return then_impl(std::move(f), /*run_inline=*/true);
  }

 private:
  template <typename F>
  auto then_impl(F f, bool run_inline) const {
    static_assert(std::is_invocable_v<F&, const Future<T>&>,
                  "then(f): f must be callable as f(const Future<T>&)");
    using R = std::remove_cvref_t<std::invoke_result_t<F&, const Future<T>&>>;
    using V = typename Unwrap<R>::type;
    Promise<V> promise(state().executor());
    Future<V> result = promise.get_future();
    // Cancelling the result cancels this future (its producer is told).
    promise.core_state().set_upstream(std::weak_ptr<Cancellable>(state_));
    auto fn = std::make_shared<F>(std::move(f));
    state().add_callback([promise, fn](const Future<T>& self) {
      try {
        if constexpr (Unwrap<R>::kIsFuture) {
          R inner = (*fn)(self);
          if (!inner.valid()) {
            throw std::invalid_argument("then(f): f returned an invalid Future");
          }
          inner.add_callback(
              [promise](const R& done) { forward_result<V>(promise, done); });
        } else if constexpr (std::is_void_v<R>) {
          (*fn)(self);
          promise.set_value();
        } else {
          promise.set_value((*fn)(self));
        }
      } catch (...) {
        promise.set_error(std::current_exception());
      }
    }, run_inline);
    return result;
  }

 public:
  // An already failed future (no executor). `error` must not be null.
  static Future<T> failed(std::exception_ptr error) {
    SB_REQUIRE(error != nullptr, "Future::failed() with a null exception_ptr");
    auto state = std::make_shared<State<T>>(nullptr);
    state->complete_error(std::move(error));
    return Access::make<T>(std::move(state));
  }

 protected:
  FutureCommon() = default;
  explicit FutureCommon(std::shared_ptr<State<T>> state) : state_(std::move(state)) {}

  State<T>& state() const {
    SB_REQUIRE(state_ != nullptr, "use of an invalid (default-constructed) Future");
    return *state_;
  }

  std::shared_ptr<State<T>> state_;
};

}  // namespace detail

// A copyable handle to the result of an asynchronous operation; see the top
// of this file. The value lives as long as any handle to the state does.
template <typename T>
class [[nodiscard]] Future : public detail::FutureCommon<T> {
 public:
  Future() = default;

  // An already completed future (no executor).
  static Future ready(T value) {
    auto state = std::make_shared<detail::State<T>>(nullptr);
    state->complete_value(std::move(value));
    return Future(std::move(state));
  }

  // Waits, then returns the value or rethrows the error. The reference stays
  // valid while any Future or Promise handle to this state exists.
  const T& value() const {
    this->wait();
    if (auto error = this->state_->error_when_done()) std::rethrow_exception(error);
    return this->state_->value_when_done();
  }

 private:
  friend struct detail::Access;
  explicit Future(std::shared_ptr<detail::State<T>> state)
      : detail::FutureCommon<T>(std::move(state)) {}
};

template <>
class [[nodiscard]] Future<void> : public detail::FutureCommon<void> {
 public:
  Future() = default;

  // An already completed future (no executor).
  static Future ready() {
    auto state = std::make_shared<detail::State<void>>(nullptr);
    state->complete_value(std::monostate{});
    return Future(std::move(state));
  }

  // Waits, then returns or rethrows the error.
  void value() const {
    this->wait();
    if (auto error = this->state_->error_when_done()) std::rethrow_exception(error);
  }

 private:
  friend struct detail::Access;
  explicit Future(std::shared_ptr<detail::State<void>> state)
      : detail::FutureCommon<void>(std::move(state)) {}
};

namespace detail {

// What Promise<T> and Promise<void> share; use Promise<T>.
template <typename T>
class PromiseCommon {
 public:
  // Every Future handed out refers to the same state.
  Future<T> get_future() const { return Access::make<T>(core().state); }

  // Fails the state with `error` (must not be null); false when it was
  // already completed (then nothing changes).
  bool set_error(std::exception_ptr error) const {
    SB_REQUIRE(error != nullptr, "Promise::set_error() with a null exception_ptr");
    return core().state->complete_error(std::move(error));
  }

  bool is_completed() const { return core().state->done(); }

  // What Future::cancel() runs when it cancels this promise's state (once,
  // on the cancelling thread, outside every lock); ignored once complete.
  void on_cancel(std::function<void()> canceller) const {
    core().state->set_canceller(std::move(canceller));
  }
  // The same, without allocating or locking: hook->on_cancelled(id), while
  // `hook` lives. Only before the state is shared with another thread (a
  // producer setting up its promise).
  void on_cancel(std::weak_ptr<CancelHook> hook, uint64_t id) const {
    core().state->set_cancel_hook(std::move(hook), id);
  }
  // The shared state (for then(): the library's own use).
  State<T>& core_state() const { return *core().state; }

 protected:
  explicit PromiseCommon(std::shared_ptr<Executor> executor)
      : core_(std::make_shared<PromiseCore<T>>(
            std::make_shared<State<T>>(std::move(executor)))) {}

  PromiseCore<T>& core() const {
    SB_REQUIRE(core_ != nullptr, "use of a moved-from Promise");
    return *core_;
  }

 private:
  std::shared_ptr<PromiseCore<T>> core_;
};

}  // namespace detail

// The producer's copyable handle; see the top of this file. `executor`
// (may be null) is where the state's callbacks run, shared by the state
// until it is destroyed.
template <typename T>
class Promise : public detail::PromiseCommon<T> {
 public:
  explicit Promise(std::shared_ptr<Executor> executor = nullptr)
      : detail::PromiseCommon<T>(std::move(executor)) {}

  // Completes with `value`; false when already completed (then `value` is
  // dropped and nothing changes).
  bool set_value(T value) const {
    return this->core().state->complete_value(std::move(value));
  }
};

template <>
class Promise<void> : public detail::PromiseCommon<void> {
 public:
  explicit Promise(std::shared_ptr<Executor> executor = nullptr)
      : detail::PromiseCommon<void>(std::move(executor)) {}

  // Completes; false when already completed.
  bool set_value() const { return this->core().state->complete_value(std::monostate{}); }
};

// torch.futures' combinators.
//
// collect_all(futures): a future that completes, with the same futures,
// once every one of them completed (with a value or an error; it never
// fails itself). Its callbacks run inline, on the thread that completed the
// last of them. Cancelling it cancels nothing else.
//   rpc::collect_all(calls).then([](const auto& all) { ... all.value()[i].value() ... });
template <typename T>
Future<std::vector<Future<T>>> collect_all(std::vector<Future<T>> futures) {
  Promise<std::vector<Future<T>>> all;
  if (futures.empty()) {
    all.set_value({});
    return all.get_future();
  }
  auto left = std::make_shared<std::atomic<size_t>>(futures.size());
  auto held = std::make_shared<std::vector<Future<T>>>(futures);
  for (const Future<T>& f : futures) {
    f.add_callback([all, left, held](const Future<T>&) {
      if (left->fetch_sub(1) == 1) all.set_value(*held);
    });
  }
  return all.get_future();
}

// all_succeeded(futures): a future that completes once every one of
// `futures` succeeded, or fails as soon as one fails, with its error (the
// first in the list when several had failed already). Its callbacks run on
// `executor` when one is given.
template <typename T>
Future<void> all_succeeded(const std::vector<Future<T>>& futures,
                           std::shared_ptr<Executor> executor = nullptr) {
  Promise<void> all(std::move(executor));
  if (futures.empty()) {
    all.set_value();
    return all.get_future();
  }
  auto left = std::make_shared<std::atomic<size_t>>(futures.size());
  for (const Future<T>& f : futures) {
    f.add_callback([all, left](const Future<T>& done) {
      if (done.has_error()) {
        all.set_error(done.error());
      } else if (left->fetch_sub(1) == 1) {
        all.set_value();
      }
    });
  }
  return all.get_future();
}

// wait_all(futures): waits for every future, then returns their values in
// order; or, as soon as one of them fails, rethrows its error without
// waiting for the others ("exits early", as torch.futures.wait_all
// documents and does). When several failed already, the first in the list
// is thrown. For Future<void>, returns nothing. collect_all, unlike it,
// waits for every future (as torch 1.13's collect_all does).
template <typename T>
auto wait_all(const std::vector<Future<T>>& futures) {
  all_succeeded(futures).value();  // the first failure, rethrown
  if constexpr (std::is_void_v<T>) {
    for (const Future<T>& f : futures) f.value();
  } else {
    std::vector<T> values;
    values.reserve(futures.size());
    for (const Future<T>& f : futures) values.push_back(f.value());
    return values;
  }
}

}  // namespace switchboard::rpc
