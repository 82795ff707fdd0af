// The public RPC API: torch.distributed.rpc in C++.
//
//   // every worker
//   rpc::register_function("add", [](int64_t a, int64_t b) { return a + b; });
//   rpc::init_rpc("worker0", "PROCESS_GROUP", rank, world_size);
//   int64_t three = rpc::rpc_sync<int64_t>("worker1", "add", 1, 2);
//   rpc::Future<Tensor> f = rpc::rpc_async<Tensor>("worker1", "scale", t, 2.0);
//   rpc::shutdown();  // graceful: waits for every worker's outstanding work
//
// The free functions act on RpcContext::global(), the process's worker; a
// process may own further RpcContexts (one worker each). docs/api.md is the
// reference for users, docs/thread_model.md says which thread runs what
// (handlers and future callbacks on the agent's pool, which grows while
// its threads wait on nested calls).
//
// Thread safety: every function may be called from any thread. init_rpc
// and shutdown are serialized; calls racing with shutdown either complete
// or fail with Error(kCancelled).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "common/mutex.h"
#include "rpc/backend_registry.h"
#include "rpc/call_context.h"
#include "rpc/function_registry.h"
#include "rpc/future.h"
#include "core/message.h"
#include "rpc/metrics.h"
#include "core/remote_error.h"
#include "rpc/rref.h"
#include "core/serialize.h"

namespace switchboard {
class Store;
}

namespace switchboard::rpc {

// Where a call goes: a worker's name, its WorkerInfo or its id.
class WorkerRef {
 public:
  WorkerRef(std::string name) : ref_(std::move(name)) {}  // NOLINT: implicit
  WorkerRef(const char* name) : ref_(std::string(name)) {}  // NOLINT: implicit
  WorkerRef(std::string_view name) : ref_(std::string(name)) {}  // NOLINT: implicit
  WorkerRef(WorkerInfo info) : ref_(std::move(info)) {}  // NOLINT: implicit
  WorkerRef(int id) : ref_(id) {}  // NOLINT: implicit

  const std::variant<std::string, WorkerInfo, int>& get() const { return ref_; }

 private:
  std::variant<std::string, WorkerInfo, int> ref_;
};

// The backend init_rpc uses when none is named.
inline constexpr const char* kDefaultBackend = "PIPE";

// world_size for a dynamic group where the init method would find a world
// size (e.g. under the launcher, whose WORLD_SIZE counts the processes it
// started).
inline constexpr int kDynamicGroup = 0;

class RpcContext {
 public:
  RpcContext();
  // Shuts down ungracefully if still initialized.
  ~RpcContext();
  RpcContext(const RpcContext&) = delete;
  RpcContext& operator=(const RpcContext&) = delete;

  // The process's context, used by the free functions below. Never
  // destroyed before the process exits; shut it down before returning from
  // main when it was initialized.
  static RpcContext& global();

  // Makes this context worker `name` (1 to 128 letters, digits, '_', '-',
  // ':'; unique in the group) of a group over `backend` (a BackendType or a
  // registered name). rank -1 and world_size nullopt come from the
  // environment (env://: RANK/WORLD_SIZE, SLURM, Open MPI; rendezvous/init_method.h).
  // A world size makes a static group; none (or kDynamicGroup) a dynamic
  // one, where workers join and leave while the others run and a rank is an
  // id never reused. `options` null takes the backend's defaults; `store`
  // null resolves options->init_method, and each static init over one store
  // gets its own key space. With options->metrics_port (or
  // SWITCHBOARD_METRICS_PORT) it also serves the metrics (below).
  // Throws std::invalid_argument (a bad name, rank or option; already
  // initialized; a static and a dynamic worker in one store), RegistryError
  // (unknown backend), Error(kUnavailable) (the metrics port), and what the
  // store and backend throw (TimeoutError naming the missing ranks, a
  // duplicate name). A failed init_rpc leaves the context uninitialized.
  void init_rpc(const std::string& name, const BackendType& backend, int rank = -1,
                std::optional<int> world_size = std::nullopt,
                std::shared_ptr<RpcBackendOptions> options = nullptr,
                std::shared_ptr<Store> store = nullptr);
  void init_rpc(const std::string& name, std::string_view backend, int rank = -1,
                std::optional<int> world_size = std::nullopt,
                std::shared_ptr<RpcBackendOptions> options = nullptr,
                std::shared_ptr<Store> store = nullptr);
  // With the default backend (kDefaultBackend).
  void init_rpc(const std::string& name, int rank = -1,
                std::optional<int> world_size = std::nullopt,
                std::shared_ptr<RpcBackendOptions> options = nullptr,
                std::shared_ptr<Store> store = nullptr);
  bool initialized() const;

