#include "rpc/call_table.h"

#include <fmt/format.h>
#include <pthread.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <deque>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/check.h"
#include "common/error.h"
#include "common/metrics.h"
#include "common/mutex.h"
#include "core/remote_error.h"
#include "rpc/call_context.h"
#include "rpc/caller_requests.h"
#include "rpc/fair_queue.h"
#include "rpc/function_stats.h"

namespace switchboard::rpc {

std::string call_prefix(const std::string& dst_name, const std::string& function) {
  return fmt::format("rpc to \"{}\" function \"{}\"", dst_name, function);
}

namespace {

using Clock = CallTable::Clock;

// A call taken out of the table (and counted as failed) to be failed
// outside the lock.
struct Failure {
  Promise<Message> promise;
  std::exception_ptr error;
};

std::exception_ptr shut_down_error(const std::string& agent, const CallTable::Call& call) {
  return std::make_exception_ptr(
      Error(ErrorCode::kCancelled, fmt::format("{}: rpc agent \"{}\" shut down",
                                               call_prefix(call.dst_name, call.function),
                                               agent)));
}

}  // namespace

// Everything the table knows, shared with its timer thread and (weakly)
// with the callbacks of handlers' futures, so that either may outlive the
// CallTable object.
struct CallTable::State : std::enable_shared_from_this<State>,
                          AgentMetrics::Source,
                          CancelHook {
  struct Pending {
    Promise<Message> promise;
    Call call;
    Clock::time_point deadline;  // when call.timeout > 0
    Clock::time_point sent_at;
    FunctionStats* stats;        // an entry of `functions`
  };

  State(std::string name_in, std::shared_ptr<Executor> executor_in)
      : name(std::move(name_in)), executor(std::move(executor_in)) {}

  const std::string name;
  const std::shared_ptr<Executor> executor;

  mutable Mutex mu;
  CondVar idle_cv;   // in_flight or handling reached 0, or closed
  CondVar timer_cv;  // an earlier deadline than `armed`, or closed
  bool closed SB_GUARDED_BY(mu) = false;
  uint64_t next_id SB_GUARDED_BY(mu) = 1;
  std::unordered_map<uint64_t, Pending> pending SB_GUARDED_BY(mu);
  std::set<std::pair<Clock::time_point, uint64_t>> deadlines SB_GUARDED_BY(mu);
  // What the timer thread sleeps until (max: until woken). A new deadline
  // wakes it only when earlier, so a stream of calls with one timeout
  // costs no wake-ups.
  Clock::time_point armed SB_GUARDED_BY(mu) = Clock::time_point::max();
  // Calls added whose future has not been completed yet (>= pending.size():
  // a call leaves `pending` just before its future completes), and requests
  // accepted whose reply has not been given yet. Atomic, so that a call or
  // request that ends takes the lock only when it leaves the table idle
  // with someone in wait_idle() (see wake_idle_waiters()).
  std::atomic<size_t> in_flight{0};
  std::atomic<size_t> handling{0};
  std::atomic<uint64_t> calls_added{0};  // calls ever added
  // Requests whose reply has not been handed to the agent yet: what the
  // metrics call in progress (a caller that has its answer sees its request
  // counted out). `handling` lasts until the reply was given.
  std::atomic<size_t> serving{0};
  // Per caller: the limit, epochs, cancelled requests.
  CallerRequests callers{kDefaultMaxRequestsPerPeer};
  // Threads in wait_idle(); changed under `mu`.
  std::atomic<int> idle_waiters{0};
  std::shared_ptr<const RpcAgent::RequestHandler> handler SB_GUARDED_BY(mu);
  // Set by start(), before `started`; then only read.
  RpcAgent::InlinePredicate runs_inline;
  // Set under `mu` (with `handler`); read without it by started(), which
  // PIPE asks on every call. Stays true after close().
  std::atomic<bool> started{false};
  std::deque<Request> early SB_GUARDED_BY(mu);  // accepted before start()
  // Requests waiting for the pool, per caller. Each request posts one task
  // to the executor, and a task serves the next caller's oldest request,
  // whoever posted it (fair queuing): a caller with many requests waiting
  // gets one pool thread in turn with every other caller that waits, not
  // the whole pool until its backlog is through.
  FairQueue<Request> waiting;
  // Pending and the serving path keep references to its entries.
  FunctionStatsTable functions SB_GUARDED_BY(mu);

  FunctionStats& stats_for(const std::string& function) SB_REQUIRES(mu) {
    return functions.stats_for(function);
  }

  void collect(RpcMetrics& out) const override SB_EXCLUDES(mu) {
    MutexLock lock(mu);
    functions.collect(out);
    // Calls not answered or failed yet: they leave `pending` before their
    // futures complete (in_flight drops only after), so a caller whose call
    // just returned never sees it still counted.
    out.calls_in_flight += pending.size();
    out.requests_in_progress += serving.load();
  }

  bool idle() const { return in_flight.load() == 0 && handling.load() == 0; }

  // Who this table waits on, for debug logs of a worker that does not
  // drain: "2 calls in flight (to "w1": "slow" (id 7), ...) and 1 request
  // being handled".
  std::string describe_load() const SB_REQUIRES(mu) {
    constexpr size_t kListed = 8;
    std::string calls;
    size_t listed = 0;
    for (const auto& [id, p] : pending) {
      if (listed == kListed) {
        calls += ", ...";
        break;
      }
      calls += fmt::format("{}to \"{}\": \"{}\" (id {})", listed == 0 ? "" : ", ",
                           p.call.dst_name, p.call.function, id);
      ++listed;
    }
    const size_t calls_now = in_flight.load();
    const size_t handling_now = handling.load();
    return fmt::format("{} call{} in flight{} and {} request{} being handled", calls_now,
                       calls_now == 1 ? "" : "s",
                       calls.empty() ? "" : fmt::format(" ({})", calls), handling_now,
                       handling_now == 1 ? "" : "s");
  }

  // The agent's way to tell a callee that a call was cancelled (null: not
  // told). Set before calls are made.
  std::function<void(int dst, uint64_t id)> cancel_notifier SB_GUARDED_BY(mu);

  // Future::cancel() on call `id`: out of the table (a late answer is
  // dropped), counted as cancelled, and the callee told.
  void on_cancelled(uint64_t id) override SB_EXCLUDES(mu) {
    std::optional<Pending> p;
    std::function<void(int, uint64_t)> notify;
    {
      MutexLock lock(mu);
      p = take(id);
      if (!p) return;
      p->stats->failure(FailureKind::kCancelled);
      notify = cancel_notifier;
    }
    calls_done(1);
    if (notify) {
      try {
        notify(p->call.dst, id);
      } catch (const std::exception& e) {
        spdlog::debug("rpc agent \"{}\": the callee of cancelled call {} was not told: {}", name,
                      id, e.what());
      }
    }
  }

  // Removes call `id` from `pending` (and its deadline); null when absent.
  std::optional<Pending> take(uint64_t id) SB_REQUIRES(mu) {
    auto it = pending.find(id);
    if (it == pending.end()) return std::nullopt;
    Pending p = std::move(it->second);
    pending.erase(it);
    if (p.call.timeout.count() > 0) deadlines.erase({p.deadline, id});
    return p;
  }

  // Takes call `id` out of `pending` to be failed with `error` of `kind`,
  // and counts it; false when it is not pending.
  bool take_failed(uint64_t id, std::exception_ptr error, FailureKind kind,
                   std::vector<Failure>& out) SB_REQUIRES(mu) {
    std::optional<Pending> p = take(id);
    if (!p) return false;
    p->stats->failure(kind);
    out.push_back({std::move(p->promise), std::move(error)});
    return true;
  }

  // Completes calls taken out of `pending` (and counted), outside the lock,
  // then counts them out of `in_flight`.
  void settle(std::vector<Failure> failures) SB_EXCLUDES(mu) {
    if (failures.empty()) return;
    for (Failure& f : failures) f.promise.set_error(std::move(f.error));
    calls_done(failures.size());
  }

  void calls_done(size_t n) SB_EXCLUDES(mu) {
    if (in_flight.fetch_sub(n) == n) wake_idle_waiters();
  }

  void handling_done() SB_EXCLUDES(mu) {
    if (handling.fetch_sub(1) == 1) wake_idle_waiters();
  }

  // A request is answered (or dropped): its caller may send the next one at
  // once, so its place under the limit and its count in the metrics go
  // before the reply does.
  void request_answered(int peer, uint64_t id) SB_EXCLUDES(mu) {
    callers.forget(peer, id);
    callers.release(peer);
    serving.fetch_sub(1, std::memory_order_relaxed);
  }
  // A request is over (replied to, or dropped).
  void request_done(int peer, uint64_t id) SB_EXCLUDES(mu) {
    request_answered(peer, id);
    handling_done();
  }

  // A count reached 0: wakes wait_idle(), if anyone waits. The waiter adds
  // itself to idle_waiters before it reads the counts, and this reads
  // idle_waiters after the count dropped (all sequentially consistent), so
  // either the waiter sees the count at 0 or this sees the waiter; taking
  // `mu` to notify means the waiter is either not yet checking or already
  // waiting.
  void wake_idle_waiters() SB_EXCLUDES(mu) {
    if (idle_waiters.load() == 0) return;
    MutexLock lock(mu);
    idle_cv.notify_all();
  }

  void run_timer() SB_EXCLUDES(mu) {
    pthread_setname_np(pthread_self(), "sb-call-timer");
    MutexLock lock(mu);
    while (!closed) {
      if (deadlines.empty()) {
        armed = Clock::time_point::max();
        timer_cv.wait(mu);
        continue;
      }
      const Clock::time_point next = deadlines.begin()->first;
      if (Clock::now() < next) {
        armed = next;
        timer_cv.wait_until(mu, next);
        continue;
      }
      std::vector<Failure> expired;
      const auto now = Clock::now();
      while (!deadlines.empty() && deadlines.begin()->first <= now) {
        const uint64_t id = deadlines.begin()->second;
        const Call& call = pending.at(id).call;
        take_failed(id,
                    std::make_exception_ptr(TimeoutError(
                        fmt::format("{}: timed out after {} ms",
                                    call_prefix(call.dst_name, call.function),
                                    call.timeout.count()))),
                    FailureKind::kTimeout, expired);
      }
      lock.unlock();
      settle(std::move(expired));
      lock.lock();
    }
  }

  // On the executor: runs the handler, and gives its answer to
  // request.reply once the handler's future completes.
  void serve(Request request) SB_EXCLUDES(mu) {
    std::shared_ptr<const RpcAgent::RequestHandler> h;
    FunctionStats* stats = nullptr;
    {
      MutexLock lock(mu);
      if (!closed) {
        h = handler;
        stats = &stats_for(request.message.function);
      }
    }
    const int from = request.from.id;
    if (!h) {  // closed since it was accepted: dropped
      request_done(from, request.message.id);
      return;
    }
    if (callers.request_cancelled(from, request.message.id)) {
      // Its caller cancelled it while it waited for the pool: not run.
      spdlog::debug("rpc agent \"{}\": request {} of \"{}\" was cancelled before it ran",
                    name, request.message.id, request.from.name);
      request_done(from, request.message.id);
      return;
    }
    const uint64_t id = request.message.id;
    Future<Message> result;
    // The deadline counts from the arrival: what waited for the pool counts.
    CallContext context{request.from, request.message.function, id, std::nullopt};
    if (request.message.timeout_ms != 0) {
      context.deadline = request.arrived + std::chrono::milliseconds(request.message.timeout_ms);
    }
    context.caller_epoch = callers.epoch_of(from);
    context.epoch_at_arrival = request.epoch;
    context.table = &callers;
    ScopedCallContext scope(&context);
    try {
      if (request.prepare) request.prepare(request.message);
      result = (*h)(std::move(request.message), request.from);
      SB_ASSERT(result.valid(), "the request handler returned an invalid future");
    } catch (...) {
      result = Future<Message>::failed(std::current_exception());
    }
    std::weak_ptr<State> weak = weak_from_this();
    result.add_callback(
        [weak, id, from, stats, reply = std::move(request.reply)](const Future<Message>& done) {
          if (auto self = weak.lock()) self->answer(id, from, done, *stats, reply);
        });
  }

  void answer(uint64_t id, int from, const Future<Message>& done, FunctionStats& stats,
              const std::function<void(Message)>& reply) SB_EXCLUDES(mu) {
    Message m;
    try {
      if (done.has_error()) std::rethrow_exception(done.error());
      m = done.value();
      SB_ASSERT(m.type == MessageType::kResponse || m.type == MessageType::kError,
                "the request handler answered with message type {}",
                static_cast<int>(m.type));
      SB_ASSERT(m.function.empty(),
                "the request handler answered naming function \"{}\"; responses name "
                "none",
                m.function);
      m.id = id;
    } catch (...) {
      m = error_reply(id, std::current_exception());
    }
    request_answered(from, id);
    bool closed_now = false;
    {
      MutexLock lock(mu);
      closed_now = closed;
    }
    try {
      if (closed_now) {
        spdlog::debug("rpc agent \"{}\": the reply to call {} is dropped: shut down", name,
                      id);
      } else {
        send_reply(id, std::move(m), stats, reply);
      }
    } catch (const std::exception& e) {
      spdlog::warn("rpc agent \"{}\": the reply to call {} was not sent: {}", name, id,
                   e.what());
    }
    handling_done();
  }

  // Gives `m` to `reply`; when the agent cannot send it (its encoder
  // refuses it), an error reply saying why goes instead, so that the caller
  // is answered rather than left to its timeout. Counts the request as
  // served (and failed, when the reply is an error or becomes one) before
  // the caller can see the reply.
  void send_reply(uint64_t id, Message m, FunctionStats& stats,
                  const std::function<void(Message)>& reply) const {
    const bool error = m.type == MessageType::kError;
    stats.served.add();
    if (error) stats.served_failed.add();
    try {
      reply(std::move(m));
    } catch (const std::exception& e) {
      spdlog::warn("rpc agent \"{}\": the reply to call {} cannot be sent ({}); sending "
                   "an error reply instead",
                   name, id, e.what());
      if (!error) stats.served_failed.add();
      reply(error_reply(id, std::current_exception()));
    }
  }

  Message error_reply(uint64_t id, std::exception_ptr error) const {
    Message m;
    m.id = id;
    encode_remote_error(m, name, std::move(error));
    return m;
  }

  // Hands an accepted request (counted in `handling`) to the executor.
  bool post(Request request) SB_EXCLUDES(mu) {
    const int from = request.from.id;
    const uint64_t id = request.message.id;
    waiting.push(from, std::move(request));
    try {
      executor->post([self = shared_from_this()] { self->serve_next(); });
      return true;
    } catch (const std::exception& e) {
      // Not run: one request of this caller's goes with it (the latest,
      // this one, unless a task took it already and left an older one).
      spdlog::debug("rpc agent \"{}\": request dropped: {}", name, e.what());
      const std::optional<Request> dropped = waiting.take_newest(from);
      request_done(dropped ? dropped->from.id : from, dropped ? dropped->message.id : id);
      return false;
    }
  }

  // A pool task: the oldest waiting request of the caller whose turn it is.
  void serve_next() SB_EXCLUDES(mu) {
    std::optional<Request> next = waiting.pop();
    if (!next) return;
    serve(std::move(*next));
  }
};

CallTable::CallTable(std::string agent_name, std::shared_ptr<Executor> executor,
                     std::shared_ptr<AgentMetrics> metrics) {
  SB_REQUIRE(executor != nullptr, "call table of rpc agent \"{}\": the executor is null",
             agent_name);
  if (!metrics) {
    if (auto* pool = dynamic_cast<ThreadPool*>(executor.get())) metrics = pool->agent_metrics();
  }
  state_ = std::make_shared<State>(std::move(agent_name), std::move(executor));
  if (metrics) metrics->add_source(state_);
}

CallTable::~CallTable() { close(); }

CallTable::Added CallTable::add(Call call) {
  SB_REQUIRE(call.timeout.count() >= 0, "{}: negative timeout {} ms",
             call_prefix(call.dst_name, call.function), call.timeout.count());
  State& s = *state_;
  Promise<Message> promise(s.executor);
  Added added;
  added.future = promise.get_future();
  const bool timed = call.timeout.count() > 0;
  const auto now = Clock::now();
  const auto deadline = timed ? now + call.timeout : Clock::time_point::max();
  MutexLock lock(s.mu);
  if (s.closed) std::rethrow_exception(shut_down_error(s.name, call));
  FunctionStats& stats = s.stats_for(call.function);
  ++stats.sent;
  added.id = s.next_id++;
  if (timed) {
    s.deadlines.emplace(deadline, added.id);
    if (deadline < s.armed) {
      s.armed = deadline;
      s.timer_cv.notify_one();
      start_timer_locked();
    }
  }
  promise.on_cancel(std::weak_ptr<CancelHook>(state_), added.id);
  s.pending.emplace(added.id, State::Pending{std::move(promise), std::move(call), deadline,
                                             now, &stats});
  s.calls_added.fetch_add(1, std::memory_order_relaxed);
  s.in_flight.fetch_add(1);
  // Calls still in the table: not the one whose future is completing
  // while its caller adds the next (see Added::in_flight).
  added.in_flight = s.pending.size();
  return added;
}

void CallTable::start_timer_locked() {
  if (timer_.joinable()) return;
  timer_ = std::thread([state = state_] { state->run_timer(); });
}

bool CallTable::complete(uint64_t id, Message response, std::optional<int> from) {
  State& s = *state_;
  const auto now = Clock::now();
  std::optional<State::Pending> p;
  {
    MutexLock lock(s.mu);
    auto it = s.pending.find(id);
    if (it == s.pending.end() || (from && it->second.call.dst != *from)) return false;
    p = s.take(id);
    if (response.type == MessageType::kError) {
      p->stats->failure(FailureKind::kRemoteError);
    } else {
      ++p->stats->succeeded;
    }
    p->stats->latency.record(now - p->sent_at);
  }
  p->promise.set_value(std::move(response));
  s.calls_done(1);
  return true;
}

bool CallTable::fail(uint64_t id, std::exception_ptr error) {
  State& s = *state_;
  const FailureKind kind = classify_failure(error);
  std::vector<Failure> failed;
  bool found = false;
  {
    MutexLock lock(s.mu);
    found = s.take_failed(id, std::move(error), kind, failed);
  }
  s.settle(std::move(failed));
  return found;
}

size_t CallTable::fail_if(const std::function<bool(const Call&)>& which,
                          const std::function<std::exception_ptr(const Call&)>& error) {
  State& s = *state_;
  std::vector<Failure> failed;
  {
    MutexLock lock(s.mu);
    std::vector<uint64_t> ids;
    for (const auto& [id, p] : s.pending) {
      if (which(p.call)) ids.push_back(id);
    }
    for (uint64_t id : ids) {
      std::exception_ptr e = error(s.pending.at(id).call);
      const FailureKind kind = classify_failure(e);
      s.take_failed(id, std::move(e), kind, failed);
    }
  }
  const size_t n = failed.size();
  s.settle(std::move(failed));
  return n;
}

std::optional<int> CallTable::destination(uint64_t id) const {
  MutexLock lock(state_->mu);
  auto it = state_->pending.find(id);
  if (it == state_->pending.end()) return std::nullopt;
  return it->second.call.dst;
}

void CallTable::start(RpcAgent::RequestHandler handler,
                      RpcAgent::InlinePredicate runs_inline) {
  State& s = *state_;
  SB_REQUIRE(handler != nullptr, "rpc agent \"{}\": start() with an empty handler", s.name);
  std::deque<Request> early;
  {
    MutexLock lock(s.mu);
    SB_REQUIRE(!s.closed, "rpc agent \"{}\": start() after shutdown()", s.name);
    SB_REQUIRE(!s.started, "rpc agent \"{}\": start() called twice", s.name);
    s.handler = std::make_shared<const RpcAgent::RequestHandler>(std::move(handler));
    s.runs_inline = std::move(runs_inline);
    s.started = true;
    early.swap(s.early);
  }
  for (Request& request : early) s.post(std::move(request));
}

bool CallTable::started() const {
  return state_->started.load();
}

bool CallTable::accept(Request request) {
  State& s = *state_;
  const int from = request.from.id;
  if (request.message.timeout_ms != 0) request.arrived = Clock::now();
  request.epoch = s.callers.epoch_of(from)->load(std::memory_order_relaxed);
  if (!s.callers.reserve(from, !is_bookkeeping_request(request.message.function))) {
    // A peer with this many requests here already is refused at once: the
    // memory a flood takes stays bounded, and the others are served.
    const size_t limit = s.callers.limit();
    const Message refusal = s.error_reply(
        request.message.id,
        std::make_exception_ptr(Error(
            ErrorCode::kResourceExhausted,
            fmt::format("rpc agent \"{}\": worker \"{}\" already has {} requests waiting or "
                        "running here (the limit per caller, max_requests_per_peer); function "
                        "\"{}\" refused, try again once some are answered",
                        s.name, request.from.name, limit, request.message.function))));
    spdlog::debug("rpc agent \"{}\": refused a request of \"{}\": {} in progress", s.name,
                  request.from.name, limit);
    try {
      if (request.reply) request.reply(refusal);
    } catch (const std::exception& e) {
      spdlog::debug("rpc agent \"{}\": the refusal was not sent: {}", s.name, e.what());
    }
    return false;
  }
  bool closed = false;
  {
    MutexLock lock(s.mu);
    closed = s.closed;
    if (!closed) {
      ++s.handling;
      s.serving.fetch_add(1, std::memory_order_relaxed);
      if (!s.started) {
        s.early.push_back(std::move(request));
        return true;
      }
    }
  }
  if (closed) {
    s.callers.release(from);
    return false;
  }
  // Set before `started` (above, under mu): read without the lock.
  if (s.runs_inline && s.runs_inline(request.message.function)) {
    s.serve(std::move(request));
    return true;
  }
  return s.post(std::move(request));
}

void CallTable::set_max_requests_per_peer(size_t limit) {
  state_->callers.set_limit(limit);
}

void CallTable::set_cancel_notifier(std::function<void(int dst, uint64_t id)> notifier) {
  MutexLock lock(state_->mu);
  state_->cancel_notifier = std::move(notifier);
}

void CallTable::cancel_request(int peer, uint64_t id) { state_->callers.cancel(peer, id); }

void CallTable::cancel_requests_from(int peer) {
  state_->callers.cancel_all_of(peer);
}

Message CallTable::error_reply(uint64_t id, std::exception_ptr error) const {
  return state_->error_reply(id, std::move(error));
}

CallTable::Idle CallTable::wait_idle(std::optional<Clock::time_point> deadline) {
  State& s = *state_;
  MutexLock lock(s.mu);
  auto done = [&]() SB_REQUIRES(s.mu) { return s.closed || s.idle(); };
  ++s.idle_waiters;  // before done() reads the counts: see wake_idle_waiters()
  if (!done() && spdlog::should_log(spdlog::level::debug)) {
    spdlog::debug("rpc agent \"{}\": waiting for {}", s.name, s.describe_load());
  }
  if (deadline) {
    s.idle_cv.wait_until(s.mu, *deadline, done);
  } else {
    s.idle_cv.wait(s.mu, done);
  }
  --s.idle_waiters;
  if (s.closed) return Idle::kClosed;
  if (s.idle()) return Idle::kIdle;
  spdlog::debug("rpc agent \"{}\": stopped waiting at the deadline for {}", s.name,
                s.describe_load());
  return Idle::kTimedOut;
}

void CallTable::drain(std::chrono::milliseconds timeout, const std::string& who) {
  const bool bounded = timeout.count() > 0;
  switch (wait_idle(bounded ? std::optional(Clock::now() + timeout) : std::nullopt)) {
    case Idle::kIdle:
      return;
    case Idle::kTimedOut: {
      const Load now = load();
      throw TimeoutError(fmt::format(
          "{}: timed out after {} ms with {} calls in flight and {} requests being handled",
          who, timeout.count(), now.calls_in_flight, now.handling));
    }
    case Idle::kClosed:
      throw Error(ErrorCode::kCancelled,
                  fmt::format("{}: rpc agent \"{}\" shut down", who, agent_name()));
  }
}

CallTable::Load CallTable::load() const {
  // Read first: a call counted in flight has been counted as added.
  const uint64_t added = state_->calls_added.load();
  return Load{state_->in_flight.load(), state_->handling.load(), added};
}

void CallTable::close() {
  State& s = *state_;
  std::vector<Failure> cancelled;
  std::vector<int> dropped_peers;  // of the requests that waited for start()
  // Handlers still running learn that their reply will not be sent.
  s.callers.cancel_everything();
  {
    MutexLock lock(s.mu);
    if (s.closed) return;
    s.closed = true;
    for (auto& [id, p] : s.pending) {
      p.stats->failure(FailureKind::kCancelled);
      cancelled.push_back({std::move(p.promise), shut_down_error(s.name, p.call)});
    }
    s.pending.clear();
    s.deadlines.clear();
    s.handling -= s.early.size();
    s.serving -= s.early.size();
    for (const Request& r : s.early) dropped_peers.push_back(r.from.id);
    s.early.clear();
    s.handler.reset();  // what it holds may hold the agent
    s.timer_cv.notify_all();
    s.idle_cv.notify_all();
  }
  for (int peer : dropped_peers) s.callers.release(peer);
  s.settle(std::move(cancelled));
  if (timer_.joinable()) {
    if (timer_.get_id() == std::this_thread::get_id()) {
      // The timer completed a future whose inline callback closed this
      // table: the thread holds the state and exits when it returns here.
      timer_.detach();
    } else {
      timer_.join();
    }
  }
}

bool CallTable::closed() const {
  MutexLock lock(state_->mu);
  return state_->closed;
}

const std::string& CallTable::agent_name() const { return state_->name; }

void CallTable::collect_metrics(RpcMetrics& out) const { state_->collect(out); }

QuietCalls::Idle QuietCalls::wait_idle(std::optional<Clock::time_point> deadline) {
  switch (table_.wait_idle(deadline)) {
    case CallTable::Idle::kIdle:
      return Idle::kIdle;
    case CallTable::Idle::kTimedOut:
      return Idle::kTimedOut;
    case CallTable::Idle::kClosed:
      break;
  }
  return Idle::kClosed;
}

QuietCalls::Activity QuietCalls::activity() const {
  const CallTable::Load load = table_.load();
  return Activity{load.calls_in_flight, load.handling, load.calls_started};
}

}  // namespace switchboard::rpc
