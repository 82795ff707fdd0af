#include "agents/process_group_agent.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pthread.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <shared_mutex>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <utility>

#include "agents/process_group_frame.h"
#include "collective/gloo_process_group.h"
#include "common/check.h"
#include "common/error.h"
#include "rpc/remote_error.h"
#include "store/prefix_store.h"
#include "store/store.h"

namespace switchboard::agents {
namespace {

namespace wire = process_group_wire;
using collective::Work;
using rpc::Future;
using rpc::Message;
using rpc::MessageType;
using rpc::Promise;
using rpc::WorkerInfo;
using Clock = std::chrono::steady_clock;
using namespace pg_frame;
using Timeout = std::chrono::milliseconds;

// Gloo sends or recvs one peer's sender or listener posts at a time.
constexpr size_t kMaxPosted = 8;

// ---------------------------------------------------------------- helpers

std::string what_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

// Makes every tensor of `m` able to travel: contiguous copies of strided
// ones. Returns what is wrong with the first tensor that cannot, if any.
std::optional<std::string> prepare_tensors(Message& m) {
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    Tensor& t = m.tensors[i];
    if (!t.defined()) return fmt::format("tensor {} is undefined", i);
    if (!t.device().is_cpu()) {
      return fmt::format(
          "tensor {} is {}: the PROCESS_GROUP agent moves CPU tensors only", i,
          t.describe());
    }
    if (!t.is_contiguous()) t = t.clone();
  }
  return std::nullopt;
}

void clone_tensors(Message& m) {
  for (Tensor& t : m.tensors) t = t.clone();
}

void name_thread(const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

// "0 and 2", "0, 1 and 2".
std::string and_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) out += i + 1 == ranks.size() ? " and " : ", ";
    out += std::to_string(ranks[i]);
  }
  return out;
}

Store::Timeout store_timeout(Clock::time_point deadline, bool bounded) {
  if (!bounded) return Store::kNoTimeout;
  const auto left =
      std::chrono::duration_cast<Timeout>(deadline - Clock::now()) + Timeout(1);
  return std::max(left, Timeout(1));
}

void check_arguments(const std::shared_ptr<Store>& store, const std::string& name,
                     int rank, int world_size, const ProcessGroupAgentOptions& options) {
  rpc::validate_worker_name(name);
  SB_REQUIRE(store != nullptr, "rpc worker \"{}\": the store is null", name);
  SB_REQUIRE(world_size >= 1, "rpc worker \"{}\": world_size must be at least 1, got {}",
             name, world_size);
  SB_REQUIRE(rank >= 0 && rank < world_size,
             "rpc worker \"{}\": rank {} is outside [0, {})", name, rank, world_size);
  SB_REQUIRE(options.num_worker_threads >= 1,
             "rpc worker \"{}\": num_worker_threads must be at least 1, got 0", name);
  SB_REQUIRE(options.rpc_timeout.count() >= 0,
             "rpc worker \"{}\": rpc_timeout must not be negative, got {} ms", name,
             options.rpc_timeout.count());
}

}  // namespace

// ------------------------------------------------------------------ Impl

struct ProcessGroupAgent::Impl : std::enable_shared_from_this<Impl> {
  // A call sent and not yet answered.
  struct Pending {
    Promise<Message> promise;
    int dst = -1;
    std::string function;
    Timeout timeout{0};
    Clock::time_point deadline;  // meaningful when timeout > 0
  };
  // One remote worker: the sender thread drains `outbox`, the listener
  // receives everything that worker sends here.
  struct Peer {
    std::deque<Message> outbox;  // GUARDED_BY(mu)
    std::condition_variable outbox_cv;
    bool failed = false;  // GUARDED_BY(mu): gone or sent bad bytes
    std::string failure;  // GUARDED_BY(mu)
    std::thread sender;
    std::thread listener;
  };

  Impl(std::shared_ptr<Store> store_in, std::string name_in, int rank_in, int world_in,
       std::shared_ptr<rpc::ThreadPool> pool_in)
      : store(std::move(store_in)),
        name(std::move(name_in)),
        rank(rank_in),
        world_size(world_in),
        pool(std::move(pool_in)) {}

