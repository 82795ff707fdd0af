#include "tests/rpc/local_agent.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/check.h"
#include "common/error.h"
#include "common/mutex.h"
#include "core/message.h"
#include "core/tensor.h"
#include "rendezvous/quiet_group.h"
#include "rpc/backend/static_workers.h"
#include "rpc/call_table.h"
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

struct Impl;

// ---------------------------------------------------------------- Fabric

// The meeting point of one group's agents: which agent serves each rank,
// and which left. Shared by the agents of the group (and weakly by
// the process-global table below). Holds agents weakly: an agent that goes
// away without leave() counts as gone.
//
// Thread safety: every method takes `mu_` and calls no agent while holding
// it (the agents call the fabric, never the other way round).
class Fabric {
 public:
  explicit Fabric(std::string id) : id_(std::move(id)) {}
  const std::string& id() const { return id_; }

  // Makes `agent` the worker of `rank` in a group of `world_size`.
  // std::invalid_argument when the rank is taken or the world sizes differ.
  void enter(int rank, int world_size, const std::string& name,
             const std::shared_ptr<Impl>& agent) SB_EXCLUDES(mu_) {
    MutexLock lock(mu_);
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
  std::vector<int> wait_entered(Clock::time_point deadline, bool bounded)
      SB_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    auto all = [&]() SB_REQUIRES(mu_) { return num_entered_ == world_size_; };
    if (bounded) {
      cv_.wait_until(mu_, deadline, all);
    } else {
      cv_.wait(mu_, all);
    }
    std::vector<int> missing;
    for (int r = 0; r < world_size_; ++r) {
      if (!entered_[r]) missing.push_back(r);
    }
    return missing;
  }

  // The agent of `rank`, or null when it left (or never came).
  std::shared_ptr<Impl> peer(int rank) SB_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (rank < 0 || rank >= world_size_ || left_[rank]) return nullptr;
    return slots_[rank].lock();
  }

  // Takes `rank` out of the group; returns the agents still in it (to be
  // told, outside the lock). Wakes barrier waiters.
  std::vector<std::shared_ptr<Impl>> leave(int rank) SB_EXCLUDES(mu_) {
    std::vector<std::shared_ptr<Impl>> others;
    MutexLock lock(mu_);
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

  // Whether `rank` left the group (shut down), for join().
  bool left(int rank) SB_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return rank >= 0 && rank < world_size_ && left_[rank];
  }

 private:
  const std::string id_;
  Mutex mu_;
  CondVar cv_;  // entries and departures
  int world_size_ SB_GUARDED_BY(mu_) = -1;  // set by the first enter
  std::vector<std::weak_ptr<Impl>> slots_ SB_GUARDED_BY(mu_);  // by rank
  std::vector<std::string> names_ SB_GUARDED_BY(mu_);
  std::vector<bool> entered_ SB_GUARDED_BY(mu_);
  std::vector<bool> left_ SB_GUARDED_BY(mu_);
  int num_entered_ SB_GUARDED_BY(mu_) = 0;
};

// The process-global table of fabrics by id. Holds them weakly: a fabric
// lives as long as one of its agents (or a rendezvous in progress) does.
// Never destroyed, so agents destroyed during static destruction are safe.
struct FabricTable {
  Mutex mu;
  std::map<std::string, std::weak_ptr<Fabric>> fabrics SB_GUARDED_BY(mu);

  static FabricTable& instance() {
    static auto* table = new FabricTable;
    return *table;
  }

  // A new fabric under a fresh id "<pid>:<counter>:<steady clock ns>":
  // unique in this process, and unlikely to match a stale one of another.
  std::shared_ptr<Fabric> create() SB_EXCLUDES(mu) {
    static std::atomic<uint64_t> counter{0};
    const std::string id = fmt::format("{}:{}:{}", ::getpid(), counter.fetch_add(1),
                                       Clock::now().time_since_epoch().count());
    auto fabric = std::make_shared<Fabric>(id);
    MutexLock lock(mu);
    for (auto it = fabrics.begin(); it != fabrics.end();) {
      it = it->second.expired() ? fabrics.erase(it) : std::next(it);
    }
    fabrics.emplace(id, fabric);
    return fabric;
  }

  void forget(const std::string& id) SB_EXCLUDES(mu) {
    MutexLock lock(mu);
    fabrics.erase(id);
  }