  // Registers `f` under `name` (rpc/function_registry.h): before init_rpc
  // or at any time after; kept across shutdown and re-init. RegistryError
  // for a taken name.
  template <typename F>
  void register_function(std::string name, F&& f) {
    functions_->register_function(std::move(name), std::forward<F>(f));
  }
  // The same, for a short function that never blocks: it runs on the
  // thread that receives the request, not the pool (one thread hand-off
  // less per call; see FunctionRegistry::register_inline_function for what
  // it must not do).
  template <typename F>
  void register_inline_function(std::string name, F&& f) {
    functions_->register_inline_function(std::move(name), std::forward<F>(f));
  }
  // The backend kit: a function that serves requests as they came and makes
  // its own response (FunctionRegistry::register_raw_function); callers
  // reach it with send().
  void register_raw_function(std::string name, FunctionRegistry::RawFunction f) {
    functions_->register_raw_function(std::move(name), std::move(f));
  }
  const FunctionRegistry& functions() const { return *functions_; }
  // Adds a server interceptor (rpc/call_context.h): every call this worker
  // serves from now on passes it before its function runs. Kept across
  // shutdown and re-init.
  void add_server_interceptor(ServerInterceptor interceptor) {
    functions_->add_interceptor(std::move(interceptor));
  }
  // Adds a client interceptor (rpc/call_context.h): every call this worker
  // makes from now on passes it before it is sent. Kept across shutdown
  // and re-init. std::invalid_argument for an empty one.
  void add_client_interceptor(ClientInterceptor interceptor) SB_EXCLUDES(mu_);

  // Calls `function` on `to` (a name, WorkerInfo or id) with `args`,
  // optionally led by with_timeout(t) (else options.rpc_timeout; 0: none).
  // R is the remote result's type (a mismatch: SerializationError naming
  // both). Tensors in `args` are read while the call is under way: do not
  // write to them until the future completes. Throws Error
  // (kFailedPrecondition) when not initialized, NotFoundError for an unknown
  // worker, std::invalid_argument for arguments that cannot be encoded.
  // The future fails with RemoteError (the function threw, is unknown, or
  // its arguments did not match), TimeoutError, ConnectionError (the worker
  // went away) or Error(kCancelled) (this worker shut down). Its callbacks
  // run on the pool; dropping it cancels nothing. rpc_sync waits and
  // throws those.
  template <typename R = void, typename... Args>
  Future<R> rpc_async(const WorkerRef& to, const std::string& function,
                      const Args&... args);
  template <typename R = void, typename... Args>
  R rpc_sync(const WorkerRef& to, const std::string& function, const Args&... args);

  // Runs `function` on `to` with `args` (optionally led by
  // with_timeout(t)) and returns at once an RRef to its result, which stays
  // on `to` (rpc/rref.h; torch's rpc.remote). T is the result's type.
  // Throws as rpc_async; what the call meets later (the function threw, a
  // timeout, `to` died) comes out of to_here() and the calls on the RRef.
  template <typename T, typename... Args>
  RRef<T> remote(const WorkerRef& to, const std::string& function, const Args&... args);
  // torch's _rref_context_get_debug_info(): num_owner_rrefs (values this
  // worker owns), num_user_rrefs (references it holds to others' values),
  // num_pending_users (those not yet confirmed by their owner), num_forks
  // (references it sent whose receivers have not yet been counted).
  // Error(kFailedPrecondition) before init_rpc.
  std::map<std::string, int64_t> rref_debug_info() const;

  // This worker; the named one (NotFoundError naming it); every worker
  // (by id). Error(kFailedPrecondition) before init_rpc.
  WorkerInfo get_worker_info() const;
  WorkerInfo get_worker_info(const std::string& name) const;
  std::vector<WorkerInfo> get_worker_infos() const;
  // Dynamic groups: called on the pool with each worker that joins or
  // leaves (not for those present at init_rpc, nor for this worker, except
  // that on_leave names this worker when the group evicted it:
  // docs/pipe.md, "Dynamic groups"). Kept across shutdown and re-init; any
  // number may be registered.
  void on_join(std::function<void(const WorkerInfo&)> callback);
  void on_leave(std::function<void(const WorkerInfo&)> callback);
  // The options init_rpc used (Error(kFailedPrecondition) before init_rpc).
  std::shared_ptr<const RpcBackendOptions> options() const;

