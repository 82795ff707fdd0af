#include "agents/process_group/agent.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <optional>
#include <stdexcept>
#include <utility>

#include "agents/process_group/link.h"
#include "agents/process_group/listener.h"
#include "agents/process_group/sender.h"
#include "collective/gloo_process_group.h"
#include "common/check.h"
#include "common/error.h"
#include "common/mutex.h"
#include "core/tensor_descriptor.h"
#include "rendezvous/quiet_group.h"
#include "rendezvous/rounds.h"
#include "rpc/backend/static_workers.h"
#include "rpc/call_table.h"
#include "store/prefix_store.h"
#include "store/store.h"

namespace switchboard::agents::process_group {
namespace {

using rpc::Future;
using rpc::Message;
using rpc::MessageType;
using rpc::Promise;
using rpc::WorkerInfo;
using Clock = std::chrono::steady_clock;
using Timeout = std::chrono::milliseconds;

// ---------------------------------------------------------------- helpers

// Makes every tensor of `m` able to travel: contiguous copies of strided
// ones. Returns what is wrong with the first tensor that cannot, if any.
std::optional<std::string> prepare_tensors(Message& m) {
  // The descriptor limits, checked here so that only this call fails: the
  // sender thread would otherwise refuse the message and fail the peer.
  if (m.tensors.size() > kMaxTensorsPerMessage) {
    return fmt::format("{} tensors exceed the limit of {} per message", m.tensors.size(),
                       kMaxTensorsPerMessage);
  }
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    Tensor& t = m.tensors[i];
    if (!t.defined()) return fmt::format("tensor {} is undefined", i);
    if (static_cast<size_t>(t.dim()) > kMaxTensorDims) {
      return fmt::format("tensor {} has {} dimensions (the limit is {})", i, t.dim(),
                         kMaxTensorDims);
    }
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

// The agent: wires one PeerSender and one PeerListener per remote worker
// to the link (the Gloo group) and the call table, and runs the
// rendezvous and join(). Its own lock guards only whether it started or is
// stopping and join()'s generation; every part guards its own state.
struct ProcessGroupAgent::Impl final : PeerEvents, std::enable_shared_from_this<Impl> {
  // One remote worker: its sender, its listener and its counters (null
  // for this rank). The counters' state: kConnected once the group formed,
  // kFailed when the link to the peer failed, kClosed at shutdown.
  struct Peer {
    std::unique_ptr<PeerSender> sender;
    std::unique_ptr<PeerListener> listener;
    std::shared_ptr<rpc::PeerMetrics> metrics;
  };

  Impl(std::shared_ptr<Store> store_in, std::string name_in, int rank_in, int world_in,
       std::shared_ptr<rpc::ThreadPool> pool_in,
       std::shared_ptr<rpc::AgentMetrics> metrics_in)
      : store(std::move(store_in)),
        name(std::move(name_in)),
        rank(rank_in),
        world_size(world_in),
        pool(std::move(pool_in)),
        metrics(std::move(metrics_in)),
        calls(name, pool) {
    // A call cancelled by its future: the callee is told with a cancel
    // message (type kCancel), queued behind what was sent to it before.
    calls.set_cancel_notifier([this](int dst, uint64_t id) {
      if (dst == rank) {
        calls.cancel_request(dst, id);
        return;
      }
      if (dst < 0 || dst >= static_cast<int>(peers.size()) || !peers[dst].sender) return;
      Message cancel;
      cancel.type = MessageType::kCancel;
      cancel.id = id;
      std::string ignored;  // a failed peer no longer runs the call's handler for us
      peers[dst].sender->enqueue(std::move(cancel), &ignored);
    });
  }

  // Immutable after construction.
  const std::shared_ptr<Store> store;
  const std::string name;
  const int rank;
  const int world_size;
  const std::shared_ptr<rpc::ThreadPool> pool;
  const std::shared_ptr<rpc::AgentMetrics> metrics;  // the agent's (may be null)
  rpc::backend::StaticWorkers workers;               // set by the rendezvous
  // The Gloo group, shared by the senders and listeners (set by the
  // rendezvous); `peers` by rank, filled by the rendezvous.
  std::unique_ptr<ProcessGroupLink> link;
  std::vector<Peer> peers;

  // Calls made and requests served: ids, deadlines, handlers, draining.
  rpc::CallTable calls;

  Mutex mu;
  bool started SB_GUARDED_BY(mu) = false;
  bool stopping SB_GUARDED_BY(mu) = false;
  uint64_t join_generation SB_GUARDED_BY(mu) = 0;
  std::atomic<bool> shut_down{false};

  // Every agent thread holds a shared_ptr to the Impl, so the Impl dies
  // after all of them returned, or on the last of them (when shutdown()
  // ran on that thread, a callback run inline there because the pool had
  // been shut down first, it could not join it): the senders and
  // listeners let such a thread go. They go first: they use the link.
  ~Impl() override { peers.clear(); }

  // ------------------------------------------------------------ setup

  void rendezvous(const ProcessGroupAgentOptions& options) {
    exchange_names(options.rpc_timeout, Clock::now() + options.rpc_timeout);
    std::unique_ptr<collective::GlooProcessGroup> group;
    if (world_size > 1) {
      collective::GlooOptions gloo;
      gloo.group_name = wire::kGroupName;
      gloo.timeout = Timeout(0);  // listeners wait for the next message forever
      gloo.hostname = options.hostname;
      gloo.iface = options.iface;
      PrefixStore prefixed(wire::kStorePrefix, store);
      group =
          std::make_unique<collective::GlooProcessGroup>(prefixed, rank, world_size, gloo);
    }
    link = std::make_unique<ProcessGroupLink>(name, std::move(group));
    peers.resize(world_size);
    for (int r = 0; r < world_size; ++r) {
      if (r == rank) continue;
      // Looked up once: the sender and listener count without a lock.
      if (metrics) {
        peers[r].metrics = metrics->peer(r, workers.name(r));
        peers[r].metrics->set_state(rpc::ConnectionState::kConnected);  // group formed
      }
      peers[r].sender = std::make_unique<PeerSender>(r, *link, *this, peers[r].metrics);
      peers[r].listener =
          std::make_unique<PeerListener>(r, *link, *this, peers[r].metrics);
    }
  }

  void exchange_names(Timeout timeout, Clock::time_point deadline) {
    workers = rpc::backend::StaticWorkers::exchange(
        *store, {wire::kNamesKey, name, rank, world_size}, timeout, deadline);
  }

  void start(RequestHandler h, InlinePredicate runs_inline) {
    SB_REQUIRE(static_cast<bool>(h), "rpc agent \"{}\": start() needs a handler", name);
    MutexLock lock(mu);
    SB_REQUIRE(!stopping, "rpc agent \"{}\": start() after shutdown()", name);
    SB_REQUIRE(!started, "rpc agent \"{}\": start() called twice", name);
    calls.start(std::move(h), std::move(runs_inline));
    started = true;
    const std::shared_ptr<const void> self = shared_from_this();
    for (Peer& peer : peers) {
      if (!peer.sender) continue;
      peer.sender->start(self);
      peer.listener->start(self);
    }
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

  Future<Message> send(const WorkerInfo& to, Message request, Timeout timeout) {
    const int dst = find(to);
    if (auto error = check_request(dst, to, request, timeout)) {
      return Future<Message>::failed(error);
    }
    if (dst == rank) clone_tensors(request);
    {
      MutexLock lock(mu);
      if (!started) {
        return Future<Message>::failed(std::make_exception_ptr(std::invalid_argument(
            fmt::format("{}: send() before start()", call_prefix(dst, request.function)))));
      }
    }
    rpc::CallTable::Added call;
    try {
      call = calls.add({dst, workers.name(dst), request.function, timeout});
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
    std::string failure;
    if (peers[dst].sender->enqueue(std::move(request), &failure) ==
        PeerSender::Queued::kFailed) {
      calls.fail(call.id, connection_error(call_prefix(dst, request.function), dst, failure));
    }
    return call.future;
  }

  // What is wrong with a call, or nullptr. Makes strided tensors contiguous.
  std::exception_ptr check_request(int dst, const WorkerInfo& to, Message& request,
                                   Timeout timeout) const {
    return workers.check_request(dst, to, request, timeout,
                                 [&request] { return prepare_tensors(request); });
  }

  std::exception_ptr connection_error(const std::string& prefix, int peer,
                                      const std::string& failure) const {
    return std::make_exception_ptr(
        ConnectionError(fmt::format("{}: connection to worker \"{}\" lost: {}", prefix,
                                    workers.name(peer), failure)));
  }

  // ------------------------------------------------------------ receiving

  // PeerEvents: a message from `peer`, on its listener's thread.
  void on_message(int peer, Message m) override {
    if (m.type == MessageType::kRequest) {
      calls.accept(incoming(peer, std::move(m)));
    } else if (m.type == MessageType::kCancel) {
      calls.cancel_request(peer, m.id);  // the caller's Future::cancel()
    } else {
      complete_call(peer, std::move(m));
    }
  }

  bool is_stopping() {
    MutexLock lock(mu);
    return stopping;
  }

  // A response arrived from `from` (or was produced here for a self-call).
  void complete_call(int from, Message response) {
    const uint64_t id = response.id;
    if (!calls.complete(id, std::move(response), from)) {
      spdlog::debug(
          "rpc agent \"{}\": dropping a response from \"{}\" to call {}, which "
          "is no longer pending (timed out or cancelled)",
          name, workers.name(from), id);
    }
  }

  // PeerEvents: the link to `peer` is unusable: fail every call to it
  // (nothing when the agent is stopping: its shutdown closed the link).
  void on_peer_failed(int peer, const std::string& reason) override {
    if (is_stopping() || !peers[peer].sender->fail(reason)) return;
    if (peers[peer].metrics)
      peers[peer].metrics->set_state(rpc::ConnectionState::kFailed);
    calls.cancel_requests_from(peer);  // their answers cannot reach it
    const size_t lost = calls.fail_if(
        [peer](const rpc::CallTable::Call& call) { return call.dst == peer; },
        [&](const rpc::CallTable::Call& call) {
          return connection_error(call_prefix(peer, call.function), peer, reason);
        });
    if (lost == 0) {
      spdlog::info("rpc agent \"{}\": worker \"{}\" went away: {}", name,
                   workers.name(peer), reason);
    } else {
      spdlog::warn("rpc agent \"{}\": worker \"{}\" went away with {} calls pending: {}",
                   name, workers.name(peer), lost, reason);
    }
  }

  // ------------------------------------------------------------ serving

  // A request from `from`, for the call table; the reply goes back to it.
  rpc::CallTable::Request incoming(int from, Message request) {
    return {std::move(request), workers.worker(from), nullptr,
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
    std::string failure;
    if (to == rank) {
      clone_tensors(reply);
      complete_call(rank, std::move(reply));
    } else if (peers[to].sender->enqueue(std::move(reply), &failure) !=
               PeerSender::Queued::kQueued) {
      spdlog::debug("rpc agent \"{}\": dropping the response to call {} of \"{}\"", name,
                    id, workers.name(to));
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
    group.prefix = rendezvous::quiet_rounds(wire::kScope, generation);
    group.rank = rank;
    group.names = workers.names();
    group.timeout = timeout;
    group.who = fmt::format("join on rpc worker \"{}\"", name);
    rendezvous::wait_for_quiet_group(group);
  }

  // ------------------------------------------------------------ shutdown

  void shutdown() {
    if (shut_down.exchange(true)) return;
    {
      MutexLock lock(mu);
      stopping = true;
    }
    for (Peer& peer : peers) {
      if (peer.sender) peer.sender->stop();
      // A peer that failed stays kFailed.
      if (peer.metrics && peer.metrics->state.load(std::memory_order_relaxed) !=
                              rpc::ConnectionState::kFailed) {
        peer.metrics->set_state(rpc::ConnectionState::kClosed);
      }
    }
    calls.close();
    // Aborts every posted Gloo send and recv: the threads waiting on them
    // see Error(kCancelled) and return.
    if (link) link->close();
    for (Peer& peer : peers) {
      if (peer.sender) peer.sender->join();
      if (peer.listener) peer.listener->join();
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
  impl_ = std::make_shared<Impl>(std::move(store), std::move(name), rank, world_size,
                                 pool(), metrics());
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
  impl_->start(std::move(handler), inline_functions());
}

Future<Message> ProcessGroupAgent::send(const WorkerInfo& to, Message request,
                                        Timeout timeout) {
  return impl_->send(to, std::move(request), timeout);
}

WorkerInfo ProcessGroupAgent::worker(const std::string& name) const {
  return impl_->worker(name);
}

WorkerInfo ProcessGroupAgent::worker(int id) const { return impl_->worker(id); }

std::vector<WorkerInfo> ProcessGroupAgent::workers() const {
  return impl_->workers.all();
}

void ProcessGroupAgent::join(Timeout timeout) { impl_->join(timeout); }

void ProcessGroupAgent::shutdown() { impl_->shutdown(); }

}  // namespace switchboard::agents::process_group