  // Immutable after construction.
  const std::shared_ptr<Store> store;
  const std::string name;
  const int rank;
  const int world_size;
  const std::shared_ptr<rpc::ThreadPool> pool;
  std::vector<WorkerInfo> workers;  // by rank
  std::unordered_map<std::string, int> ranks_by_name;

  // Posting Gloo ops takes pg_mu shared; destroying the group takes it
  // exclusive. Waiting on a posted op's Work needs no lock.
  std::shared_mutex pg_mu;
  std::unique_ptr<collective::GlooProcessGroup> pg;  // GUARDED_BY(pg_mu)
  bool pg_closed = false;                            // GUARDED_BY(pg_mu)

  std::mutex mu;
  std::condition_variable drained_cv;             // pending or handling changed
  std::condition_variable timer_cv;               // deadlines changed or stopping
  bool started = false;                           // GUARDED_BY(mu)
  bool stopping = false;                          // GUARDED_BY(mu)
  std::shared_ptr<const RequestHandler> handler;  // GUARDED_BY(mu)
  uint64_t next_id = 1;                           // GUARDED_BY(mu)
  std::unordered_map<uint64_t, Pending> pending;  // GUARDED_BY(mu)
  std::set<std::pair<Clock::time_point, uint64_t>> deadlines;  // GUARDED_BY(mu)
  int handling = 0;  // GUARDED_BY(mu): requests accepted, not answered
  // Calls registered and whose future has not completed yet (>= the size
  // of `pending`: a call leaves `pending` just before its future completes).
  int calls_in_flight = 0;                   // GUARDED_BY(mu)
  uint64_t join_generation = 0;              // GUARDED_BY(mu)
  std::vector<std::unique_ptr<Peer>> peers;  // by rank; null for this rank
  std::thread timer;
  std::atomic<bool> shut_down{false};

  // Every agent thread holds a shared_ptr to the Impl, so the Impl dies
  // after all of them returned, or on the last of them: when shutdown() ran
  // on that thread (a callback run inline there because the pool had been
  // shut down first) it could not join it. Such a thread is past its last
  // use of the Impl, so it is let go here.
  ~Impl() {
    for (auto& peer : peers) {
      if (peer) release(peer->sender);
      if (peer) release(peer->listener);
    }
    release(timer);
  }

  static void release(std::thread& thread) {
    if (!thread.joinable()) return;
    if (thread.get_id() == std::this_thread::get_id()) {
      thread.detach();
    } else {
      thread.join();
    }
  }

  static void join_unless_self(std::thread& thread) {
    if (thread.joinable() && thread.get_id() != std::this_thread::get_id()) {
      thread.join();
    }
  }

  // ------------------------------------------------------------ setup

  void rendezvous(const ProcessGroupAgentOptions& options) {
    const bool bounded = options.rpc_timeout.count() > 0;
    const auto deadline = Clock::now() + options.rpc_timeout;
    exchange_names(options.rpc_timeout, store_timeout(deadline, bounded));
    peers.resize(world_size);
    for (int r = 0; r < world_size; ++r) {
      if (r != rank) peers[r] = std::make_unique<Peer>();
    }
    if (world_size == 1) return;
    collective::GlooOptions gloo;
    gloo.group_name = wire::kGroupName;
    gloo.timeout = Timeout(0);  // listeners wait for the next message forever
    gloo.hostname = options.hostname;
    gloo.iface = options.iface;
    PrefixStore prefixed(wire::kStorePrefix, store);
    pg = std::make_unique<collective::GlooProcessGroup>(prefixed, rank, world_size, gloo);
  }

  // "<prefix><rank>" for every rank.
  std::vector<std::string> rank_keys(const std::string& prefix) const {
    std::vector<std::string> keys;
    keys.reserve(world_size);
    for (int r = 0; r < world_size; ++r) keys.push_back(prefix + std::to_string(r));
    return keys;
  }

