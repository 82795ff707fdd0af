// CallTable: the bookkeeping of an RPC agent's calls, in both directions,
// written once for every backend (PIPE, PROCESS_GROUP, and yours).
//
// Calls this worker makes: add() gives each an id and a future; the agent
// sends the request and, when the response arrives, complete()s the id.
// The table fails the call by itself when its timeout passes
// (TimeoutError), and the agent fails calls by rule (fail_if: every call to
// a peer that went away) or all at once (close: Error(kCancelled)).
//
// Requests this worker serves: the agent hands each to accept(); the table
// runs the RequestHandler on the executor (the agent's pool) with the
// call's context set (rpc/call_context.h: caller, function, deadline,
// cancellation), turns
// whatever goes wrong (the handler throws, returns an invalid future, its
// future fails, it answers with a request) into an error reply naming this
// worker, and gives the reply to the agent to send. A reply the agent
// cannot send (Request::reply throws) is followed by an error reply that
// says why. A handler's response names no function (Message::function is
// for requests): one that does is answered with an error reply. Requests
// accepted before start() wait for it.
//
// Draining: wait_idle() returns once no call is in flight and no request is
// being handled (join(), leaving a dynamic group, graceful shutdown).
//
// A backend gets timeouts, draining and cancellation from this table; see
// examples/custom_backend.cc for a whole agent built on it.
//
// Threads: one timer thread per table, started by the first call with a
// timeout (fails expired calls). Futures from
// add() run their callbacks on the executor; the table never runs user
// code or completes a future while holding its lock. The table may be used
// from any thread; its destructor closes it and joins the timer (a
// destructor that runs on the timer thread itself hands the thread its
// state and lets it exit).
//
// Metrics: the table counts calls sent, answered and failed (by kind, see
// rpc/metrics.h) and their latency per function, requests served per
// function, and in-flight calls and requests, into the AgentMetrics it is
// given or, by default, the one attached to its executor when that is an
// agent's pool (RpcAgent::pool()): every agent built on the table is
// counted with nothing to write. Each count is made before the future (or
// the reply) it is about completes. The cost: calls made are counted under
// the lock add() and complete() take anyway (plain adds, one clock read at
// each end); a request served costs one atomic add; no lock is added.
//
// Ownership: the table shares the executor. Replies to handler futures
// that complete after the table was closed (or destroyed) are dropped.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "rpc/agent.h"
#include "rpc/future.h"
#include "core/message.h"
#include "rpc/metrics.h"
#include "rpc/thread_pool.h"
#include "rendezvous/quiet_group.h"

namespace switchboard::rpc {

// How many requests of one peer a worker takes at once (waiting for the
// pool or running), by default: a flood from one caller is refused beyond
// it, so that its memory stays bounded and the others keep being served.
inline constexpr size_t kDefaultMaxRequestsPerPeer = 1024;

class CallTable {
 public:
  using Clock = std::chrono::steady_clock;
  using Timeout = std::chrono::milliseconds;

  // A call as the table knows it: for errors ("rpc to "w1" function "f": ...")
  // and for the rules of fail_if().
  struct Call {
    int dst = -1;          // the callee's worker id
    std::string dst_name;  // the callee's name
    std::string function;
    Timeout timeout{0};    // 0: none
  };

  struct Added {
    uint64_t id = 0;           // the request's Message::id
    Future<Message> future;    // completes with the response, or fails
    // Calls in the table now (sent, not yet answered or failed), this one
    // included. A call leaves the table before its future completes, so a
    // caller that adds its next call from its previous call's callback, or
    // as soon as it wakes, is not counted twice: 1 means this call is alone.
    size_t in_flight = 0;
  };

  // A request to serve.
  struct Request {
    Message message;  // type kRequest; its id is the caller's
    WorkerInfo from;
    // Runs on the executor before the handler (e.g. moving tensors to
    // their devices); what it throws becomes the error reply. May be empty.
    std::function<void(Message&)> prepare;
    // Sends the reply (id set; kResponse or kError). Throws when it cannot
    // (its tensors or fields cannot be encoded): it then runs once more
    // with an error reply saying why. Runs where the
    // handler's future runs its callbacks (the executor for the futures
    // Switchboard makes; inline for a handler that failed at once), and
    // not at all once the table is closed or gone. The request counts as
    // being handled until it returns.
    std::function<void(Message)> reply;
    // When it arrived (set by accept() for a request with a timeout): its
    // deadline counts from here, so the time it waits for the pool counts.
    Clock::time_point arrived{};
    // Its caller's epoch then (set by accept(); see cancel_requests_from()).
    uint32_t epoch = 0;
  };

  enum class Idle { kIdle, kTimedOut, kClosed };

  struct Load {
    size_t calls_in_flight = 0;  // added, future not yet completed
    size_t handling = 0;         // accepted, reply not yet given
    uint64_t calls_started = 0;  // every call ever added (rendezvous/quiet_group.h)
  };

  // `agent_name` names this worker in errors; `executor` (non-null) runs
  // handlers and the callbacks of add()'s futures. The table counts into
  // `metrics` (null: the executor's ThreadPool::agent_metrics(), if any).
  CallTable(std::string agent_name, std::shared_ptr<Executor> executor,
            std::shared_ptr<AgentMetrics> metrics = nullptr);
  // close(), then joins the timer thread.
  ~CallTable();
  CallTable(const CallTable&) = delete;
  CallTable& operator=(const CallTable&) = delete;

  // ------------------------------------------------------------ calls made

