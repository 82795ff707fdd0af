#include "rpc/thread_pool.h"

#include <fmt/format.h>
#include <pthread.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "common/check.h"
#include "common/error.h"
#include "common/mutex.h"

namespace switchboard::rpc {

// Invariants (all under mu): `live` counts threads that entered run() and
// have not left it; each of them has its std::thread in `threads` (until
// join_all() takes them) or, once it retired, in `retired`; idle <= live and
// blocked <= live. No task runs and no thread is joined while mu is held.
struct ThreadPool::Impl {
  Impl(size_t num_threads, std::string name, size_t max_threads)
      : num_threads(num_threads), name(std::move(name)), max_threads(max_threads) {}

  const size_t num_threads;
  const std::string name;
  const size_t max_threads;
  std::atomic<ThreadPool*> owner{nullptr};  // nullptr once the shell is destroyed

  mutable Mutex mu;
  CondVar work_cv;
  std::deque<std::function<void()>> queue SB_GUARDED_BY(mu);
  std::vector<std::thread> threads SB_GUARDED_BY(mu);
  std::vector<std::thread> retired SB_GUARDED_BY(mu);  // exited when idle
  size_t live SB_GUARDED_BY(mu) = 0;
  size_t idle SB_GUARDED_BY(mu) = 0;
  size_t blocked SB_GUARDED_BY(mu) = 0;
  // Retiring threads running their exit hooks: no longer there for tasks.
  size_t exiting SB_GUARDED_BY(mu) = 0;
  // Idle threads signaled and not yet back from their wait. A post() wakes
  // a thread only when none is on its way; a woken thread that finds more
  // work queued wakes the next one before running its task (so a burst of
  // posts costs one wake-up per thread actually needed, not one per task,
  // and a task that blocks never holds back the ones queued behind it).
  size_t waking SB_GUARDED_BY(mu) = 0;
  bool closed SB_GUARDED_BY(mu) = false;
  // shutdown() waits for running tasks until then at most; then the
  // threads are detached (`abandoned`) and this state is kept for them.
  std::optional<std::chrono::steady_clock::time_point> shutdown_deadline SB_GUARDED_BY(mu);
  bool abandoned SB_GUARDED_BY(mu) = false;
  CondVar exit_cv;  // `live` reached 0
  std::chrono::milliseconds idle_timeout SB_GUARDED_BY(mu) = kDefaultIdleTimeout;
  std::shared_ptr<AgentMetrics> agent_metrics SB_GUARDED_BY(mu);

  Mutex join_mu;  // one join_all() at a time

  void start_thread() SB_REQUIRES(mu);
  void maybe_grow() SB_REQUIRES(mu);
  void wake_one() SB_REQUIRES(mu);
  void retire_self() SB_REQUIRES(mu);
  void run() SB_EXCLUDES(mu);
  void run_task(std::function<void()>& task) SB_EXCLUDES(mu);
  void close() SB_EXCLUDES(mu);
  void join_all() SB_EXCLUDES(mu, join_mu);
  // join_all(), or, when the shutdown deadline passes while tasks still
  // run, detaches the threads and keeps this state for them (false).
  bool join_all_until_deadline(const std::shared_ptr<Impl>& self) SB_EXCLUDES(mu, join_mu);
};

namespace {

thread_local ThreadPool::Impl* tl_pool = nullptr;  // the pool this thread serves
thread_local int tl_blocked_depth = 0;             // nesting of BlockedScope
// at_thread_exit()'s hooks of this thread, oldest first.
thread_local std::vector<std::function<void()>> tl_exit_hooks;

// Runs (and drops) this thread's exit hooks, newest first.
void run_exit_hooks(const std::string& pool_name) {
  while (!tl_exit_hooks.empty()) {
    std::function<void()> hook = std::move(tl_exit_hooks.back());
    tl_exit_hooks.pop_back();
    try {
      hook();
    } catch (...) {
      detail::log_uncaught(fmt::format("ThreadPool \"{}\" thread exit hook", pool_name),
                           std::current_exception());
    }
  }
}

void join_each(std::vector<std::thread>& threads) {
  for (auto& t : threads) t.join();
  threads.clear();
}

// Joins the threads of pools destroyed on one of their own threads (which
// cannot join themselves). Its one thread is started on first use and
// joined when the process exits.
class Reaper {
 public:
  static Reaper& instance() {
    static Reaper reaper;
    return reaper;
  }