  void exchange_names(Timeout timeout, Store::Timeout wait_timeout) {
    const std::vector<std::string> keys = rank_keys(wire::kNamesKey);
    store->set(keys[rank], name);
    try {
      store->wait(keys, wait_timeout);
    } catch (const TimeoutError&) {
      std::vector<int> missing;
      for (int r = 0; r < world_size; ++r) {
        if (!store->check({keys[r]})) missing.push_back(r);
      }
      throw TimeoutError(fmt::format(
          "rpc worker \"{}\" (rank {} of {}): timed out after {} ms waiting for ranks "
          "[{}] to start",
          name, rank, world_size, timeout.count(), fmt::join(missing, ", ")));
    }
    const std::vector<Bytes> values = store->multi_get(keys);
    std::map<std::string, std::vector<int>> ranks_of;
    for (int r = 0; r < world_size; ++r) {
      workers.push_back(WorkerInfo{to_string(values[r]), r});
      ranks_of[workers.back().name].push_back(r);
    }
    std::vector<std::string> duplicates;
    for (const auto& [worker_name, ranks] : ranks_of) {
      if (ranks.size() > 1) {
        duplicates.push_back(
            fmt::format("\"{}\" is used by ranks {}", worker_name, and_list(ranks)));
      }
    }
    SB_REQUIRE(duplicates.empty(), "rpc worker names must be unique: {}",
               fmt::join(duplicates, "; "));
    for (const auto& w : workers) ranks_by_name.emplace(w.name, w.id);
  }

  void start(RequestHandler h) {
    SB_REQUIRE(static_cast<bool>(h), "rpc agent \"{}\": start() needs a handler", name);
    std::lock_guard lock(mu);
    SB_REQUIRE(!stopping, "rpc agent \"{}\": start() after shutdown()", name);
    SB_REQUIRE(!started, "rpc agent \"{}\": start() called twice", name);
    handler = std::make_shared<const RequestHandler>(std::move(h));
    started = true;
    auto self = shared_from_this();
    timer = std::thread([self] { self->run_timer(); });
    for (int r = 0; r < world_size; ++r) {
      if (r == rank) continue;
      peers[r]->sender = std::thread([self, r] { self->run_sender(r); });
      peers[r]->listener = std::thread([self, r] { self->run_listener(r); });
    }
  }

  // ------------------------------------------------------------ lookup

  int find(const WorkerInfo& to) const {
    if (to.id >= 0 && to.id < world_size && workers[to.id].name == to.name) return to.id;
    return -1;
  }

  WorkerInfo worker(const std::string& worker_name) const {
    auto it = ranks_by_name.find(worker_name);
    if (it == ranks_by_name.end()) {
      std::vector<std::string> names;
      for (const auto& w : workers) names.push_back(fmt::format("\"{}\"", w.name));
      throw NotFoundError(fmt::format("no rpc worker named \"{}\" (workers: {})",
                                      worker_name, fmt::join(names, ", ")));
    }
    return workers[it->second];
  }

  WorkerInfo worker(int id) const {
    if (id < 0 || id >= world_size) {
      throw NotFoundError(
          fmt::format("no rpc worker with id {} (ids 0 to {})", id, world_size - 1));
    }
    return workers[id];
  }

  // ------------------------------------------------------------ sending

  std::string call_prefix(int dst, const std::string& function) const {
    return fmt::format("rpc to \"{}\" function \"{}\"", workers[dst].name, function);
  }

  Future<Message> send(const WorkerInfo& to, Message request, Timeout timeout) {
    const int dst = find(to);
    if (auto error = check_request(dst, to, request, timeout)) {
      return Future<Message>::failed(error);
    }
    if (dst == rank) clone_tensors(request);
    Promise<Message> promise(pool);
    Future<Message> future = promise.get_future();
    std::optional<Message> to_self;  // a request to this worker, served here
    {
      std::lock_guard lock(mu);
      if (auto error = refusal_locked(dst, request.function)) {
        return Future<Message>::failed(error);
      }
      const uint64_t id = next_id++;
      request.id = id;
      add_pending_locked(id, Pending{promise, dst, request.function, timeout, {}});
      if (dst == rank) {
        ++handling;
        to_self = std::move(request);
      } else {
        peers[dst]->outbox.push_back(std::move(request));
        peers[dst]->outbox_cv.notify_one();
      }
    }
    if (to_self) post_request(rank, std::move(*to_self));
    return future;
  }