  // This worker's metrics now: torch's get_metrics() form, one key per
  // series (`switchboard_rpc_calls_sent_total{function="add"}` -> 3), or
  // as a structure (rpc/metrics.h); the store client's counters included
  // when the store counts (TcpStore). docs/operations.md lists every
  // metric. Error(kFailedPrecondition) before init_rpc or after shutdown.
  std::map<std::string, double> get_metrics() const;
  RpcMetrics get_metrics_snapshot() const;
  // The port of the Prometheus endpoint; nullopt when it is off.
  // Error(kFailedPrecondition) before init_rpc.
  std::optional<uint16_t> metrics_port() const;

  // Graceful, static group: waits (the agent's join()) until the whole
  // group is quiet: no worker has calls outstanding or will make more
  // (rendezvous/quiet_group.h), then stops; a failing wait (TimeoutError;
  // ConnectionError for workers that shut down without joining or were
  // lost, raised once the workers left are quiet among themselves) still
  // stops this worker, then rethrows. Graceful, dynamic group: leaves
  // (takes the membership token, says goodbye, finishes its calls in
  // flight). Ungraceful: stops at once, failing pending futures with
  // Error(kCancelled). Either way, handlers still running see their call
  // cancelled (CallContext::cancelled()), and shutdown waits for them only
  // while its bound lasts; past it their threads are left to finish on
  // their own (logged) and their replies are not sent. `timeout` (default
  // options.rpc_timeout; 0: none) bounds the whole of shutdown, the wait
  // for the group included. Afterwards the context may init_rpc again;
  // uninitialized, returns at once.
  void shutdown(bool graceful = true,
                std::optional<std::chrono::milliseconds> timeout = std::nullopt);

  // Sends an encoded request (type kRequest, function and payload set);
  // `timeout` nullopt means options.rpc_timeout. What rpc_async uses;
  // throws and fails as rpc_async, but completes with the response as it
  // came: kResponse, or kError for a remote failure (decode_remote_error()
  // in core/remote_error.h makes it a RemoteError). With
  // register_raw_function(), the backend kit for adapters that carry
  // another framework's messages.
  Future<Message> send(const WorkerRef& to, Message request,
                       std::optional<std::chrono::milliseconds> timeout);

 private:
  struct State;
  std::shared_ptr<State> state() const;  // throws when uninitialized

  template <typename R, typename... Args>
  Future<R> call(const WorkerRef& to, const std::string& function,
                 std::optional<std::chrono::milliseconds> timeout, const Args&... args);
  // send(), also handing out the worker's RRef table (the result's RRefs
  // arrive there).
  Future<Message> send(const WorkerRef& to, Message request,
                       std::optional<std::chrono::milliseconds> timeout,
                       std::shared_ptr<detail::RRefTable>* rrefs);
  std::shared_ptr<detail::RRefCore> create_remote(
      const WorkerRef& to, Message request, std::string type,
      std::optional<std::chrono::milliseconds> timeout, detail::RRefEncodeScope* forks);

  struct Callbacks;