  void adopt(std::shared_ptr<ThreadPool::Impl> pool) SB_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    pending_.push_back(std::move(pool));
    cv_.notify_one();
  }

  // Keeps the state of a pool whose threads were left running past its
  // shutdown deadline (they use it until they return; never freed, not
  // even when the process exits: such a thread may still run while the
  // static objects, this reaper among them, are destroyed).
  void keep(std::shared_ptr<ThreadPool::Impl> pool) SB_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    kept_->push_back(std::move(pool));
  }

  ~Reaper() SB_EXCLUDES(mu_) {
    std::thread thread;
    {
      MutexLock lock(mu_);
      stopping_ = true;
      thread = std::move(thread_);  // joined below, outside the lock
    }
    cv_.notify_one();
    if (thread.joinable()) thread.join();
  }

 private:
  void loop() SB_EXCLUDES(mu_) {
    pthread_setname_np(pthread_self(), "sb-pool-reaper");
    MutexLock lock(mu_);
    for (;;) {
      cv_.wait(mu_, [&]() SB_REQUIRES(mu_) { return !pending_.empty() || stopping_; });
      if (pending_.empty()) return;
      auto pool = std::move(pending_.front());
      pending_.pop_front();
      lock.unlock();
      pool->join_all();
      pool.reset();
      lock.lock();
    }
  }

  Mutex mu_;
  CondVar cv_;
  std::deque<std::shared_ptr<ThreadPool::Impl>> pending_ SB_GUARDED_BY(mu_);
  // Deliberately leaked (see keep()); reachable from here, so leak checkers
  // do not report it.
  std::vector<std::shared_ptr<ThreadPool::Impl>>* const kept_ SB_PT_GUARDED_BY(mu_) =
      new std::vector<std::shared_ptr<ThreadPool::Impl>>();
  bool stopping_ SB_GUARDED_BY(mu_) = false;
  std::thread thread_ SB_GUARDED_BY(mu_);
};

}  // namespace

void ThreadPool::Impl::start_thread() {
  threads.emplace_back([this] { run(); });
  ++live;
}

// Growth rule: there is queued work no idle thread will take, and blocked
// threads (and retiring ones running their exit hooks) leave fewer than
// num_threads threads able to run it.
void ThreadPool::Impl::maybe_grow() {
  if (abandoned) return;  // no thread may be added that nobody would join
  if (queue.size() <= idle || live >= num_threads + blocked + exiting ||
      live >= max_threads) {
    return;
  }
  try {
    start_thread();
  } catch (const std::exception& e) {
    spdlog::warn("ThreadPool \"{}\": cannot start thread {} of at most {}: {}", name,
                 live + 1, max_threads, e.what());
  }
}

// Signals one idle thread, under the lock so that every thread counted
// idle is inside its wait and the signal cannot be lost.
void ThreadPool::Impl::wake_one() {
  if (idle <= waking) return;
  ++waking;
  work_cv.notify_one();
}

void ThreadPool::Impl::retire_self() {
  auto self = std::find_if(threads.begin(), threads.end(), [](const std::thread& t) {
    return t.get_id() == std::this_thread::get_id();
  });
  if (self != threads.end()) {
    retired.push_back(std::move(*self));
    threads.erase(self);
  }
  if (--live == 0) exit_cv.notify_all();
}

void ThreadPool::Impl::run_task(std::function<void()>& task) {
  try {
    task();
  } catch (...) {
    detail::log_uncaught(fmt::format("ThreadPool \"{}\" task", name),
                         std::current_exception());
  }
  try {
    task = nullptr;  // destroy what the task captured before taking the lock
  } catch (...) {
    detail::log_uncaught(fmt::format("ThreadPool \"{}\" task destructor", name),
                         std::current_exception());
  }
}