  // What is wrong with a call, or nullptr. Makes strided tensors contiguous.
  std::exception_ptr check_request(int dst, const WorkerInfo& to, Message& request,
                                   Timeout timeout) const {
    if (dst < 0) {
      return std::make_exception_ptr(NotFoundError(
          fmt::format("rpc to \"{}\" (id {}) function \"{}\": no such worker in this "
                      "group of {}",
                      to.name, to.id, request.function, world_size)));
    }
    const std::string prefix = call_prefix(dst, request.function);
    std::string problem;
    if (request.type != MessageType::kRequest) {
      problem = fmt::format("send() takes requests, got message type {}",
                            static_cast<int>(request.type));
    } else if (timeout.count() < 0) {
      problem = fmt::format("negative timeout {} ms", timeout.count());
    } else if (auto bad_tensor = prepare_tensors(request)) {
      problem = *bad_tensor;
    }
    if (problem.empty()) return nullptr;
    return std::make_exception_ptr(
        std::invalid_argument(fmt::format("{}: {}", prefix, problem)));
  }

  // Why a call to `dst` cannot be sent now, or nullptr.
  std::exception_ptr refusal_locked(int dst, const std::string& function) const {
    const std::string prefix = call_prefix(dst, function);
    if (!started) {
      return std::make_exception_ptr(
          std::invalid_argument(fmt::format("{}: send() before start()", prefix)));
    }
    if (stopping) return shut_down_error(prefix);
    if (dst != rank && peers[dst]->failed) {
      return connection_error(prefix, dst, peers[dst]->failure);
    }
    return nullptr;
  }

  void add_pending_locked(uint64_t id, Pending p) {
    if (p.timeout.count() > 0) {
      p.deadline = Clock::now() + p.timeout;
      const bool earliest = deadlines.empty() || p.deadline < deadlines.begin()->first;
      deadlines.emplace(p.deadline, id);
      if (earliest) timer_cv.notify_one();
    }
    pending.emplace(id, std::move(p));
    ++calls_in_flight;
  }

  // Removes and returns the pending call `id` (nullopt when there is none).
  std::optional<Pending> take_pending_locked(uint64_t id) {
    auto it = pending.find(id);
    if (it == pending.end()) return std::nullopt;
    Pending p = std::move(it->second);
    pending.erase(it);
    if (p.timeout.count() > 0) deadlines.erase({p.deadline, id});
    return p;
  }

  // Completes a call taken out of `pending` (outside the lock).
  void settle(const Pending& call, const std::exception_ptr& error,
              Message* response = nullptr) {
    if (error) {
      call.promise.set_error(error);
    } else {
      call.promise.set_value(std::move(*response));
    }
    std::lock_guard lock(mu);
    --calls_in_flight;
    drained_cv.notify_all();
  }

  std::exception_ptr shut_down_error(const std::string& prefix) const {
    return std::make_exception_ptr(
        Error(ErrorCode::kCancelled,
              fmt::format("{}: rpc agent \"{}\" shut down", prefix, name)));
  }

  std::exception_ptr connection_error(const std::string& prefix, int peer,
                                      const std::string& failure) const {
    return std::make_exception_ptr(
        ConnectionError(fmt::format("{}: connection to worker \"{}\" lost: {}", prefix,
                                    workers[peer].name, failure)));
  }

  // Queues a response for `peer`; false when it cannot go out any more.
  bool enqueue(int peer, Message m) {
    std::lock_guard lock(mu);
    Peer& p = *peers[peer];
    if (stopping || p.failed) return false;
    p.outbox.push_back(std::move(m));
    p.outbox_cv.notify_one();
    return true;
  }

  void run_sender(int peer) {
    name_thread(fmt::format("sb-pg-send-{}", peer));
    Peer& p = *peers[peer];
    for (;;) {
      Message m;
      {
        std::unique_lock lock(mu);
        p.outbox_cv.wait(lock, [&] { return stopping || p.failed || !p.outbox.empty(); });
        if (stopping || p.failed) return;
        m = std::move(p.outbox.front());
        p.outbox.pop_front();
      }
      try {
        transmit(peer, m);
      } catch (...) {
        if (!is_stopping()) peer_failed(peer, what_of(std::current_exception()));
        return;
      }
    }
  }

  // Sends every part of `m`; returns when all went out.
  void transmit(int peer, const Message& m) {
    auto [header, body] = encode_frame(m);
    std::vector<Tensor> data;
    if (body.defined()) data.push_back(body);
    data.insert(data.end(), m.tensors.begin(), m.tensors.end());
    exchange(peer, /*sending=*/true, {header}, wire::kHeaderTag);
    exchange(peer, /*sending=*/true, data, wire::kDataTag);
  }

