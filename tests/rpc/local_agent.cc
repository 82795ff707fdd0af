#include "tests/rpc/local_agent.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "collective/tensor.h"
#include "common/check.h"
#include "common/error.h"
#include "rpc/message.h"
#include "rpc/remote_error.h"
#include "store/store.h"

namespace switchboard::testing {
namespace {

using rpc::Future;
using rpc::Message;
using rpc::MessageType;
using rpc::Promise;
using rpc::WorkerInfo;
using Clock = std::chrono::steady_clock;
using Timeout = std::chrono::milliseconds;

// Store keys (under whatever prefix the store has).
constexpr const char* kFabricKey = "local/fabric";
constexpr const char* kNamesKey = "local/names/";

constexpr int64_t kMaxWorkerThreads = 4096;

// ---------------------------------------------------------------- helpers

// Why the first tensor of `m` cannot travel, if one cannot.
std::optional<std::string> tensor_problem(const Message& m) {
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const Tensor& t = m.tensors[i];
    if (!t.defined()) return fmt::format("tensor {} is undefined", i);
    if (!t.device().is_cpu()) {
      return fmt::format("tensor {} is {}: the LOCAL agent moves CPU tensors only", i,
                         t.describe());
    }
  }
  return std::nullopt;
}

// What a transport does to tensors: the receiver gets its own contiguous
// bytes. Only for messages tensor_problem() accepted.
void copy_tensors(Message& m) {
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

struct Impl;

// ---------------------------------------------------------------- Fabric

// The meeting point of one group's agents: which agent serves each rank,
// and the join() barrier. Shared by the agents of the group (and weakly by
// the process-global table below). Holds agents weakly: an agent that goes
// away without leave() counts as gone.
//
// Thread safety: every method takes `mu_` and calls no agent while holding
// it (the agents call the fabric, never the other way round).
class Fabric {
 public:
  enum class BarrierResult { kPassed, kTimedOut, kPeerLeft, kSelfLeft };

  explicit Fabric(std::string id) : id_(std::move(id)) {}
  const std::string& id() const { return id_; }

  // Makes `agent` the worker of `rank` in a group of `world_size`.
  // std::invalid_argument when the rank is taken or the world sizes differ.
  void enter(int rank, int world_size, const std::string& name,
             const std::shared_ptr<Impl>& agent) {
    std::lock_guard lock(mu_);
    if (world_size_ < 0) {
      world_size_ = world_size;
      slots_.resize(world_size);
      names_.resize(world_size);
      entered_.assign(world_size, false);
      left_.assign(world_size, false);
    }
    SB_REQUIRE(world_size == world_size_,
               "LOCAL backend: worker \"{}\" (rank {}) has world_size {}, but the group "
               "it joins has {}",
               name, rank, world_size, world_size_);
    SB_REQUIRE(!entered_[rank],
               "LOCAL backend: worker \"{}\" and worker \"{}\" both claim rank {}", name,
               names_[rank], rank);
    slots_[rank] = agent;
    names_[rank] = name;
    entered_[rank] = true;
    ++num_entered_;
    cv_.notify_all();
  }

  // Blocks until every rank entered (or the deadline passed: then returns
  // the ranks still missing).
  std::vector<int> wait_entered(Clock::time_point deadline, bool bounded) {
    std::unique_lock lock(mu_);
    auto all = [&] { return num_entered_ == world_size_; };
    if (bounded) {
      cv_.wait_until(lock, deadline, all);
    } else {
      cv_.wait(lock, all);
    }
    std::vector<int> missing;
    for (int r = 0; r < world_size_; ++r) {
      if (!entered_[r]) missing.push_back(r);
    }
    return missing;
  }

  // The agent of `rank`, or null when it left (or never came).
  std::shared_ptr<Impl> peer(int rank) {
    std::lock_guard lock(mu_);
    if (rank < 0 || rank >= world_size_ || left_[rank]) return nullptr;
    return slots_[rank].lock();
  }

  // Takes `rank` out of the group; returns the agents still in it (to be
  // told, outside the lock). Wakes barrier waiters.
  std::vector<std::shared_ptr<Impl>> leave(int rank) {
    std::vector<std::shared_ptr<Impl>> others;
    std::lock_guard lock(mu_);
    if (rank < 0 || rank >= world_size_ || left_[rank]) return others;
    left_[rank] = true;
    slots_[rank].reset();
    for (int r = 0; r < world_size_; ++r) {
      if (r == rank || left_[r]) continue;
      if (auto agent = slots_[r].lock()) others.push_back(std::move(agent));
    }
    cv_.notify_all();
    return others;
  }

  // join()'s second phase: `rank` arrives at barrier `generation` and waits
  // for every rank to arrive there. On failure `missing` gets the ranks
  // that did not arrive (kTimedOut) or that left without arriving
  // (kPeerLeft). kSelfLeft: `rank` left (shut down) while waiting.
  BarrierResult barrier(int rank, uint64_t generation, Clock::time_point deadline,
                        bool bounded, std::vector<int>& missing) {
    std::unique_lock lock(mu_);
    // std::map: the reference stays valid until this entry is erased, which
    // happens only after every rank arrived and returned.
    Arrivals& arrivals = barriers_[generation];
    arrivals.ranks.insert(rank);
    cv_.notify_all();
    auto finish = [&](BarrierResult result) {
      if (++arrivals.returned == world_size_) barriers_.erase(generation);
      return result;
    };
    for (;;) {
      if (static_cast<int>(arrivals.ranks.size()) == world_size_) {
        return finish(BarrierResult::kPassed);
      }
      if (left_[rank]) return finish(BarrierResult::kSelfLeft);
      missing.clear();
      for (int r = 0; r < world_size_; ++r) {
        if (arrivals.ranks.count(r) == 0 && left_[r]) missing.push_back(r);
      }
      if (!missing.empty()) return finish(BarrierResult::kPeerLeft);
      if (!bounded) {
        cv_.wait(lock);
      } else if (cv_.wait_until(lock, deadline) == std::cv_status::timeout &&
                 static_cast<int>(arrivals.ranks.size()) != world_size_) {
        for (int r = 0; r < world_size_; ++r) {
          if (arrivals.ranks.count(r) == 0) missing.push_back(r);
        }
        return finish(BarrierResult::kTimedOut);
      }
    }
  }

 private:
  struct Arrivals {
    std::set<int> ranks;  // arrived
    int returned = 0;     // waiters that returned (any result)
  };

  const std::string id_;
  std::mutex mu_;
  std::condition_variable cv_;              // entries, departures, arrivals
  int world_size_ = -1;                     // GUARDED_BY(mu_): set by the first enter
  std::vector<std::weak_ptr<Impl>> slots_;  // GUARDED_BY(mu_): by rank
  std::vector<std::string> names_;          // GUARDED_BY(mu_)
  std::vector<bool> entered_;               // GUARDED_BY(mu_)
  std::vector<bool> left_;                  // GUARDED_BY(mu_)
  int num_entered_ = 0;                     // GUARDED_BY(mu_)
  std::map<uint64_t, Arrivals> barriers_;   // GUARDED_BY(mu_): by generation
};

// The process-global table of fabrics by id. Holds them weakly: a fabric
// lives as long as one of its agents (or a rendezvous in progress) does.
// Never destroyed, so agents destroyed during static destruction are safe.
struct FabricTable {
  std::mutex mu;
  std::map<std::string, std::weak_ptr<Fabric>> fabrics;  // GUARDED_BY(mu)

  static FabricTable& instance() {
    static auto* table = new FabricTable;
    return *table;
  }

  // A new fabric under a fresh id "<pid>:<counter>:<steady clock ns>":
  // unique in this process, and unlikely to match a stale one of another.
  std::shared_ptr<Fabric> create() {
    static std::atomic<uint64_t> counter{0};
    const std::string id = fmt::format("{}:{}:{}", ::getpid(), counter.fetch_add(1),
                                       Clock::now().time_since_epoch().count());
    auto fabric = std::make_shared<Fabric>(id);
    std::lock_guard lock(mu);
    for (auto it = fabrics.begin(); it != fabrics.end();) {
      it = it->second.expired() ? fabrics.erase(it) : std::next(it);
    }
    fabrics.emplace(id, fabric);
    return fabric;
  }

  void forget(const std::string& id) {
    std::lock_guard lock(mu);
    fabrics.erase(id);
  }

  std::shared_ptr<Fabric> find(const std::string& id) {
    std::lock_guard lock(mu);
    auto it = fabrics.find(id);
    return it == fabrics.end() ? nullptr : it->second.lock();
  }
};

// The pid a fabric id starts with (0 when it does not parse).
long pid_of(const std::string& id) {
  long pid = 0;
  auto [ptr, ec] = std::from_chars(id.data(), id.data() + id.size(), pid);
  return ec == std::errc() && ptr != id.data() && *ptr == ':' ? pid : 0;
}

// ------------------------------------------------------------------ Impl

// Everything of one agent; the LocalAgent shell owns it, the pool's tasks
// and the timer thread share it, the fabric refers to it weakly.
struct Impl : std::enable_shared_from_this<Impl> {
  using RequestHandler = rpc::RpcAgent::RequestHandler;

  // A call sent and not yet answered.
  struct Pending {
    Promise<Message> promise;
    int dst = -1;
    std::string function;
    Timeout timeout{0};
    Clock::time_point deadline;  // meaningful when timeout > 0
  };
  // A request that arrived before start().
  struct Early {
    int from = -1;
    Message request;
  };

  Impl(std::string name_in, int rank_in, int world_in,
       std::shared_ptr<rpc::ThreadPool> pool_in)
      : name(std::move(name_in)),
        rank(rank_in),
        world_size(world_in),
        pool(std::move(pool_in)) {}

  // The timer holds a shared_ptr to the Impl, so the Impl may die on it
  // (see PROCESS_GROUP's Impl): such a thread is past its last use.
  ~Impl() {
    if (!timer.joinable()) return;
    if (timer.get_id() == std::this_thread::get_id()) {
      timer.detach();
    } else {
      timer.join();
    }
  }

  // Immutable after construction.
  const std::string name;
  const int rank;
  const int world_size;
  const std::shared_ptr<rpc::ThreadPool> pool;
  // Set by rendezvous(), immutable afterwards. `workers` and
  // `ranks_by_name` are set before this agent enters the fabric (other
  // agents read them after finding it there); `fabric` once it entered
  // (read by this agent's own calls, all of which come after construction).
  std::shared_ptr<Fabric> fabric;
  std::vector<WorkerInfo> workers;  // by rank
  std::unordered_map<std::string, int> ranks_by_name;

  std::mutex mu;
  std::condition_variable drained_cv;             // calls or handling changed
  std::condition_variable timer_cv;               // deadlines changed or stopping
  bool started = false;                           // GUARDED_BY(mu)
  bool stopping = false;                          // GUARDED_BY(mu)
  std::shared_ptr<const RequestHandler> handler;  // GUARDED_BY(mu)
  std::deque<Early> early;                        // GUARDED_BY(mu)
  uint64_t next_id = 1;                           // GUARDED_BY(mu)
  std::unordered_map<uint64_t, Pending> pending;  // GUARDED_BY(mu)
  std::set<std::pair<Clock::time_point, uint64_t>> deadlines;  // GUARDED_BY(mu)
  int handling = 0;  // GUARDED_BY(mu): requests accepted, not answered
  // Calls registered and whose future has not completed yet (>= the size
  // of `pending`: a call leaves `pending` just before its future completes).
  int calls_in_flight = 0;       // GUARDED_BY(mu)
  uint64_t join_generation = 0;  // GUARDED_BY(mu)
  std::thread timer;
  std::atomic<bool> shut_down{false};

  // ------------------------------------------------------------ setup

  std::vector<std::string> rank_keys(const std::string& prefix) const {
    std::vector<std::string> keys;
    keys.reserve(world_size);
    for (int r = 0; r < world_size; ++r) keys.push_back(prefix + std::to_string(r));
    return keys;
  }

  // Blocks until every rank of the group is in the fabric; see the header.
  void rendezvous(const std::shared_ptr<Store>& store, Timeout timeout) {
    const bool bounded = timeout.count() > 0;
    const auto deadline = Clock::now() + timeout;
    std::shared_ptr<Fabric> found = find_fabric(*store);
    exchange_names(*store, timeout, store_timeout(deadline, bounded));
    // Only once in: shutdown() leaves the fabric it finds here, and an agent
    // refused by enter() (its rank taken) must not take out the rank's owner.
    found->enter(rank, world_size, name, shared_from_this());
    fabric = std::move(found);
    const std::vector<int> missing = fabric->wait_entered(deadline, bounded);
    if (!missing.empty()) {
      throw TimeoutError(fmt::format(
          "rpc worker \"{}\" (rank {} of {}): timed out after {} ms waiting for ranks "
          "[{}] to enter the LOCAL fabric",
          name, rank, world_size, timeout.count(), fmt::join(missing, ", ")));
    }
  }

  // The first worker to get here publishes a new fabric; the others find it.
  std::shared_ptr<Fabric> find_fabric(Store& store) {
    FabricTable& table = FabricTable::instance();
    std::shared_ptr<Fabric> mine = table.create();
    const std::string id =
        to_string(store.compare_set(kFabricKey, Bytes{}, to_bytes(mine->id())));
    if (id == mine->id()) return mine;
    table.forget(mine->id());
    const long pid = pid_of(id);
    SB_REQUIRE(
        pid == static_cast<long>(::getpid()),
        "LOCAL backend: worker \"{}\": the group's fabric \"{}\" (store key \"{}\") "
        "belongs to process {}, this is process {}; LOCAL connects workers that "
        "are threads of one process",
        name, id, kFabricKey, pid, ::getpid());
    std::shared_ptr<Fabric> fabric = table.find(id);
    if (!fabric) {
      throw Error(
          ErrorCode::kFailedPrecondition,
          fmt::format("LOCAL backend: worker \"{}\": the store names fabric \"{}\" "
                      "(key \"{}\"), which no longer exists: its workers are "
                      "gone. Use a fresh store (or PrefixStore) for every group",
                      name, id, kFabricKey));
    }
    return fabric;
  }

  void exchange_names(Store& store, Timeout timeout, Store::Timeout wait_timeout) {
    const std::vector<std::string> keys = rank_keys(kNamesKey);
    store.set(keys[rank], name);
    try {
      store.wait(keys, wait_timeout);
    } catch (const TimeoutError&) {
      std::vector<int> missing;
      for (int r = 0; r < world_size; ++r) {
        if (!store.check({keys[r]})) missing.push_back(r);
      }
      throw TimeoutError(fmt::format(
          "rpc worker \"{}\" (rank {} of {}): timed out after {} ms waiting for ranks "
          "[{}] to start",
          name, rank, world_size, timeout.count(), fmt::join(missing, ", ")));
    }
    const std::vector<Bytes> values = store.multi_get(keys);
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
    std::deque<Early> arrived;
    {
      std::lock_guard lock(mu);
      SB_REQUIRE(!stopping, "rpc agent \"{}\": start() after shutdown()", name);
      SB_REQUIRE(!started, "rpc agent \"{}\": start() called twice", name);
      handler = std::make_shared<const RequestHandler>(std::move(h));
      started = true;
      arrived.swap(early);
      auto self = shared_from_this();
      timer = std::thread([self] { self->run_timer(); });
    }
    for (Early& e : arrived) post_request(e.from, std::move(e.request));
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

  std::exception_ptr shut_down_error(const std::string& prefix) const {
    return std::make_exception_ptr(
        Error(ErrorCode::kCancelled,
              fmt::format("{}: rpc agent \"{}\" shut down", prefix, name)));
  }

  std::exception_ptr connection_error(int dst, const std::string& function) const {
    return std::make_exception_ptr(
        ConnectionError(fmt::format("{}: connection to worker \"{}\" lost: it shut down",
                                    call_prefix(dst, function), workers[dst].name)));
  }

  // What is wrong with a call, or nullptr.
  std::exception_ptr check_request(int dst, const WorkerInfo& to, const Message& request,
                                   Timeout timeout) const {
    if (dst < 0) {
      return std::make_exception_ptr(NotFoundError(
          fmt::format("rpc to \"{}\" (id {}) function \"{}\": no such worker in this "
                      "group of {}",
                      to.name, to.id, request.function, world_size)));
    }
    std::string problem;
    if (request.type != MessageType::kRequest) {
      problem = fmt::format("send() takes requests, got message type {}",
                            static_cast<int>(request.type));
    } else if (timeout.count() < 0) {
      problem = fmt::format("negative timeout {} ms", timeout.count());
    } else if (auto bad_tensor = tensor_problem(request)) {
      problem = *bad_tensor;
    }
    if (problem.empty()) return nullptr;
    return std::make_exception_ptr(std::invalid_argument(
        fmt::format("{}: {}", call_prefix(dst, request.function), problem)));
  }

  // Why this agent cannot send now, or nullptr.
  std::exception_ptr refusal_locked(int dst, const std::string& function) const {
    const std::string prefix = call_prefix(dst, function);
    if (!started) {
      return std::make_exception_ptr(
          std::invalid_argument(fmt::format("{}: send() before start()", prefix)));
    }
    if (stopping) return shut_down_error(prefix);
    return nullptr;
  }

  Future<Message> send(const WorkerInfo& to, Message request, Timeout timeout) {
    Promise<Message> promise(pool);
    Future<Message> future = promise.get_future();
    std::optional<uint64_t> id;
    try {
      const int dst = find(to);
      if (auto error = check_request(dst, to, request, timeout)) {
        promise.set_error(error);
        return future;
      }
      copy_tensors(request);
      std::exception_ptr refused;
      {
        std::lock_guard lock(mu);
        refused = refusal_locked(dst, request.function);
      }
      if (refused) {
        promise.set_error(refused);
        return future;
      }
      std::shared_ptr<Impl> target = fabric->peer(dst);
      if (!target) {
        promise.set_error(connection_error(dst, request.function));
        return future;
      }
      {
        std::lock_guard lock(mu);
        if (auto error = refusal_locked(dst, request.function)) {
          refused = error;
        } else {
          id = next_id++;
          request.id = *id;
          add_pending_locked(*id, Pending{promise, dst, request.function, timeout, {}});
        }
      }
      if (refused) {
        promise.set_error(refused);
        return future;
      }
      const std::string function = request.function;
      if (!target->accept_request(rank, std::move(request))) {
        fail_pending(*id, connection_error(dst, function));
      }
    } catch (...) {
      // Only allocation failures get here; the call is failed either way.
      if (id) {
        fail_pending(*id, std::current_exception());
      } else {
        promise.set_error(std::current_exception());
      }
    }
    return future;
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

  void fail_pending(uint64_t id, const std::exception_ptr& error) {
    std::optional<Pending> p;
    {
      std::lock_guard lock(mu);
      p = take_pending_locked(id);
    }
    if (p) settle(*p, error);
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

  // The answer to call `response.id` came from `from` (any thread).
  void complete_call(int from, Message response) {
    std::optional<Pending> p;
    {
      std::lock_guard lock(mu);
      auto it = pending.find(response.id);
      if (it != pending.end() && it->second.dst == from) {
        p = take_pending_locked(response.id);
      }
    }
    if (!p) {
      spdlog::debug(
          "rpc agent \"{}\": dropping a response from \"{}\" to call {}, which is no "
          "longer pending (timed out or cancelled)",
          name, workers[from].name, response.id);
      return;
    }
    settle(*p, nullptr, &response);
  }

  // Worker `peer` left the fabric (shut down): fail every call to it.
  void peer_left(int peer) {
    std::vector<Pending> lost;
    {
      std::lock_guard lock(mu);
      if (stopping) return;
      std::vector<uint64_t> ids;
      for (const auto& [id, call] : pending) {
        if (call.dst == peer) ids.push_back(id);
      }
      for (uint64_t id : ids) lost.push_back(*take_pending_locked(id));
    }
    if (!lost.empty()) {
      spdlog::warn("rpc agent \"{}\": worker \"{}\" shut down with {} calls pending",
                   name, workers[peer].name, lost.size());
    }
    for (Pending& call : lost) settle(call, connection_error(peer, call.function));
  }

  // ------------------------------------------------------------ serving

  // A request from `from` (any thread). False when this agent no longer
  // takes requests; requests before start() wait for it.
  bool accept_request(int from, Message request) {
    {
      std::lock_guard lock(mu);
      if (stopping) return false;
      ++handling;
      if (!started) {
        early.push_back(Early{from, std::move(request)});
        return true;
      }
    }
    post_request(from, std::move(request));
    return true;
  }

  // Runs serve() on the pool; `handling` already counts the request.
  void post_request(int from, Message request) {
    try {
      pool->post(
          [self = shared_from_this(), from, request = std::move(request)]() mutable {
            self->serve(from, std::move(request));
          });
    } catch (...) {
      // The pool is shut down, so this agent is stopping: the request is
      // dropped and its caller was (or is being) failed by shutdown().
      finish_handling();
    }
  }

  void finish_handling() {
    std::lock_guard lock(mu);
    --handling;
    drained_cv.notify_all();
  }

  // On a pool thread: runs the handler; the answer goes back when its
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

  // The response to send for a handler's finished future, its tensors
  // copied.
  Message response_of(const Future<Message>& done) const {
    if (done.has_error()) return error_response(done.error());
    Message m = done.value();
    if (m.type != MessageType::kResponse && m.type != MessageType::kError) {
      return error_response(std::make_exception_ptr(
          Error(ErrorCode::kInternal,
                fmt::format("the request handler answered with message type {}",
                            static_cast<int>(m.type)))));
    }
    if (auto problem = tensor_problem(m)) {
      return error_response(std::make_exception_ptr(
          std::invalid_argument(fmt::format("the response's {}", *problem))));
    }
    copy_tensors(m);
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
    bool drop = false;
    {
      std::lock_guard lock(mu);
      drop = stopping;
    }
    std::shared_ptr<Impl> caller = drop ? nullptr : fabric->peer(to);
    if (caller) {
      caller->complete_call(rank, std::move(response));
    } else {
      spdlog::debug("rpc agent \"{}\": dropping the response to call {} of \"{}\"", name,
                    id, workers[to].name);
    }
    finish_handling();
  }

  // ------------------------------------------------------------ timeouts

  void run_timer() {
    name_thread("sb-local-timer");
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
    SB_REQUIRE(timeout.count() >= 0, "join on rpc worker \"{}\": negative timeout {} ms",
               name, timeout.count());
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
    std::vector<int> missing;
    const auto result = fabric->barrier(rank, generation, deadline, bounded, missing);
    std::vector<std::string> names;
    for (int r : missing) names.push_back(fmt::format("\"{}\"", workers[r].name));
    switch (result) {
      case Fabric::BarrierResult::kPassed:
        return;
      case Fabric::BarrierResult::kTimedOut:
        throw TimeoutError(
            fmt::format("{}: timed out after {} ms waiting for workers [{}] to join", who,
                        timeout.count(), fmt::join(names, ", ")));
      case Fabric::BarrierResult::kPeerLeft:
        throw ConnectionError(fmt::format("{}: workers [{}] shut down without joining",
                                          who, fmt::join(names, ", ")));
      case Fabric::BarrierResult::kSelfLeft:
        throw Error(ErrorCode::kCancelled,
                    fmt::format("{}: rpc agent \"{}\" shut down", who, name));
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
      handling -= static_cast<int>(early.size());  // dropped; callers fail below
      early.clear();
      timer_cv.notify_all();
      drained_cv.notify_all();
    }
    for (Pending& call : cancelled) {
      settle(call, shut_down_error(call_prefix(call.dst, call.function)));
    }
    // From here on peers cannot reach this agent; calls they have pending
    // here fail with ConnectionError.
    if (fabric) {
      for (const auto& peer : fabric->leave(rank)) peer->peer_left(rank);
    }
    if (timer.joinable() && timer.get_id() != std::this_thread::get_id()) timer.join();
    pool->shutdown();
    std::lock_guard lock(mu);
    handler.reset();
  }
};

// ------------------------------------------------------------ the shell

class LocalAgent final : public rpc::RpcAgent {
 public:
  LocalAgent(std::string name, int rank, int world_size, size_t num_worker_threads)
      : RpcAgent(WorkerInfo{name, rank}, num_worker_threads),
        impl_(std::make_shared<Impl>(std::move(name), rank, world_size, pool())) {}

  ~LocalAgent() override {
    try {
      shutdown();
    } catch (const std::exception& e) {
      spdlog::error("rpc agent \"{}\": shutdown in the destructor failed: {}",
                    self().name, e.what());
    }
  }

  void rendezvous(const std::shared_ptr<Store>& store, Timeout timeout) {
    impl_->rendezvous(store, timeout);
  }

  void start(RequestHandler handler) override { impl_->start(std::move(handler)); }

  Future<Message> send(const WorkerInfo& to, Message request, Timeout timeout) override {
    return impl_->send(to, std::move(request), timeout);
  }

  WorkerInfo worker(const std::string& name) const override {
    return impl_->worker(name);
  }
  WorkerInfo worker(int id) const override { return impl_->worker(id); }
  std::vector<WorkerInfo> workers() const override { return impl_->workers; }

  void join(Timeout timeout) override { impl_->join(timeout); }
  void shutdown() override { impl_->shutdown(); }

 private:
  std::shared_ptr<Impl> impl_;
};

std::shared_ptr<rpc::RpcBackendOptions> construct_local_options(
    std::chrono::milliseconds rpc_timeout, const std::string& init_method,
    const rpc::Extras& extras) {
  auto options = std::make_shared<LocalBackendOptions>();
  options->rpc_timeout = rpc_timeout;
  options->init_method = init_method;
  rpc::ExtrasReader reader(kLocalBackendName, extras);
  if (auto threads = reader.get_int("num_worker_threads")) {
    SB_REQUIRE(*threads >= 1 && *threads <= kMaxWorkerThreads,
               "RPC backend \"{}\": num_worker_threads must be in [1, {}], got {}",
               kLocalBackendName, kMaxWorkerThreads, *threads);
    options->num_worker_threads = static_cast<int>(*threads);
  }
  reader.finish();
  return options;
}

}  // namespace

std::unique_ptr<rpc::RpcAgent> make_local_agent(const rpc::BackendInit& init) {
  SB_REQUIRE(init.world_size.has_value(),
             "LOCAL backend: dynamic groups are not supported (worker \"{}\" has no "
             "world_size)",
             init.name);
  rpc::validate_worker_name(init.name);
  SB_REQUIRE(init.store != nullptr, "LOCAL backend: worker \"{}\": the store is null",
             init.name);
  const int world_size = *init.world_size;
  SB_REQUIRE(world_size >= 1,
             "LOCAL backend: worker \"{}\": world_size must be at least 1, got {}",
             init.name, world_size);
  SB_REQUIRE(init.rank >= 0 && init.rank < world_size,
             "LOCAL backend: worker \"{}\": rank {} is outside [0, {})", init.name,
             init.rank, world_size);
  const rpc::RpcBackendOptions defaults;
  const rpc::RpcBackendOptions& options = init.options ? *init.options : defaults;
  SB_REQUIRE(options.rpc_timeout.count() >= 0,
             "LOCAL backend: worker \"{}\": rpc_timeout must not be negative, got {} ms",
             init.name, options.rpc_timeout.count());
  SB_REQUIRE(
      options.num_worker_threads >= 1 && options.num_worker_threads <= kMaxWorkerThreads,
      "LOCAL backend: worker \"{}\": num_worker_threads must be in [1, {}], got {}",
      init.name, kMaxWorkerThreads, options.num_worker_threads);
  auto agent = std::make_unique<LocalAgent>(
      init.name, init.rank, world_size, static_cast<size_t>(options.num_worker_threads));
  // On failure the agent's destructor shuts it down (and takes it out of the
  // fabric if it got in).
  agent->rendezvous(init.store, options.rpc_timeout);
  return agent;
}

rpc::BackendType register_local_backend() {
  static const rpc::BackendType type =
      rpc::register_backend(kLocalBackendName, construct_local_options, make_local_agent);
  return type;
}

}  // namespace switchboard::testing
