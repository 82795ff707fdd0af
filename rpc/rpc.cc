#include "rpc/rpc.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <exception>
#include <thread>

#include "common/check.h"
#include "common/error.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "rpc/agent.h"
#include "rpc/metrics_exporter.h"
#include "core/remote_error.h"
#include "rendezvous/init_method.h"
#include "rendezvous/rounds.h"
#include "rpc/rref_table.h"
#include "store/call_bound.h"
#include "store/prefix_store.h"
#include "store/store.h"
#include "store/store_metrics.h"

namespace switchboard::rpc {

struct RpcContext::State {
  BackendType backend;
  std::shared_ptr<RpcBackendOptions> options;
  std::shared_ptr<Store> store;
  std::unique_ptr<RpcAgent> agent;
  std::shared_ptr<detail::RRefTable> rrefs;
  std::optional<uint16_t> metrics_port;
  // Last: destroyed (it stops serving) before what its scrapes read. Reset
  // by shutdown().
  std::unique_ptr<MetricsExporter> exporter;

  RpcMetrics metrics() const {
    RpcMetrics m = agent->metrics_snapshot();
    if (auto store_metrics = store->metrics()) m.store = store_metrics->snapshot();
    return m;
  }
};

namespace {

constexpr const char* kMetricsPortVariable = "SWITCHBOARD_METRICS_PORT";
constexpr const char* kMetricsAddressVariable = "SWITCHBOARD_METRICS_ADDRESS";
constexpr const char* kDefaultMetricsAddress = "127.0.0.1";

std::string env_or_empty(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

// The integer in environment variable `name` (in [0, max]); nullopt when
// unset or empty. std::invalid_argument naming it otherwise.
std::optional<int> env_int(const char* name, int max) {
  const std::string text = env_or_empty(name);
  if (text.empty()) return std::nullopt;
  int value = -1;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  SB_REQUIRE(ec == std::errc() && end == text.data() + text.size() && value >= 0 &&
                 value <= max,
             "environment variable {}: expected an integer in [0, {}], got \"{}\"", name, max,
             text);
  return value;
}

// The metrics endpoint's port by the rule of RpcBackendOptions::metrics_port;
// nullopt: off.
std::optional<uint16_t> metrics_port_of(const std::string& worker,
                                        const RpcBackendOptions& options) {
  if (options.metrics_port) {
    SB_REQUIRE(*options.metrics_port >= 0 && *options.metrics_port <= 65535,
               "init_rpc(\"{}\"): metrics_port must be in [0, 65535], got {}", worker,
               *options.metrics_port);
    return static_cast<uint16_t>(*options.metrics_port);
  }
  const std::optional<int> base = env_int(kMetricsPortVariable, 65535);
  if (!base || *base == 0) return std::nullopt;
  // Several workers of one host (a launcher's LOCAL_RANK, SLURM's
  // SLURM_LOCALID) take one port each.
  const int port = *base + rendezvous::env_local_rank().value_or(0);
  SB_REQUIRE(port <= 65535, "init_rpc(\"{}\"): metrics port {} ({} plus the local rank) is "
             "above 65535", worker, port, kMetricsPortVariable);
  return static_cast<uint16_t>(port);
}

std::string metrics_address_of(const RpcBackendOptions& options) {
  if (!options.metrics_address.empty()) return options.metrics_address;
  std::string address = env_or_empty(kMetricsAddressVariable);
  return address.empty() ? kDefaultMetricsAddress : address;
}

}  // namespace

struct RpcContext::Callbacks {
  Mutex mu;
  std::vector<std::function<void(const WorkerInfo&)>> on_join SB_GUARDED_BY(mu);
  std::vector<std::function<void(const WorkerInfo&)>> on_leave SB_GUARDED_BY(mu);