  // Sends (or receives into) every non-empty tensor of `parts`, in order,
  // on `tag`, and waits for all. GlooProcessGroup gives every posted op a
  // thread of its own, so at most kMaxPosted are posted at a time.
  void exchange(int peer, bool sending, const std::vector<Tensor>& parts, int tag) {
    std::deque<Work> posted;
    for (const Tensor& part : parts) {
      if (part.nbytes() == 0) continue;
      if (posted.size() == kMaxPosted) {
        posted.front().wait(Work::kNoTimeout);
        posted.pop_front();
      }
      std::shared_lock lock(pg_mu);
      if (pg_closed) {
        throw Error(ErrorCode::kCancelled,
                    fmt::format("rpc agent \"{}\" shut down", name));
      }
      Tensor t = part;
      posted.push_back(sending ? pg->send(t, peer, tag) : pg->recv(t, peer, tag));
    }
    for (const Work& work : posted) work.wait(Work::kNoTimeout);
  }

  // ------------------------------------------------------------ receiving

  void run_listener(int peer) {
    name_thread(fmt::format("sb-pg-recv-{}", peer));
    for (;;) {
      Message m;
      try {
        m = receive(peer);
      } catch (const ProtocolError& e) {
        peer_failed(peer, fmt::format("protocol error: {}", e.what()));
        return;
      } catch (...) {
        if (!is_stopping()) peer_failed(peer, what_of(std::current_exception()));
        return;
      }
      if (m.type == MessageType::kRequest) {
        accept_request(peer, std::move(m));
      } else {
        complete_call(peer, std::move(m));
      }
    }
  }

  // Receives one whole message from `peer`.
  Message receive(int peer) {
    Tensor header =
        Tensor::empty({static_cast<int64_t>(wire::kHeaderSize)}, DType::kUInt8);
    exchange(peer, /*sending=*/false, {header}, wire::kHeaderTag);
    const Header h = decode_header(header);
    Tensor body;
    if (h.body_length() > 0) {
      body = allocate({static_cast<int64_t>(h.body_length())}, DType::kUInt8);
      exchange(peer, /*sending=*/false, {body}, wire::kDataTag);
    }
    Message m;
    m.type = h.type;
    m.id = h.id;
    decode_body(h, body, m);
    exchange(peer, /*sending=*/false, m.tensors, wire::kDataTag);
    return m;
  }

  bool is_stopping() {
    std::lock_guard lock(mu);
    return stopping;
  }

  // A response arrived from `from` (or was produced here for a self-call).
  void complete_call(int from, Message response) {
    std::optional<Pending> p;
    {
      std::lock_guard lock(mu);
      auto it = pending.find(response.id);
      if (it != pending.end() && it->second.dst == from)
        p = take_pending_locked(response.id);
    }
    if (!p) {
      spdlog::debug(
          "rpc agent \"{}\": dropping a response from \"{}\" to call {}, which "
          "is no longer pending (timed out or cancelled)",
          name, workers[from].name, response.id);
      return;
    }
    settle(*p, nullptr, &response);
  }

  // The connection to `peer` is unusable: fail every call to it.
  void peer_failed(int peer, const std::string& reason) {
    std::vector<Pending> lost;
    {
      std::lock_guard lock(mu);
      Peer& p = *peers[peer];
      if (p.failed || stopping) return;
      p.failed = true;
      p.failure = reason;
      p.outbox.clear();
      p.outbox_cv.notify_all();
      std::vector<uint64_t> ids;
      for (const auto& [id, call] : pending) {
        if (call.dst == peer) ids.push_back(id);
      }
      for (uint64_t id : ids) lost.push_back(*take_pending_locked(id));
    }
    if (lost.empty()) {
      spdlog::info("rpc agent \"{}\": worker \"{}\" went away: {}", name,
                   workers[peer].name, reason);
    } else {
      spdlog::warn("rpc agent \"{}\": worker \"{}\" went away with {} calls pending: {}",
                   name, workers[peer].name, lost.size(), reason);
    }
    for (Pending& call : lost) {
      settle(call, connection_error(call_prefix(peer, call.function), peer, reason));
    }
  }