void ThreadPool::Impl::run() {
  tl_pool = this;
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
  MutexLock lock(mu);
  for (;;) {
    if (!queue.empty()) {
      auto task = std::move(queue.front());
      queue.pop_front();
      if (!queue.empty()) wake_one();
      lock.unlock();
      run_task(task);
      lock.lock();
      continue;
    }
    if (closed) {
      if (tl_exit_hooks.empty()) break;
      lock.unlock();
      run_exit_hooks(name);
      lock.lock();
      continue;  // the queue stays empty once closed: breaks next time
    }
    if (!retired.empty()) {  // join threads that left while idle
      auto done = std::move(retired);
      retired.clear();
      lock.unlock();
      join_each(done);
      lock.lock();
      continue;
    }
    ++idle;
    const auto deadline = std::chrono::steady_clock::now() + idle_timeout;
    bool woken = true;
    while (queue.empty() && !closed) {
      const bool timed_out = work_cv.wait_until(mu, deadline) == std::cv_status::timeout;
      // Every return from the wait uses up one signal (a spurious or timed
      // out one as well: the count then errs low, which costs at most an
      // extra wake-up, never a missed one).
      if (waking > 0) --waking;
      if (timed_out) {
        woken = !queue.empty() || closed;
        break;
      }
    }
    --idle;
    if (!woken && live > num_threads + exiting) {
      if (!tl_exit_hooks.empty()) {
        ++exiting;
        lock.unlock();
        run_exit_hooks(name);
        lock.lock();
        --exiting;
        if (!queue.empty() || closed) continue;  // needed after all (see the header)
      }
      retire_self();
      return;
    }
  }
  if (--live == 0) exit_cv.notify_all();
}

void ThreadPool::Impl::close() {
  {
    MutexLock lock(mu);
    closed = true;
  }
  work_cv.notify_all();
}

// Called after close(), never on one of this pool's threads. Threads may
// still be started while the queue drains (growth), hence the loop.
void ThreadPool::Impl::join_all() {
  MutexLock join_lock(join_mu);
  for (;;) {
    std::vector<std::thread> batch;
    {
      MutexLock lock(mu);
      batch = std::move(threads);
      threads.clear();
      for (auto& t : retired) batch.push_back(std::move(t));
      retired.clear();
    }
    if (batch.empty()) return;
    join_each(batch);
  }
}

bool ThreadPool::Impl::join_all_until_deadline(const std::shared_ptr<Impl>& self) {
  {
    MutexLock lock(mu);
    if (abandoned) return false;
    if (shutdown_deadline) {
      exit_cv.wait_until(mu, *shutdown_deadline, [&]() SB_REQUIRES(mu) { return live == 0; });
    }
    if (shutdown_deadline && live > 0) {
      // Past the deadline: the threads finish what they run (and what is
      // queued) on their own; nobody waits for them.
      spdlog::warn(
          "ThreadPool \"{}\": shutdown's deadline passed with {} task(s) still running and "
          "{} queued; their threads are left to finish on their own (a handler that does "
          "not stop when its call is cancelled keeps its thread)",
          name, live - idle, queue.size());
      abandoned = true;
      for (auto& t : threads) t.detach();
      for (auto& t : retired) t.detach();
      threads.clear();
      retired.clear();
    }
  }
  bool left_running = false;
  {
    MutexLock lock(mu);
    left_running = abandoned;
  }
  if (left_running) {
    Reaper::instance().keep(self);
    return false;
  }
  join_all();
  return true;
}

ThreadPool::ThreadPool(size_t num_threads, std::string name, size_t max_threads) {
  SB_REQUIRE(num_threads > 0, "ThreadPool \"{}\": num_threads must be at least 1", name);
  if (max_threads == 0) max_threads = std::max<size_t>(32 * num_threads, 64);
  SB_REQUIRE(max_threads >= num_threads,
             "ThreadPool \"{}\": max_threads {} is below num_threads {}", name,
             max_threads, num_threads);
  impl_ = std::make_shared<Impl>(num_threads, std::move(name), max_threads);
  impl_->owner.store(this);
  try {
    MutexLock lock(impl_->mu);
    for (size_t i = 0; i < num_threads; ++i) impl_->start_thread();
  } catch (...) {
    impl_->close();
    impl_->join_all();
    throw;
  }
}

