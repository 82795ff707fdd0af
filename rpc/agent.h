// RpcAgent: the interface every RPC backend implements (PIPE,
// PROCESS_GROUP, or a user's own, registered through backend_registry.h).
//
// An agent moves Messages between the workers of one group. The RPC layer
// (rpc/rpc.h) gives it a RequestHandler at start(); the agent calls it on
// its pool (never on an I/O thread) for every request it receives and sends
// back whatever response the handler's future completes with (a handler
// may return an unfinished future: the reply goes out when it completes,
// without holding a pool thread — PyTorch's @async_execution).
//
// send() returns at once with a future that completes with the response,
// or fails with:
//   TimeoutError    no response within `timeout` (0: no timeout); the
//                   message names the worker, the function and the timeout
//   ConnectionError the connection to the worker failed or it left
//   Error(kCancelled) the agent shut down before the response arrived
// An error response (MessageType::kError) completes the future normally:
// the RPC layer turns it into a RemoteError.
//
// Lifecycle: construct (rendezvous is the backend's business) → start() →
// send()/serve → join() (optional) → shutdown() → destroy. shutdown() is
// idempotent and bounded (it waits only for handlers that are already
// running); the destructor calls it.
//
// Thread safety: every method may be called from any thread, except that
// start() is called once before anything else and the destructor last.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "rpc/future.h"
#include "core/message.h"
#include "rpc/metrics.h"
#include "rpc/thread_pool.h"

namespace switchboard::rpc {

// Worker names: 1 to kMaxWorkerNameLength letters, digits, '_', '-' or ':'.
inline constexpr size_t kMaxWorkerNameLength = 128;
// Throws std::invalid_argument naming `name` and the rule when it breaks it.
void validate_worker_name(const std::string& name);

// A change in a dynamic group's membership, as its agent reports it.
struct MembershipChange {
  enum class Kind { kJoined, kLeft };
  Kind kind = Kind::kJoined;
  WorkerInfo worker;
  // kLeft: "left the group" (it said goodbye) or "lost its connection (...)".
  std::string reason;
};
using MembershipListener = std::function<void(const MembershipChange&)>;

class RpcAgent {
 public:
  using Timeout = std::chrono::milliseconds;
  // Serves one request from `from`; the returned future's value is the
  // response (type kResponse or kError; the agent sets its id).
  using RequestHandler =
      std::function<Future<Message>(Message request, const WorkerInfo& from)>;

  // `num_worker_threads`: the pool that runs handlers and future callbacks.
  RpcAgent(WorkerInfo self, size_t num_worker_threads);
  virtual ~RpcAgent();
  RpcAgent(const RpcAgent&) = delete;
  RpcAgent& operator=(const RpcAgent&) = delete;

  // Begins serving: from now on requests reach `handler`, on the pool.
  virtual void start(RequestHandler handler) = 0;

  // Which functions run on the thread that received their request (an I/O
  // thread, or the same-host lane's reader) instead of the pool: one
  // thread hand-off less per call, for short functions that never block
  // (FunctionRegistry::register_inline_function). Set before start(); an
  // agent that has no such thread runs them on the pool.
  using InlinePredicate = std::function<bool(std::string_view function)>;
  void set_inline_functions(InlinePredicate runs_inline) {
    inline_functions_ = std::move(runs_inline);
  }
  const InlinePredicate& inline_functions() const { return inline_functions_; }

  // Sends `request` (type kRequest) to `to`. See above for the errors.
  virtual Future<Message> send(const WorkerInfo& to, Message request,
                               Timeout timeout) = 0;

  const WorkerInfo& self() const { return self_; }
  // Lookup; NotFoundError naming the worker when there is none.
  virtual WorkerInfo worker(const std::string& name) const = 0;
  virtual WorkerInfo worker(int id) const = 0;
  virtual std::vector<WorkerInfo> workers() const = 0;

  // Static groups: returns when every worker called join() and the group
  // is quiet: none has requests in flight (sent and unanswered) or will
  // send more (rendezvous/quiet_group.h does this over the store). Dynamic groups:
  // this worker leaves (see the agent). TimeoutError after `timeout`.
  virtual void join(Timeout timeout) = 0;

  // Agents of dynamic groups call `listener` on the pool, once per change,
  // after a worker joined or left (the workers present at init are not
  // reported). Replaces any earlier listener; nullptr removes it. The
  // default implementation (static groups) never calls it.
  virtual void set_membership_listener(MembershipListener listener) { (void)listener; }
  // Stops serving and sending; fails pending futures with
  // Error(kCancelled); joins every thread. Idempotent. Waits for handlers
  // already running until the pool's shutdown deadline
  // (ThreadPool::set_shutdown_deadline; RpcContext::shutdown sets it from
  // its timeout), nothing else.
  virtual void shutdown() = 0;

  // The pool that runs handlers and callbacks (shared with the RPC layer).
  const std::shared_ptr<ThreadPool>& pool() const { return pool_; }

  // ------------------------------------------------------------ metrics

  // This worker's metrics now (rpc/metrics.h): what its CallTables counted,
  // the peers its transport reports, its pool; `store` stays empty (the RPC
  // layer adds the store's). Any time, from any thread, also after
  // shutdown() (the totals stay).
  RpcMetrics metrics_snapshot() const;
  // The same, flat (torch's agent.get_metrics()): RpcMetrics::as_map().
  std::map<std::string, double> get_metrics() const;

  // Where this agent counts: CallTables on pool() find it by themselves; a
  // transport takes the counters of each peer from metrics()->peer(id,
  // name) when it connects, bumps them per message and sets the
  // connection's state.
  const std::shared_ptr<AgentMetrics>& metrics() const { return metrics_; }

 protected:
  // For agents that know more than metrics() holds: called by
  // metrics_snapshot() after everything else was filled in; may add to any
  // part of `out`. Must not block for long (scrapes call it). Default:
  // nothing.
  virtual void collect_metrics(RpcMetrics& out) const { (void)out; }

 private:
  WorkerInfo self_;
  InlinePredicate inline_functions_;
  std::shared_ptr<ThreadPool> pool_;
  std::shared_ptr<AgentMetrics> metrics_;
};

}  // namespace switchboard::rpc