  // ------------------------------------------------------------ serving

  // A request arrived from `from`: hand it to the pool.
  void accept_request(int from, Message request) {
    {
      std::lock_guard lock(mu);
      if (stopping) return;
      ++handling;
    }
    post_request(from, std::move(request));
  }

  // Runs serve() on the pool; `handling` already counts the request.
  void post_request(int from, Message request) {
    const uint64_t id = request.id;
    try {
      pool->post(
          [self = shared_from_this(), from, request = std::move(request)]() mutable {
            self->serve(from, std::move(request));
          });
    } catch (...) {
      // The pool is shut down: the request is dropped.
      if (from == rank) fail_self_call(id, std::current_exception());
      finish_handling();
    }
  }

  void fail_self_call(uint64_t id, const std::exception_ptr& error) {
    std::optional<Pending> p;
    {
      std::lock_guard lock(mu);
      p = take_pending_locked(id);
    }
    if (p) settle(*p, error);
  }

  void finish_handling() {
    std::lock_guard lock(mu);
    --handling;
    drained_cv.notify_all();
  }

  // On a pool thread: runs the handler; the answer goes out when its
  // future completes.
  void serve(int from, Message request) {
    std::shared_ptr<const RequestHandler> h;
    {
      std::lock_guard lock(mu);
      if (!stopping) h = handler;
    }
    if (!h) {
      finish_handling();
      return;
    }
    const uint64_t id = request.id;
    Future<Message> result;
    try {
      result = (*h)(std::move(request), workers[from]);
    } catch (...) {
      result = Future<Message>::failed(std::current_exception());
    }
    if (!result.valid()) {
      result = Future<Message>::failed(std::make_exception_ptr(
          Error(ErrorCode::kInternal, "the request handler returned an invalid future")));
    }
    std::weak_ptr<Impl> weak = weak_from_this();
    result.add_callback([weak, from, id](const Future<Message>& done) {
      if (auto self = weak.lock()) self->respond(from, id, done);
    });
  }

  Message error_response(const std::exception_ptr& error) const {
    Message m;
    rpc::encode_remote_error(m, name, error);
    return m;
  }

  // The response to send for a handler's finished future.
  Message response_of(const Future<Message>& done) const {
    if (done.has_error()) return error_response(done.error());
    Message m = done.value();
    if (m.type != MessageType::kResponse && m.type != MessageType::kError) {
      return error_response(std::make_exception_ptr(
          Error(ErrorCode::kInternal,
                fmt::format("the request handler answered with message type {}",
                            static_cast<int>(m.type)))));
    }
    if (auto problem = prepare_tensors(m)) {
      return error_response(std::make_exception_ptr(
          std::invalid_argument(fmt::format("the response's {}", *problem))));
    }
    return m;
  }

  void respond(int to, uint64_t id, const Future<Message>& done) {
    Message response;
    try {
      response = response_of(done);
    } catch (...) {
      response = error_response(std::current_exception());
    }
    response.id = id;
    if (to == rank) {
      clone_tensors(response);
      complete_call(rank, std::move(response));
    } else if (!enqueue(to, std::move(response))) {
      spdlog::debug("rpc agent \"{}\": dropping the response to call {} of \"{}\"", name,
                    id, workers[to].name);
    }
    finish_handling();
  }

  // ------------------------------------------------------------ timeouts

  void run_timer() {
    name_thread("sb-pg-timer");
    std::unique_lock lock(mu);
    while (!stopping) {
      if (deadlines.empty()) {
        timer_cv.wait(lock);
        continue;
      }
      const auto [deadline, id] = *deadlines.begin();
      if (Clock::now() < deadline) {
        timer_cv.wait_until(lock, deadline);
        continue;
      }
      std::optional<Pending> p = take_pending_locked(id);
      if (!p) {
        deadlines.erase(deadlines.begin());  // not expected: kept in step
        continue;
      }
      lock.unlock();
      settle(*p, std::make_exception_ptr(TimeoutError(
                     fmt::format("{}: timed out after {} ms",
                                 call_prefix(p->dst, p->function), p->timeout.count()))));
      lock.lock();
    }
  }

  // ------------------------------------------------------------ join