  // Registers a call. Throws Error(kCancelled) "rpc to "w1" function "f":
  // rpc agent "w0" shut down" once closed, std::invalid_argument for a
  // negative timeout. With a timeout, the call fails with TimeoutError
  // "rpc to "w1" function "f": timed out after 200 ms" unless completed
  // before.
  Added add(Call call);

  // Completes call `id` with `response`. False, dropping the response, when
  // the call is no longer pending (timed out, failed, cancelled) or, with
  // `from`, when it went to another worker.
  bool complete(uint64_t id, Message response, std::optional<int> from = std::nullopt);
  // Fails call `id` with `error`; false when it is no longer pending.
  bool fail(uint64_t id, std::exception_ptr error);
  // Fails every pending call for which `which` is true, each with
  // `error(call)`; returns how many. Both run under the table's lock: they
  // must not call into the table.
  size_t fail_if(const std::function<bool(const Call&)>& which,
                 const std::function<std::exception_ptr(const Call&)>& error);
  // The callee of pending call `id`, if it is pending.
  std::optional<int> destination(uint64_t id) const;

  // ------------------------------------------------------ requests served

  // Requests accepted so far, and from now on, go to `handler` (non-null;
  // once: std::invalid_argument naming the agent otherwise). Requests for
  // the functions `runs_inline` names (when set) are served on the thread
  // that accepts them, not on the executor.
  void start(RpcAgent::RequestHandler handler,
             RpcAgent::InlinePredicate runs_inline = nullptr);
  // Whether start() was called (also after close()).
  bool started() const;
  // Takes `request` to be handled on the executor (or, before start(),
  // once started). False, dropping it, once closed or when the executor
  // refuses it (shut down). A peer (Request::from.id) that has
  // max_requests_per_peer requests accepted and not yet replied to gets
  // this one refused at once: its reply is an Error(kResourceExhausted)
  // naming the peer and the limit (given to Request::reply on this
  // thread), and accept() returns false.
  bool accept(Request request);
  // The limit per peer (0: none); kDefaultMaxRequestsPerPeer by default.
  void set_max_requests_per_peer(size_t limit);
  // How the agent tells a callee that a call to it was cancelled by its
  // caller (Future::cancel() on the call's future): `notifier(dst, id)`,
  // outside the table's lock, on the cancelling thread. Without one, the
  // caller's future is cancelled and the late answer dropped, and the
  // callee is not told. Set it before making calls.
  void set_cancel_notifier(std::function<void(int dst, uint64_t id)> notifier);
  // The callee's side: `peer` cancelled its call `id`; the request, queued
  // or running, sees CallContext::cancelled().
  void cancel_request(int peer, uint64_t id);
  // The peer is gone (its connection lost, it left or was evicted): the
  // requests of it being served see CallContext::cancelled() (their
  // replies cannot reach it). Lock-free; any thread.
  void cancel_requests_from(int peer);
  // A kError reply to `id` for `error`, naming this worker.
  Message error_reply(uint64_t id, std::exception_ptr error) const;
  // A Request::reply that calls `(owner->*respond)(to, reply)` while
  // `owner` lives (agents keep their state in a shared Impl, and a handler
  // may answer after it is gone).
  template <typename Owner>
  static std::function<void(Message)> reply_via(std::weak_ptr<Owner> owner,
                                                void (Owner::*respond)(int, Message),
                                                int to) {
    return [owner = std::move(owner), respond, to](Message reply) {
      if (auto self = owner.lock()) ((*self).*respond)(to, std::move(reply));
    };
  }

  // ------------------------------------------------------------------ both

  // Blocks until no call is in flight and no request is being handled
  // (kIdle), `deadline` passes (kTimedOut; none: waits for ever) or the
  // table is closed (kClosed).
  Idle wait_idle(std::optional<Clock::time_point> deadline);
  // wait_idle() as join() needs it: returns once idle; throws TimeoutError
  // after `timeout` (0: waits for ever) naming the calls in flight and the
  // requests being handled, or Error(kCancelled) once closed. `who` starts
  // both messages, e.g. `join on rpc worker "w0"`.
  void drain(std::chrono::milliseconds timeout, const std::string& who);
  Load load() const;

  // Fails every pending call with Error(kCancelled) (see add()), refuses new
  // calls and requests, drops requests waiting for start(), wakes
  // wait_idle(). Idempotent. Does not wait for running handlers.
  void close();
  bool closed() const;

  const std::string& agent_name() const;

  // Adds what this table counted to out.functions, calls_in_flight and
  // requests_in_progress (what AgentMetrics::collect() does for it).
  void collect_metrics(RpcMetrics& out) const;

 private:
  struct State;
  // Starts the timer thread on the first call with a timeout (with the
  // state's lock held).
  void start_timer_locked();

  std::shared_ptr<State> state_;
  std::thread timer_;
};

// "rpc to "w1" function "f"": how every error about a call begins.
std::string call_prefix(const std::string& dst_name, const std::string& function);

// A call table as the quiet-group rounds see it (rendezvous/quiet_group.h):
//   rpc::QuietCalls local(calls);
//   group.calls = &local;
// Borrows `table`, which must outlive it.
class QuietCalls final : public rendezvous::LocalCalls {
 public:
  explicit QuietCalls(CallTable& table) : table_(table) {}
  Idle wait_idle(std::optional<Clock::time_point> deadline) override;
  Activity activity() const override;
  bool closed() const override { return table_.closed(); }
  std::string agent_name() const override { return table_.agent_name(); }

 private:
  CallTable& table_;
};

}  // namespace switchboard::rpc