ThreadPool::~ThreadPool() {
  impl_->owner.store(nullptr);
  impl_->close();
  if (tl_pool != impl_.get()) {
    impl_->join_all_until_deadline(impl_);
    return;
  }
  try {
    Reaper::instance().adopt(impl_);
  } catch (const std::exception& e) {
    // Without a reaper the threads cannot be joined; keep their state alive
    // rather than free it under them.
    spdlog::error(
        "ThreadPool \"{}\": destroyed on its own thread and cannot hand "
        "its threads to the reaper: {}",
        impl_->name, e.what());
    new std::shared_ptr<Impl>(impl_);
  }
}

void ThreadPool::post(std::function<void()> task) {
  SB_REQUIRE(task != nullptr, "ThreadPool \"{}\": post() of an empty task", impl_->name);
  std::vector<std::thread> done;
  {
    MutexLock lock(impl_->mu);
    if (impl_->closed) {
      throw Error(ErrorCode::kCancelled,
                  fmt::format("ThreadPool \"{}\" is shut down: post() rejected the task",
                              impl_->name));
    }
    impl_->queue.push_back(std::move(task));
    impl_->maybe_grow();
    if (impl_->waking == 0) impl_->wake_one();
    done.swap(impl_->retired);
  }
  join_each(done);
}

void ThreadPool::shutdown() {
  impl_->close();
  if (tl_pool == impl_.get()) return;  // cannot join ourselves; see the header
  impl_->join_all_until_deadline(impl_);
}

void ThreadPool::set_shutdown_deadline(std::chrono::steady_clock::time_point deadline) {
  MutexLock lock(impl_->mu);
  impl_->shutdown_deadline = deadline;
}

size_t ThreadPool::size() const {
  MutexLock lock(impl_->mu);
  return impl_->live;
}

const std::string& ThreadPool::name() const { return impl_->name; }

ThreadPool::Stats ThreadPool::stats() const {
  const Impl& p = *impl_;
  MutexLock lock(p.mu);
  return Stats{p.live, p.live - p.idle, p.blocked, p.queue.size()};
}

void ThreadPool::set_agent_metrics(std::shared_ptr<AgentMetrics> metrics) {
  MutexLock lock(impl_->mu);
  impl_->agent_metrics = std::move(metrics);
}

std::shared_ptr<AgentMetrics> ThreadPool::agent_metrics() const {
  MutexLock lock(impl_->mu);
  return impl_->agent_metrics;
}

void ThreadPool::set_idle_timeout(std::chrono::milliseconds timeout) {
  SB_REQUIRE(timeout.count() > 0, "ThreadPool \"{}\": idle timeout must be positive",
             impl_->name);
  MutexLock lock(impl_->mu);
  impl_->idle_timeout = timeout;
}

ThreadPool* ThreadPool::current() {
  return tl_pool == nullptr ? nullptr : tl_pool->owner.load();
}

bool ThreadPool::at_thread_exit(std::function<void()> hook) {
  if (tl_pool == nullptr) return false;
  tl_exit_hooks.push_back(std::move(hook));
  return true;
}

ThreadPool::BlockedScope::BlockedScope() {
  if (tl_pool == nullptr || tl_blocked_depth++ > 0) return;
  MutexLock lock(tl_pool->mu);
  ++tl_pool->blocked;
  tl_pool->maybe_grow();
}

ThreadPool::BlockedScope::~BlockedScope() {
  if (tl_pool == nullptr || --tl_blocked_depth > 0) return;
  MutexLock lock(tl_pool->mu);
  --tl_pool->blocked;
}

namespace detail {

void log_uncaught(const std::string& where, const std::exception_ptr& error) noexcept {
  if (error == nullptr) return;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    try {
      spdlog::error("{}: uncaught exception: {}", where, e.what());
    } catch (...) {
    }
  } catch (...) {
    try {
      spdlog::error("{}: uncaught exception of an unknown type", where);
    } catch (...) {
    }
  }
}

}  // namespace detail

}  // namespace switchboard::rpc