  void join(Timeout timeout) {
    const bool bounded = timeout.count() > 0;
    const auto deadline = Clock::now() + timeout;
    const std::string who = fmt::format("join on rpc worker \"{}\"", name);
    uint64_t generation = 0;
    {
      std::unique_lock lock(mu);
      auto idle = [&] { return stopping || (calls_in_flight == 0 && handling == 0); };
      if (bounded) {
        if (!drained_cv.wait_until(lock, deadline, idle)) {
          throw TimeoutError(fmt::format(
              "{}: timed out after {} ms with {} calls in flight and {} requests being "
              "handled",
              who, timeout.count(), calls_in_flight, handling));
        }
      } else {
        drained_cv.wait(lock, idle);
      }
      if (stopping) {
        throw Error(ErrorCode::kCancelled,
                    fmt::format("{}: rpc agent \"{}\" shut down", who, name));
      }
      generation = join_generation++;
    }
    const std::string prefix = fmt::format("{}{}/", wire::kJoinKey, generation);
    const std::vector<std::string> keys = rank_keys(prefix);
    store->set(keys[rank], "1");
    try {
      store->wait(keys, store_timeout(deadline, bounded));
    } catch (const TimeoutError&) {
      std::vector<std::string> missing;
      for (int r = 0; r < world_size; ++r) {
        if (!store->check({keys[r]}))
          missing.push_back(fmt::format("\"{}\"", workers[r].name));
      }
      throw TimeoutError(
          fmt::format("{}: timed out after {} ms waiting for workers [{}] to join", who,
                      timeout.count(), fmt::join(missing, ", ")));
    }
  }

  // ------------------------------------------------------------ shutdown

  void shutdown() {
    if (shut_down.exchange(true)) return;
    std::vector<Pending> cancelled;
    {
      std::lock_guard lock(mu);
      stopping = true;
      for (auto& [id, call] : pending) cancelled.push_back(std::move(call));
      pending.clear();
      deadlines.clear();
      for (auto& peer : peers) {
        if (!peer) continue;
        peer->outbox.clear();
        peer->outbox_cv.notify_all();
      }
      timer_cv.notify_all();
      drained_cv.notify_all();
    }
    for (Pending& call : cancelled) {
      settle(call, shut_down_error(call_prefix(call.dst, call.function)));
    }
    {
      // Aborts every posted Gloo send and recv: the threads waiting on
      // them see Error(kCancelled) and return.
      std::unique_lock lock(pg_mu);
      pg_closed = true;
      pg.reset();
    }
    for (auto& peer : peers) {
      if (!peer) continue;
      join_unless_self(peer->sender);
      join_unless_self(peer->listener);
    }
    join_unless_self(timer);
    pool->shutdown();
    std::lock_guard lock(mu);
    handler.reset();
  }
};

// ------------------------------------------------------------ the shell

ProcessGroupAgent::ProcessGroupAgent(std::shared_ptr<Store> store, std::string name,
                                     int rank, int world_size,
                                     const ProcessGroupAgentOptions& options)
    : RpcAgent(WorkerInfo{name, rank},
               (check_arguments(store, name, rank, world_size, options),
                options.num_worker_threads)) {
  impl_ =
      std::make_shared<Impl>(std::move(store), std::move(name), rank, world_size, pool());
  impl_->rendezvous(options);
}

ProcessGroupAgent::~ProcessGroupAgent() {
  try {
    shutdown();
  } catch (const std::exception& e) {
    spdlog::error("rpc agent \"{}\": shutdown in the destructor failed: {}", self().name,
                  e.what());
  }
}

void ProcessGroupAgent::start(RequestHandler handler) {
  impl_->start(std::move(handler));
}

Future<Message> ProcessGroupAgent::send(const WorkerInfo& to, Message request,
                                        Timeout timeout) {
  return impl_->send(to, std::move(request), timeout);
}

WorkerInfo ProcessGroupAgent::worker(const std::string& name) const {
  return impl_->worker(name);
}

WorkerInfo ProcessGroupAgent::worker(int id) const { return impl_->worker(id); }

std::vector<WorkerInfo> ProcessGroupAgent::workers() const { return impl_->workers; }

void ProcessGroupAgent::join(Timeout timeout) { impl_->join(timeout); }

void ProcessGroupAgent::shutdown() { impl_->shutdown(); }

}  // namespace switchboard::agents