  const std::shared_ptr<FunctionRegistry> functions_;
  const std::shared_ptr<Callbacks> callbacks_;
  Mutex lifecycle_mu_;  // serializes init_rpc and shutdown
  mutable Mutex mu_;
  std::shared_ptr<State> state_ SB_GUARDED_BY(mu_);  // null when uninitialized
  // Client interceptors, copied on write; `has_client_interceptors_` spares
  // calls the lock while there are none.
  std::shared_ptr<const std::vector<ClientInterceptor>> client_interceptors_
      SB_GUARDED_BY(mu_);
  std::atomic<bool> has_client_interceptors_{false};
};

// ---------------------------------------------------------------------------
// The process-wide worker: RpcContext::global()'s methods.

void init_rpc(const std::string& name, const BackendType& backend, int rank = -1,
              std::optional<int> world_size = std::nullopt,
              std::shared_ptr<RpcBackendOptions> options = nullptr,
              std::shared_ptr<Store> store = nullptr);
void init_rpc(const std::string& name, std::string_view backend, int rank = -1,
              std::optional<int> world_size = std::nullopt,
              std::shared_ptr<RpcBackendOptions> options = nullptr,
              std::shared_ptr<Store> store = nullptr);
void init_rpc(const std::string& name, int rank = -1,
              std::optional<int> world_size = std::nullopt,
              std::shared_ptr<RpcBackendOptions> options = nullptr,
              std::shared_ptr<Store> store = nullptr);

template <typename F>
void register_function(std::string name, F&& f) {
  RpcContext::global().register_function(std::move(name), std::forward<F>(f));
}

template <typename F>
void register_inline_function(std::string name, F&& f) {
  RpcContext::global().register_inline_function(std::move(name), std::forward<F>(f));
}
inline void register_raw_function(std::string name, FunctionRegistry::RawFunction f) {
  RpcContext::global().register_raw_function(std::move(name), std::move(f));
}

inline void add_server_interceptor(ServerInterceptor interceptor) {
  RpcContext::global().add_server_interceptor(std::move(interceptor));
}

inline void add_client_interceptor(ClientInterceptor interceptor) {
  RpcContext::global().add_client_interceptor(std::move(interceptor));
}

template <typename R = void, typename... Args>
Future<R> rpc_async(const WorkerRef& to, const std::string& function,
                    const Args&... args) {
  return RpcContext::global().rpc_async<R>(to, function, args...);
}

template <typename R = void, typename... Args>
R rpc_sync(const WorkerRef& to, const std::string& function, const Args&... args) {
  return RpcContext::global().rpc_sync<R>(to, function, args...);
}

template <typename T, typename... Args>
RRef<T> remote(const WorkerRef& to, const std::string& function, const Args&... args) {
  return RpcContext::global().remote<T>(to, function, args...);
}

WorkerInfo get_worker_info();
WorkerInfo get_worker_info(const std::string& name);
std::vector<WorkerInfo> get_worker_infos();
void on_join(std::function<void(const WorkerInfo&)> callback);
void on_leave(std::function<void(const WorkerInfo&)> callback);
void shutdown(bool graceful = true,
              std::optional<std::chrono::milliseconds> timeout = std::nullopt);
std::map<std::string, double> get_metrics();
RpcMetrics get_metrics_snapshot();
std::optional<uint16_t> metrics_port();

// ---------------------------------------------------------------------------
// Implementation.

template <typename R, typename... Args>
Future<R> RpcContext::call(const WorkerRef& to, const std::string& function,
                           std::optional<std::chrono::milliseconds> timeout,
                           const Args&... args) {
  Message request;
  request.type = MessageType::kRequest;
  request.function = function;
  detail::RRefEncodeScope forks;
  encode_args(request, args...);
  std::shared_ptr<detail::RRefTable> rrefs;
  Future<Message> sent = send(to, std::move(request), timeout, &rrefs);
  forks.watch(sent);
  // Decoding runs on the thread that completes the agent's future (no hop
  // to the pool); the caller's callbacks still run on the pool.
  return sent.then_inline([function, rrefs = std::move(rrefs)](const Future<Message>& response) -> R {
        detail::RRefDecodeScope scope(rrefs);
        return decode_result<R>(response.value(), function);
      });
}

template <typename T, typename... Args>
RRef<T> RpcContext::remote(const WorkerRef& to, const std::string& function,
                           const Args&... args) {
  detail::RRefEncodeScope forks;
  auto [timeout, request] = detail::encode_rref_call(function, args...);
  return RRef<T>(create_remote(to, std::move(request), type_name<T>(), timeout, &forks));
}

template <typename R, typename... Args>
Future<R> RpcContext::rpc_async(const WorkerRef& to, const std::string& function,
                                const Args&... args) {
  if constexpr (sizeof...(Args) > 0) {
    return [&](const auto& first, const auto&... rest) {
      if constexpr (std::is_same_v<std::decay_t<decltype(first)>, CallTimeout>) {
        return call<R>(to, function, first.value, rest...);
      } else {
        return call<R>(to, function, std::nullopt, first, rest...);
      }
    }(args...);
  } else {
    return call<R>(to, function, std::nullopt);
  }
}

template <typename R, typename... Args>
R RpcContext::rpc_sync(const WorkerRef& to, const std::string& function,
                       const Args&... args) {
  Future<R> result = rpc_async<R>(to, function, args...);
  if constexpr (std::is_void_v<R>) {
    result.value();
  } else {
    return result.value();
  }
}

}  // namespace switchboard::rpc
