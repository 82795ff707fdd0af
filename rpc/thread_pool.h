// Executor and ThreadPool: where RPC handlers and future callbacks run.
//
// ThreadPool is a fixed set of named threads that grows when its threads
// block. A pool thread that is about to wait for other work (Future::wait
// does this by itself) holds a ThreadPool::BlockedScope while it waits; when
// tasks are queued, no thread is idle and fewer than `num_threads` threads
// are running unblocked, the pool starts another thread (up to
// `max_threads`). So a handler that makes a nested RPC and waits for it
// never starves the pool of the thread that would serve the reply. Threads
// beyond `num_threads` exit after an idle timeout (set_idle_timeout).
//
// Threads and lifetimes: the pool owns its threads and joins every one of
// them, except past a shutdown deadline (set_shutdown_deadline()): then
// shutdown() stops waiting, and the threads still running tasks are left to
// finish them on their own (detached; the pool's state is kept for them
// until the process exits). shutdown() stops accepting tasks, lets the
// threads run every task already queued, then joins them. Called on one of the
// pool's own threads, shutdown() cannot join that thread: it closes the pool
// and returns at once; the threads exit once the queue is empty and are
// joined by the next shutdown() made from another thread, or by the
// destructor. When the destructor itself runs on one of the pool's threads
// (the last shared_ptr dropped inside a task), the pool's state is handed
// to a process-wide reaper thread that joins the pool's threads once they
// finish; that reaper is joined when the process exits.
//
// Tasks that throw: the exception is logged (spdlog, naming the pool) and
// the thread goes on with the next task.
//
// Thread safety: every method may be called from any thread, including the
// pool's own threads.
#pragma once

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <string>

namespace switchboard::rpc {

class AgentMetrics;

// Something that runs tasks, later and possibly on another thread.
class Executor {
 public:
  virtual ~Executor() = default;
  // Takes ownership of `task` and runs it once. An executor that cannot
  // accept the task throws, and then must neither run nor keep it (Future
  // relies on this to run a callback inline instead).
  virtual void post(std::function<void()> task) = 0;
};

class ThreadPool final : public Executor {
 public:
  // Starts `num_threads` (>= 1) threads named `name` (pthread_setname_np,
  // truncated to 15 characters). `max_threads` bounds growth (see the top
  // of this file); 0 means 32 * num_threads, at least 64. Throws
  // std::invalid_argument when num_threads is 0 or max_threads is below
  // num_threads, std::system_error when a thread cannot be started.
  ThreadPool(size_t num_threads, std::string name, size_t max_threads = 0);
  // Calls shutdown(); see the top of this file for the case where the
  // destructor runs on one of the pool's own threads.
  ~ThreadPool() override;
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Queues `task` (which must not be empty: std::invalid_argument) to run
  // once on a pool thread. Tasks start in the order they were posted.
  // After shutdown() began: throws Error(ErrorCode::kCancelled) naming the
  // pool, and `task` is destroyed without running.
  void post(std::function<void()> task) override;

  // Stops accepting tasks, runs the tasks already queued, and joins every
  // thread (waiting for running tasks to return), or, when the shutdown
  // deadline passes first, leaves the threads still at work to finish on
  // their own (logged with how many tasks were running). Idempotent. On a
  // pool thread it only closes the pool and returns without waiting (see
  // above).
  void shutdown();
  // Bounds every later shutdown() (the destructor's included): it waits
  // for running tasks until `deadline` at most. What RpcContext::shutdown()
  // sets from its timeout, so that a handler that never returns cannot
  // hold the caller of shutdown.
  void set_shutdown_deadline(std::chrono::steady_clock::time_point deadline);

  // The number of threads now alive (grows past num_threads while threads
  // are blocked, shrinks back after the idle timeout, 0 once joined).
  size_t size() const;
  const std::string& name() const;

  // What the pool is doing now (for metrics): threads alive, those running a
  // task (busy), those of the busy ones inside a BlockedScope (blocked), and
  // tasks waiting for a thread.
  struct Stats {
    size_t threads = 0;
    size_t busy = 0;
    size_t blocked = 0;
    size_t queued = 0;
  };
  Stats stats() const;

  // The metrics of the RPC agent this pool serves (rpc/metrics.h), or null.
  // RpcAgent attaches its own when it creates its pool, and a CallTable
  // whose executor is this pool counts into them: that is how every agent
  // built on CallTable is counted without passing anything.
  void set_agent_metrics(std::shared_ptr<AgentMetrics> metrics);
  std::shared_ptr<AgentMetrics> agent_metrics() const;

  // How long a thread beyond `num_threads` stays idle before it exits
  // (default kDefaultIdleTimeout). Threads already waiting notice the new
  // value after their current wait.
  static constexpr std::chrono::milliseconds kDefaultIdleTimeout{30000};
  void set_idle_timeout(std::chrono::milliseconds timeout);

  // The pool whose thread is calling, or nullptr (also on a thread of a
  // pool whose ThreadPool object has already been destroyed).
  static ThreadPool* current();

  // On a pool thread: runs `hook` on this thread when the thread leaves its
  // pool (it retires after the idle timeout, or the pool shuts down),
  // outside the pool's lock, while the thread still counts as running a
  // task: so post() never joins a thread whose hooks still run (shutdown()
  // and the destructor do wait for them, within the shutdown deadline).
  // A thread that was about to retire and finds a task queued once its
  // hooks ran stays and runs it. Hooks run newest first; one that throws is
  // logged. Returns false, dropping `hook`, on a thread of no pool. What
  // the torch agent uses to free the Python thread state a pool thread
  // keeps (python/csrc/python_thread_state.h).
  static bool at_thread_exit(std::function<void()> hook);

  // Held by a pool thread while it blocks waiting for other work, so that
  // the pool can start another thread (see above). Scopes nest; only the
  // outermost one counts. No-op on a thread that belongs to no pool. Must
  // be destroyed on the thread that created it.
  class BlockedScope {
   public:
    BlockedScope();
    ~BlockedScope();
    BlockedScope(const BlockedScope&) = delete;
    BlockedScope& operator=(const BlockedScope&) = delete;
  };

  struct Impl;  // shared with the worker threads and the reaper

 private:
  std::shared_ptr<Impl> impl_;
};

namespace detail {
// Logs an exception that escaped a task or a callback: `where` names what
// ran it (e.g. `ThreadPool "rpc"` or `Future callback`). Never throws.
void log_uncaught(const std::string& where, const std::exception_ptr& error) noexcept;
}  // namespace detail

}  // namespace switchboard::rpc