  // Runs on the agent's pool, one change at a time per call.
  void dispatch(const MembershipChange& change) {
    std::vector<std::function<void(const WorkerInfo&)>> targets;
    {
      MutexLock lock(mu);
      targets = change.kind == MembershipChange::Kind::kJoined ? on_join : on_leave;
    }
    for (const auto& callback : targets) {
      try {
        callback(change.worker);
      } catch (...) {
        detail::log_uncaught(
            fmt::format("{} callback for \"{}\"",
                        change.kind == MembershipChange::Kind::kJoined ? "on_join" : "on_leave",
                        change.worker.name),
            std::current_exception());
      }
    }
  }
};

RpcContext::RpcContext()
    : functions_(std::make_shared<FunctionRegistry>("")),
      callbacks_(std::make_shared<Callbacks>()) {}

void RpcContext::on_join(std::function<void(const WorkerInfo&)> callback) {
  SB_REQUIRE(callback != nullptr, "on_join() with an empty callback");
  MutexLock lock(callbacks_->mu);
  callbacks_->on_join.push_back(std::move(callback));
}

void RpcContext::on_leave(std::function<void(const WorkerInfo&)> callback) {
  SB_REQUIRE(callback != nullptr, "on_leave() with an empty callback");
  MutexLock lock(callbacks_->mu);
  callbacks_->on_leave.push_back(std::move(callback));
}

RpcContext::~RpcContext() {
  try {
    shutdown(/*graceful=*/false);
  } catch (const std::exception& e) {
    spdlog::error("RpcContext destroyed: shutdown failed: {}", e.what());
  }
}

RpcContext& RpcContext::global() {
  // Leaked on purpose: workers' threads may still use it while static
  // destructors run.
  static RpcContext* context = new RpcContext();
  return *context;
}

void RpcContext::init_rpc(const std::string& name, std::string_view backend, int rank,
                          std::optional<int> world_size,
                          std::shared_ptr<RpcBackendOptions> options,
                          std::shared_ptr<Store> store) {
  init_rpc(name, backend_type(backend), rank, world_size, std::move(options),
           std::move(store));
}

void RpcContext::init_rpc(const std::string& name, int rank, std::optional<int> world_size,
                          std::shared_ptr<RpcBackendOptions> options,
                          std::shared_ptr<Store> store) {
  init_rpc(name, backend_type(kDefaultBackend), rank, world_size, std::move(options),
           std::move(store));
}

void RpcContext::init_rpc(const std::string& name, const BackendType& backend, int rank,
                          std::optional<int> world_size,
                          std::shared_ptr<RpcBackendOptions> options,
                          std::shared_ptr<Store> store) {
  MutexLock lifecycle(lifecycle_mu_);
  {
    MutexLock lock(mu_);
    SB_REQUIRE(state_ == nullptr,
               "init_rpc(\"{}\"): worker \"{}\" is already initialized; call shutdown() "
               "first",
               name, functions_->worker_name());
  }
  validate_worker_name(name);
  const bool forced_dynamic = world_size && *world_size == kDynamicGroup;
  if (forced_dynamic) world_size.reset();
  SB_REQUIRE(!world_size || *world_size >= 1,
             "init_rpc(\"{}\"): world_size must be at least 1 (or kDynamicGroup), got {}",
             name, world_size.value_or(0));
  if (!options) options = construct_rpc_backend_options(backend);
  // One bound for the whole init (rpc_timeout; 0: none), every store call
  // included: the rendezvous, the group's rounds and the backend's own.
  std::optional<StoreCallBound> bound;
  if (options->rpc_timeout.count() > 0) {
    bound.emplace(std::chrono::steady_clock::now() + options->rpc_timeout);
  }

  auto state = std::make_shared<State>(
      State{backend, options, nullptr, nullptr, nullptr, std::nullopt, nullptr});
  if (store) {
    if (rank < 0) rank = rendezvous::env_rank().value_or(-1);
    SB_REQUIRE(!world_size || (rank >= 0 && rank < *world_size),
               "init_rpc(\"{}\"): rank {} is outside [0, {})", name, rank,
               world_size.value_or(0));
    state->store = std::move(store);
  } else {
    rendezvous::Rendezvous found = rendezvous::rendezvous(options->init_method, rank, world_size,
                                  options->rpc_timeout, forced_dynamic);
    state->store = std::move(found.store);
    rank = found.rank;
    world_size = forced_dynamic ? std::nullopt : found.world_size;
  }
  rendezvous::claim_group_kind(*state->store, name, world_size);

  BackendInit init;
  std::optional<rendezvous::Round> generation;
  if (world_size) generation = rendezvous::join_static_round(state->store, rank, *world_size);
  init.store = generation ? generation->store : state->store;
  init.name = name;
  init.rank = rank;
  init.world_size = world_size;
  init.options = options;
  try {
    state->agent = init_backend(backend, init);
  } catch (const std::exception& e) {
    if (generation) rendezvous::mark_static_round_failed(*state->store, generation->number, e.what());
    throw;
  }
  if (auto port = metrics_port_of(name, *options)) {
    // On failure `state` goes, and the agent's destructor shuts it down.
    const State* s = state.get();
    state->exporter = std::make_unique<MetricsExporter>(metrics_address_of(*options), *port,
                                                        [s] { return s->metrics(); });
    state->metrics_port = state->exporter->port();
    spdlog::info("rpc worker \"{}\": metrics at {}", name, state->exporter->url());
  }

  std::shared_ptr<Callbacks> callbacks = callbacks_;
  state->agent->set_membership_listener(
      [callbacks](const MembershipChange& change) { callbacks->dispatch(change); });
  functions_->set_worker_name(name);
  set_default_log_identity(name);
  std::shared_ptr<FunctionRegistry> functions = functions_;
  state->rrefs = std::make_shared<detail::RRefTable>(
      this, state->agent->self(), state->agent->pool(), functions, options->rpc_timeout);
  state->agent->set_inline_functions(
      [functions](std::string_view function) { return functions->runs_inline(function); });
  state->agent->start([functions, rrefs = state->rrefs](Message request, const WorkerInfo& from) {
    // RRefs in the arguments arrive at this worker.
    detail::RRefDecodeScope scope(rrefs);
    if (detail::RRefTable::is_protocol(request.function)) return rrefs->serve(request, from);
    return functions->call(request, from);
  });
  MutexLock lock(mu_);
  state_ = std::move(state);
}

bool RpcContext::initialized() const {
  MutexLock lock(mu_);
  return state_ != nullptr;
}

std::shared_ptr<RpcContext::State> RpcContext::state() const {
  MutexLock lock(mu_);
  if (state_ == nullptr) {
    throw Error(ErrorCode::kFailedPrecondition,
                "RPC is not initialized on this worker: call init_rpc() first");
  }
  return state_;
}

namespace {

WorkerInfo resolve(const RpcAgent& agent, const WorkerRef& to) {
  return std::visit(
      [&](const auto& ref) -> WorkerInfo {
        using T = std::decay_t<decltype(ref)>;
        if constexpr (std::is_same_v<T, WorkerInfo>) {
          WorkerInfo found = agent.worker(ref.name);
          SB_REQUIRE(ref.id < 0 || found.id == ref.id,
                     "rpc to WorkerInfo{{\"{}\", {}}}: that worker's id is {}", ref.name,
                     ref.id, found.id);
          return found;
        } else {
          return agent.worker(ref);
        }
      },
      to.get());
}

}  // namespace

Future<Message> RpcContext::send(const WorkerRef& to, Message request,
                                 std::optional<std::chrono::milliseconds> timeout) {
  return send(to, std::move(request), timeout, nullptr);
}

std::shared_ptr<detail::RRefCore> RpcContext::create_remote(
    const WorkerRef& to, Message request, std::string type,
    std::optional<std::chrono::milliseconds> timeout, detail::RRefEncodeScope* forks) {
  std::shared_ptr<State> state = this->state();
  const WorkerInfo owner = resolve(*state->agent, to);
  return state->rrefs->create(owner, std::move(request), std::move(type), timeout, nullptr,
                              forks);
}

std::map<std::string, int64_t> RpcContext::rref_debug_info() const {
  return state()->rrefs->debug_info();
}

Future<Message> RpcContext::send(const WorkerRef& to, Message request,
                                 std::optional<std::chrono::milliseconds> timeout,
                                 std::shared_ptr<detail::RRefTable>* rrefs) {
  std::shared_ptr<State> state = this->state();
  if (rrefs != nullptr) *rrefs = state->rrefs;
  SB_REQUIRE(!timeout || timeout->count() >= 0,
             "rpc to function \"{}\": the timeout must be >= 0 ms, got {}",
             request.function, timeout.value_or(std::chrono::milliseconds(0)).count());
  const WorkerInfo worker = resolve(*state->agent, to);
  std::chrono::milliseconds wait = timeout.value_or(state->options->rpc_timeout);
  // Inside a call with a deadline: never wait past it (0 means none).
  if (const CallContext* serving = current_call(); serving && serving->deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        *serving->deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return Future<Message>::failed(std::make_exception_ptr(TimeoutError(fmt::format(
          "rpc to \"{}\" function \"{}\": no time left: the call this worker is serving "
          "(function \"{}\" from \"{}\") is past its deadline",
          worker.name, request.function, serving->function, serving->caller.name))));
    }
    if (wait.count() == 0 || left < wait) wait = left;
  }
  request.timeout_ms = static_cast<uint64_t>(wait.count());
  if (!has_client_interceptors_.load(std::memory_order_acquire)) {
    return state->agent->send(worker, std::move(request), wait);
  }
  std::shared_ptr<const std::vector<ClientInterceptor>> interceptors;
  {
    MutexLock lock(mu_);
    interceptors = client_interceptors_;
  }
  ClientCall call{worker, request.function, wait, request.payload.size(),
                  request.tensors.size(), {}};
  auto finish = [](const std::vector<std::function<void(std::exception_ptr)>>& done,
                   const std::exception_ptr& error) {
    for (const auto& callback : done) {
      try {
        callback(error);
      } catch (...) {  // documented: dropped
      }
    }
  };
  for (const ClientInterceptor& interceptor : *interceptors) {
    std::string refusal;
    try {
      refusal = interceptor(call);
    } catch (const std::exception& e) {
      refusal = e.what();
      if (refusal.empty()) refusal = "the interceptor threw";
    }
    if (refusal.empty()) continue;
    auto error = std::make_exception_ptr(Error(
        ErrorCode::kPermissionDenied,
        fmt::format("rpc to \"{}\" function \"{}\": refused by this worker's client "
                    "interceptor: {}",
                    worker.name, call.function, refusal)));
    finish(call.done_callbacks, error);
    return Future<Message>::failed(error);
  }
  Future<Message> sent = state->agent->send(worker, std::move(request), wait);
  if (call.done_callbacks.empty()) return sent;
  return sent.then_inline(
      [done = std::move(call.done_callbacks), finish](const Future<Message>& reply) {
        // An error response is a message at this layer: the callbacks get
        // the RemoteError the caller will see.
        std::exception_ptr error = reply.error();
        if (!error && reply.value().type == MessageType::kError) {
          try {
            error = std::make_exception_ptr(decode_remote_error(reply.value()));
          } catch (...) {
            error = std::current_exception();
          }
        }
        finish(done, error);
        return reply.value();
      });
}

void RpcContext::add_client_interceptor(ClientInterceptor interceptor) {
  SB_REQUIRE(interceptor != nullptr, "add_client_interceptor() with an empty interceptor");
  MutexLock lock(mu_);
  auto next = client_interceptors_
                  ? std::make_shared<std::vector<ClientInterceptor>>(*client_interceptors_)
                  : std::make_shared<std::vector<ClientInterceptor>>();
  next->push_back(std::move(interceptor));
  client_interceptors_ = std::move(next);
  has_client_interceptors_.store(true, std::memory_order_release);
}

WorkerInfo RpcContext::get_worker_info() const { return state()->agent->self(); }

WorkerInfo RpcContext::get_worker_info(const std::string& name) const {
  return state()->agent->worker(name);
}

std::vector<WorkerInfo> RpcContext::get_worker_infos() const {
  return state()->agent->workers();
}

std::shared_ptr<const RpcBackendOptions> RpcContext::options() const {
  return state()->options;
}

std::map<std::string, double> RpcContext::get_metrics() const {
  return state()->metrics().as_map();
}

RpcMetrics RpcContext::get_metrics_snapshot() const { return state()->metrics(); }

std::optional<uint16_t> RpcContext::metrics_port() const { return state()->metrics_port; }

void RpcContext::shutdown(bool graceful, std::optional<std::chrono::milliseconds> timeout) {
  MutexLock lifecycle(lifecycle_mu_);
  std::shared_ptr<State> state;
  {
    MutexLock lock(mu_);
    state = state_;
  }
  if (state == nullptr) return;
  // One bound for all of it (0: none): the group's wait, then the handlers
  // still running, whose threads are left to them past it.
  const std::chrono::milliseconds bound = timeout.value_or(state->options->rpc_timeout);
  if (bound.count() > 0) {
    state->agent->pool()->set_shutdown_deadline(std::chrono::steady_clock::now() + bound);
  }
  std::exception_ptr join_error;
  if (graceful) {
    // The references this worker holds are released first, so that the
    // group's quiet rounds deliver those messages too.
    state->rrefs->release_users(std::chrono::steady_clock::now() +
                                (bound.count() > 0 ? bound : std::chrono::hours(24)));
    try {
      state->agent->join(bound);
    } catch (...) {
      join_error = std::current_exception();
    }
  }
  state->rrefs->close();
  {
    // From here on, new calls fail with "not initialized"; calls that
    // already hold the state fail with Error(kCancelled) from the agent.
    MutexLock lock(mu_);
    state_ = nullptr;
  }
  {
    // The endpoint's HTTP server takes up to 2 s to stop (its poll
    // interval): it stops while the agent shuts down (scrapes meanwhile
    // read the agent's totals, which shutdown keeps).
    std::jthread stop_exporter([&state] { state->exporter.reset(); });
    state->agent->shutdown();
  }
  state->rrefs->abandon();
  if (join_error) {
    spdlog::warn("rpc worker \"{}\": graceful shutdown's wait for the group failed; "
                 "stopped anyway",
                 state->agent->self().name);
    std::rethrow_exception(join_error);
  }
}

// ------------------------------------------------------------ free functions

void init_rpc(const std::string& name, const BackendType& backend, int rank,
              std::optional<int> world_size, std::shared_ptr<RpcBackendOptions> options,
              std::shared_ptr<Store> store) {
  RpcContext::global().init_rpc(name, backend, rank, world_size, std::move(options),
                                std::move(store));
}

void init_rpc(const std::string& name, std::string_view backend, int rank,
              std::optional<int> world_size, std::shared_ptr<RpcBackendOptions> options,
              std::shared_ptr<Store> store) {
  RpcContext::global().init_rpc(name, backend, rank, world_size, std::move(options),
                                std::move(store));
}

void init_rpc(const std::string& name, int rank, std::optional<int> world_size,
              std::shared_ptr<RpcBackendOptions> options, std::shared_ptr<Store> store) {
  RpcContext::global().init_rpc(name, rank, world_size, std::move(options), std::move(store));
}

WorkerInfo get_worker_info() { return RpcContext::global().get_worker_info(); }

WorkerInfo get_worker_info(const std::string& name) {
  return RpcContext::global().get_worker_info(name);
}

std::vector<WorkerInfo> get_worker_infos() { return RpcContext::global().get_worker_infos(); }

void on_join(std::function<void(const WorkerInfo&)> callback) {
  RpcContext::global().on_join(std::move(callback));
}

void on_leave(std::function<void(const WorkerInfo&)> callback) {
  RpcContext::global().on_leave(std::move(callback));
}

void shutdown(bool graceful, std::optional<std::chrono::milliseconds> timeout) {
  RpcContext::global().shutdown(graceful, timeout);
}

std::map<std::string, double> get_metrics() { return RpcContext::global().get_metrics(); }

RpcMetrics get_metrics_snapshot() { return RpcContext::global().get_metrics_snapshot(); }

std::optional<uint16_t> metrics_port() { return RpcContext::global().metrics_port(); }

}  // namespace switchboard::rpc
