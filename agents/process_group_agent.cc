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
#include "rpc/call_table.h"
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
        pool(std::move(pool_in)),
        calls(name, pool) {}

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

  // Calls made and requests served: ids, deadlines, handlers, draining.
  rpc::CallTable calls;

  std::mutex mu;
  bool started = false;                           // GUARDED_BY(mu)
  bool stopping = false;                          // GUARDED_BY(mu)
  uint64_t join_generation = 0;              // GUARDED_BY(mu)
  std::vector<std::unique_ptr<Peer>> peers;  // by rank; null for this rank
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
    calls.start(std::move(h));
    started = true;
    auto self = shared_from_this();
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
    return rpc::call_prefix(workers[dst].name, function);
  }

  Future<Message> send(const WorkerInfo& to, Message request, Timeout timeout) {
    const int dst = find(to);
    if (auto error = check_request(dst, to, request, timeout)) {
      return Future<Message>::failed(error);
    }
    if (dst == rank) clone_tensors(request);
    {
      std::lock_guard lock(mu);
      if (!started) {
        return Future<Message>::failed(std::make_exception_ptr(std::invalid_argument(
            fmt::format("{}: send() before start()", call_prefix(dst, request.function)))));
      }
    }
    rpc::CallTable::Added call;
    try {
      call = calls.add({dst, workers[dst].name, request.function, timeout});
    } catch (...) {
      return Future<Message>::failed(std::current_exception());
    }
    request.id = call.id;
    if (dst == rank) {
      calls.accept(incoming(rank, std::move(request)));
      return call.future;
    }
    // Added before the peer's state is read: peer_failed() marks the peer
    // failed first and then fails its calls, so this call is failed by one
    // or the other.
    std::exception_ptr refused;
    {
      std::lock_guard lock(mu);
      Peer& p = *peers[dst];
      if (p.failed) {
        refused = connection_error(call_prefix(dst, request.function), dst, p.failure);
      } else if (!stopping) {
        p.outbox.push_back(std::move(request));
        p.outbox_cv.notify_one();
      }
    }
    if (refused) calls.fail(call.id, refused);
    return call.future;
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
        calls.accept(incoming(peer, std::move(m)));
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
    const uint64_t id = response.id;
    if (!calls.complete(id, std::move(response), from)) {
      spdlog::debug(
          "rpc agent \"{}\": dropping a response from \"{}\" to call {}, which "
          "is no longer pending (timed out or cancelled)",
          name, workers[from].name, id);
    }
  }

  // The connection to `peer` is unusable: fail every call to it.
  void peer_failed(int peer, const std::string& reason) {
    {
      std::lock_guard lock(mu);
      Peer& p = *peers[peer];
      if (p.failed || stopping) return;
      p.failed = true;
      p.failure = reason;
      p.outbox.clear();
      p.outbox_cv.notify_all();
    }
    const size_t lost = calls.fail_if(
        [peer](const rpc::CallTable::Call& call) { return call.dst == peer; },
        [&](const rpc::CallTable::Call& call) {
          return connection_error(call_prefix(peer, call.function), peer, reason);
        });
    if (lost == 0) {
      spdlog::info("rpc agent \"{}\": worker \"{}\" went away: {}", name,
                   workers[peer].name, reason);
    } else {
      spdlog::warn("rpc agent \"{}\": worker \"{}\" went away with {} calls pending: {}",
                   name, workers[peer].name, lost, reason);
    }
  }

  // ------------------------------------------------------------ serving

  // A request from `from`, for the call table; the reply goes back to it.
  rpc::CallTable::Request incoming(int from, Message request) {
    return {std::move(request), workers[from], nullptr,
            rpc::CallTable::reply_via(weak_from_this(), &Impl::respond, from)};
  }

  // Sends the table's reply to `to`; a reply whose tensors cannot travel
  // becomes an error reply.
  void respond(int to, Message reply) {
    if (auto problem = prepare_tensors(reply)) {
      reply = calls.error_reply(reply.id, std::make_exception_ptr(std::invalid_argument(
                                              fmt::format("the response's {}", *problem))));
    }
    const uint64_t id = reply.id;
    if (to == rank) {
      clone_tensors(reply);
      complete_call(rank, std::move(reply));
    } else if (!enqueue(to, std::move(reply))) {
      spdlog::debug("rpc agent \"{}\": dropping the response to call {} of \"{}\"", name,
                    id, workers[to].name);
    }
  }

  // ------------------------------------------------------------ join

  void join(Timeout timeout) {
    const bool bounded = timeout.count() > 0;
    const auto deadline = Clock::now() + timeout;
    const std::string who = fmt::format("join on rpc worker \"{}\"", name);
    switch (calls.wait_idle(bounded ? std::optional(deadline) : std::nullopt)) {
      case rpc::CallTable::Idle::kIdle:
        break;
      case rpc::CallTable::Idle::kTimedOut: {
        const auto load = calls.load();
        throw TimeoutError(fmt::format(
            "{}: timed out after {} ms with {} calls in flight and {} requests being "
            "handled",
            who, timeout.count(), load.calls_in_flight, load.handling));
      }
      case rpc::CallTable::Idle::kClosed:
        throw Error(ErrorCode::kCancelled,
                    fmt::format("{}: rpc agent \"{}\" shut down", who, name));
    }
    uint64_t generation = 0;
    {
      std::lock_guard lock(mu);
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
    {
      std::lock_guard lock(mu);
      stopping = true;
      for (auto& peer : peers) {
        if (!peer) continue;
        peer->outbox.clear();
        peer->outbox_cv.notify_all();
      }
    }
    calls.close();
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
    pool->shutdown();
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