  std::shared_ptr<Fabric> find(const std::string& id) SB_EXCLUDES(mu) {
    MutexLock lock(mu);
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

  Impl(std::string name_in, int rank_in, int world_in,
       std::shared_ptr<rpc::ThreadPool> pool_in, std::shared_ptr<rpc::AgentMetrics> metrics_in)
      : name(std::move(name_in)),
        rank(rank_in),
        world_size(world_in),
        pool(std::move(pool_in)),
        metrics(std::move(metrics_in)),
        calls(name, pool) {}

  // Immutable after construction.
  const std::string name;
  const int rank;
  const int world_size;
  const std::shared_ptr<rpc::ThreadPool> pool;
  const std::shared_ptr<rpc::AgentMetrics> metrics;  // the agent's (RpcAgent::metrics())
  // Set by rendezvous(), immutable afterwards. `workers` is
  // set before this agent enters the fabric (other
  // agents read them after finding it there); `fabric` once it entered
  // (read by this agent's own calls, all of which come after construction).
  std::shared_ptr<Fabric> fabric;
  std::shared_ptr<Store> store;  // the group's: join() meets the others there
  rpc::backend::StaticWorkers workers;
  // The transport's counters, by rank (null for this worker): what a real
  // transport reports through rpc::PeerMetrics. Set with `workers`.
  std::vector<std::shared_ptr<rpc::PeerMetrics>> peers;

  // Calls made and requests served: ids, deadlines, handlers, draining.
  rpc::CallTable calls;
  Mutex mu;
  uint64_t join_generation SB_GUARDED_BY(mu) = 0;
  std::atomic<bool> shut_down{false};


  // ------------------------------------------------------------ setup

  // Blocks until every rank of the group is in the fabric; see the header.
  void rendezvous(const std::shared_ptr<Store>& store_in, Timeout timeout) {
    store = store_in;
    const bool bounded = timeout.count() > 0;
    const auto deadline = Clock::now() + timeout;
    std::shared_ptr<Fabric> found = find_fabric(*store);
    exchange_names(*store, timeout, deadline);
    // Only once in: shutdown() leaves the fabric it finds here, and an agent
    // refused by enter() (its rank taken) must not take out the rank's owner.
    found->enter(rank, world_size, name, shared_from_this());
    fabric = std::move(found);
    // A call cancelled by its future: the callee's table is told directly.
    calls.set_cancel_notifier([this](int dst, uint64_t id) {
      if (std::shared_ptr<Impl> target = fabric->peer(dst)) target->calls.cancel_request(rank, id);
    });
    const std::vector<int> missing = fabric->wait_entered(deadline, bounded);
    if (!missing.empty()) {
      throw TimeoutError(fmt::format(
          "rpc worker \"{}\" (rank {} of {}): timed out after {} ms waiting for ranks "
          "[{}] to enter the LOCAL fabric",
          name, rank, world_size, timeout.count(), fmt::join(missing, ", ")));
    }
    for (const auto& peer : peers) {
      if (peer) peer->set_state(rpc::ConnectionState::kConnected);
    }
  }

  // What a message would cost on a wire: its name, body and tensors.
  static size_t wire_bytes(const Message& m) {
    size_t bytes = m.function.size() + m.payload.size();
    for (const Tensor& t : m.tensors) bytes += t.nbytes();
    return bytes;
  }

  // Counts a message to (`sent`) or from worker `peer` (not this one).
  void count(int peer, const Message& m, bool sent) {
    if (peer == rank) return;
    if (sent) {
      peers[peer]->sent(wire_bytes(m));
    } else {
      peers[peer]->received(wire_bytes(m));
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

  void exchange_names(Store& store, Timeout timeout, Clock::time_point deadline) {
    workers = rpc::backend::StaticWorkers::exchange(
        store, {kNamesKey, name, rank, world_size}, timeout, deadline);
    for (const WorkerInfo& w : workers.all()) {
      peers.push_back(w.id == rank ? nullptr : metrics->peer(w.id, w.name));
    }
  }

  void start(RequestHandler h, rpc::RpcAgent::InlinePredicate runs_inline) {
    calls.start(std::move(h), std::move(runs_inline));
  }

  // ------------------------------------------------------------ lookup

  int find(const WorkerInfo& to) const { return workers.find(to); }
  WorkerInfo worker(const std::string& worker_name) const {
    return workers.worker(worker_name);
  }
  WorkerInfo worker(int id) const { return workers.worker(id); }

  // ------------------------------------------------------------ sending

  std::string call_prefix(int dst, const std::string& function) const {
    return rpc::call_prefix(workers.name(dst), function);
  }

  std::exception_ptr connection_error(int dst, const std::string& function) const {
    return std::make_exception_ptr(
        ConnectionError(fmt::format("{}: connection to worker \"{}\" lost: it shut down",
                                    call_prefix(dst, function), workers.name(dst))));
  }

  // What is wrong with a call, or nullptr.
  std::exception_ptr check_request(int dst, const WorkerInfo& to, const Message& request,
                                   Timeout timeout) const {
    return workers.check_request(dst, to, request, timeout,
                                 [&]() -> std::optional<std::string> {
                                   if (auto bad_tensor = tensor_problem(request))
                                     return bad_tensor;
                                   if (!calls.started()) return "send() before start()";
                                   return std::nullopt;
                                 });
  }

  Future<Message> send(const WorkerInfo& to, Message request, Timeout timeout) {
    const int dst = find(to);
    if (auto error = check_request(dst, to, request, timeout)) {
      return Future<Message>::failed(error);
    }
    std::shared_ptr<Impl> target = fabric->peer(dst);
    rpc::CallTable::Added call;
    try {
      copy_tensors(request);
      call = calls.add({dst, workers.name(dst), request.function, timeout});
    } catch (...) {
      return Future<Message>::failed(std::current_exception());
    }
    request.id = call.id;
    const std::string function = request.function;
    count(dst, request, /*sent=*/true);
    if (!target || !target->calls.accept(target->incoming(rank, std::move(request)))) {
      calls.fail(call.id, connection_error(dst, function));
    }
    return call.future;
  }

  // The answer to call `response.id` came from `from` (any thread).
  void complete_call(int from, Message response) {
    const uint64_t id = response.id;
    count(from, response, /*sent=*/false);
    if (!calls.complete(id, std::move(response), from)) {
      spdlog::debug(
          "rpc agent \"{}\": dropping a response from \"{}\" to call {}, which is no "
          "longer pending (timed out or cancelled)",
          name, workers.name(from), id);
    }
  }

  // Worker `peer` left the fabric (shut down): fail every call to it.
  void peer_left(int peer) {
    peers[peer]->set_state(rpc::ConnectionState::kClosed);
    calls.cancel_requests_from(peer);  // their answers cannot reach it
    const size_t lost = calls.fail_if(
        [peer](const rpc::CallTable::Call& call) { return call.dst == peer; },
        [&](const rpc::CallTable::Call& call) { return connection_error(peer, call.function); });
    if (lost > 0) {
      spdlog::warn("rpc agent \"{}\": worker \"{}\" shut down with {} calls pending",
                   name, workers.name(peer), lost);
    }
  }

  // ------------------------------------------------------------ serving

  // A request from the worker of rank `from`, for this agent's call table:
  // its reply goes straight back to the caller's table.
  rpc::CallTable::Request incoming(int from, Message request) {
    count(from, request, /*sent=*/false);
    return {std::move(request), workers.worker(from), nullptr,
            rpc::CallTable::reply_via(weak_from_this(), &Impl::respond, from)};
  }

  // Sends the table's reply to `to`, its tensors copied; one whose tensors
  // cannot travel becomes an error reply.
  void respond(int to, Message reply) {
    if (auto problem = tensor_problem(reply)) {
      reply = calls.error_reply(reply.id, std::make_exception_ptr(std::invalid_argument(
                                              fmt::format("the response's {}", *problem))));
    }
    copy_tensors(reply);
    std::shared_ptr<Impl> caller = calls.closed() ? nullptr : fabric->peer(to);
    if (caller) {
      count(to, reply, /*sent=*/true);
      caller->complete_call(rank, std::move(reply));
    } else {
      spdlog::debug("rpc agent \"{}\": dropping the response to call {} of \"{}\"", name,
                    reply.id, workers.name(to));
    }
  }

  // ------------------------------------------------------------ join

  void join(Timeout timeout) {
    uint64_t generation = 0;
    {
      MutexLock lock(mu);
      generation = join_generation++;
    }
    rpc::QuietCalls local(calls);
    rendezvous::QuietGroup group;
    group.calls = &local;
    group.store = store.get();
    group.prefix = fmt::format("local/join/{}/", generation);
    group.rank = rank;
    group.names = workers.names();
    group.gone = [this](int r) -> std::optional<std::string> {
      if (fabric->left(r)) return std::string("shut down");
      return std::nullopt;
    };
    group.timeout = timeout;
    group.who = fmt::format("join on rpc worker \"{}\"", name);
    rendezvous::wait_for_quiet_group(group);
  }

  // ------------------------------------------------------------ shutdown

  void shutdown() {
    if (shut_down.exchange(true)) return;
    calls.close();
    // From here on peers cannot reach this agent; calls they have pending
    // here fail with ConnectionError.
    if (fabric) {
      for (const auto& peer : fabric->leave(rank)) peer->peer_left(rank);
    }
    for (const auto& peer : peers) {
      if (peer) peer->set_state(rpc::ConnectionState::kClosed);
    }
    pool->shutdown();
  }
};


// ------------------------------------------------------------ the shell

class LocalAgent final : public rpc::RpcAgent {
 public:
  LocalAgent(std::string name, int rank, int world_size, size_t num_worker_threads)
      : RpcAgent(WorkerInfo{name, rank}, num_worker_threads),
        impl_(std::make_shared<Impl>(std::move(name), rank, world_size, pool(), metrics())) {}

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

  void start(RequestHandler handler) override {
    impl_->start(std::move(handler), inline_functions());
  }

  Future<Message> send(const WorkerInfo& to, Message request, Timeout timeout) override {
    return impl_->send(to, std::move(request), timeout);
  }

  WorkerInfo worker(const std::string& name) const override {
    return impl_->worker(name);
  }
  WorkerInfo worker(int id) const override { return impl_->worker(id); }
  std::vector<WorkerInfo> workers() const override { return impl_->workers.all(); }

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
