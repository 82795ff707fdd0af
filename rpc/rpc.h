// The public RPC API: torch.distributed.rpc in C++.
//
//   // every worker
//   rpc::register_function("add", [](int64_t a, int64_t b) { return a + b; });
//   rpc::init_rpc("worker0", "PROCESS_GROUP", rank, world_size);
//   int64_t three = rpc::rpc_sync<int64_t>("worker1", "add", 1, 2);
//   rpc::Future<Tensor> f = rpc::rpc_async<Tensor>("worker1", "scale", t, 2.0);
//   rpc::shutdown();  // graceful: waits for every worker's outstanding work
//
// The free functions act on RpcContext::global(), the process's worker.
// A process may also own further RpcContexts (one worker each; tests run
// several workers as threads of one process this way).
//
// init_rpc(name, backend, rank, world_size, options, store):
//   - `name`: 1 to 128 letters, digits, '_', '-' or ':'; unique in the group
//     (the backend checks that at rendezvous: a duplicate is an error on
//     every worker that has it).
//   - `backend`: a BackendType or a registered name (rpc/backend_registry.h;
//     built-ins PIPE and PROCESS_GROUP); the overload without one uses
//     kDefaultBackend, "PIPE" (PyTorch's default is TensorPipe).
//   - `rank`, `world_size`: -1 and nullopt take them from the environment
//     (env://: RANK/WORLD_SIZE, SLURM, Open MPI; see rpc/rendezvous.h).
//     A world size makes a static group; none (nullopt where the init
//     method knows none either, or kDynamicGroup), a dynamic one: workers
//     join and leave while the others run (PIPE; backends without dynamic
//     groups refuse it). A dynamic worker's rank is its id, unique for the
//     life of the group. One store hosts one kind of group: a static and a
//     dynamic worker meeting in one store is std::invalid_argument naming
//     both kinds.
//   - `options`: from construct_rpc_backend_options(backend, ...); null
//     takes the backend's defaults (rpc_timeout 60 s, init_method env://).
//   - `store`: an explicit rendezvous Store; null resolves
//     options->init_method. In a static group, each init_rpc over the same
//     store gets its own key space (a generation counted in the store), so a
//     long-lived store server may host many runs one after another.
//   Errors: std::invalid_argument (a bad name, rank or option; init_rpc on
//   an initialized context: "init_rpc: worker "w0" is already initialized;
//   call shutdown() first"), RegistryError (unknown backend), and whatever
//   the store and the backend throw (TimeoutError naming the missing ranks,
//   a duplicate worker name). A failed init_rpc leaves the context
//   uninitialized, as before the call.
//
// register_function(name, callable): see rpc/function_registry.h. Allowed
// before init_rpc and at any time after; functions stay registered across
// shutdown() and a later init_rpc. Throws RegistryError for a taken name.
//
// rpc_sync<R>(to, function, [with_timeout(t),] args...) → R
// rpc_async<R>(to, function, [with_timeout(t),] args...) → Future<R>
//   - `to`: a worker name, a WorkerInfo, or a worker id.
//   - the timeout: with_timeout(t) for this call, else options.rpc_timeout;
//     0 means none (as in PyTorch).
//   - Tensors in `args` are not copied: the agent reads their bytes while
//     the call is under way (PIPE may do so from its I/O thread), so the
//     caller must not write to them until the future completes. Likewise a
//     handler must not write to a tensor it returned.
//   - R is what the remote function returns (void by default). A result of
//     another type fails the call with SerializationError naming the
//     function and both types.
//   Thrown synchronously (API misuse or a local problem): Error
//   (kFailedPrecondition) before init_rpc or after shutdown; NotFoundError
//   for an unknown worker; std::invalid_argument for arguments that cannot
//   be encoded (an undefined Tensor). Through the future (rpc_sync throws
//   them):
//     RemoteError      the remote function threw (or is unknown, or the
//                      arguments did not match): its worker, type, message
//     TimeoutError     `rpc to "w1" function "add": timed out after 200 ms`
//     ConnectionError  the worker went away
//     Error(kCancelled) this worker shut down with the call pending
//   Future callbacks (then, add_callback) run on the agent's pool, never on
//   an I/O thread. Dropping a future cancels nothing.
//
// Threads and nesting: handlers run on the agent's pool
// (options.num_worker_threads threads). A handler may call rpc_sync on any
// worker, itself or its caller included: a pool thread that blocks on a
// Future marks itself blocked, and the pool starts another thread when
// every thread is blocked (rpc/thread_pool.h), so nested calls never
// starve the pool. The pool shrinks back once the nested calls finish.
// Handlers that do not want to hold a thread return a Future (async
// handlers, PyTorch's @async_execution).
//
// on_join(callback), on_leave(callback): dynamic groups call them on the
// pool with the worker that joined or left (not for the workers present at
// init_rpc, nor for this worker). Kept across shutdown and re-init; any
// number may be registered. get_worker_infos() lists the members now.
//
// shutdown(graceful = true, timeout): in a dynamic group, graceful is
// leaving: this worker takes the membership token, says goodbye (the
// others fail new calls to it at once), finishes its calls in flight and
// the requests it is handling, and leaves the group's member list. In a
// static group graceful first waits (the agent's join(): a barrier) until
// every worker called shutdown and no worker has calls outstanding, then
// stops this worker; a failing barrier
// (TimeoutError after `timeout`, default options.rpc_timeout) still stops
// this worker and then rethrows. Ungraceful stops at once and fails this
// worker's pending futures with Error(kCancelled). Either way the context is
// uninitialized afterwards and may init_rpc again. On an uninitialized
// context (never initialized, after a failed init_rpc, or already shut down)
// shutdown() returns at once. Shutdown never waits without a bound, except
// for handlers that are running and never return.
//
// Metrics: get_metrics() is torch's get_metrics(): this worker's counters
// now, one key per series (`switchboard_rpc_calls_sent_total{function="add"}`
// → 3); get_metrics_snapshot() is the same as a structure (rpc/metrics.h).
// Both include the store client's counters when the rendezvous store counts
// (TcpStore). Error(kFailedPrecondition) before init_rpc or after shutdown.
// With options->metrics_port (or SWITCHBOARD_METRICS_PORT) set, init_rpc
// also serves them in Prometheus' text format at
// http://ADDRESS:PORT/metrics until shutdown (metrics_port() tells the
// port); init_rpc fails with Error(kUnavailable) when it cannot listen.
// Every metric is listed in docs/operations.md.
//
// Thread safety: every function may be called from any thread. init_rpc
// and shutdown are serialized; calls racing with shutdown either complete
// or fail with Error(kCancelled).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "rpc/backend_registry.h"
#include "rpc/function_registry.h"
#include "rpc/future.h"
#include "rpc/message.h"
#include "rpc/metrics.h"
#include "rpc/remote_error.h"
#include "rpc/serialize.h"

namespace switchboard {
class Store;
}

namespace switchboard::rpc {

// A per-call timeout: rpc_sync<R>(to, "f", with_timeout(2s), args...).
struct CallTimeout {
  std::chrono::milliseconds value;
};
template <typename Rep, typename Period>
CallTimeout with_timeout(std::chrono::duration<Rep, Period> timeout) {
  return {std::chrono::duration_cast<std::chrono::milliseconds>(timeout)};
}

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

  template <typename F>
  void register_function(std::string name, F&& f) {
    functions_->register_function(std::move(name), std::forward<F>(f));
  }
  const FunctionRegistry& functions() const { return *functions_; }

  template <typename R = void, typename... Args>
  Future<R> rpc_async(const WorkerRef& to, const std::string& function,
                      const Args&... args);
  template <typename R = void, typename... Args>
  R rpc_sync(const WorkerRef& to, const std::string& function, const Args&... args);

  // This worker; the named one (NotFoundError naming it); every worker
  // (by id). Error(kFailedPrecondition) before init_rpc.
  WorkerInfo get_worker_info() const;
  WorkerInfo get_worker_info(const std::string& name) const;
  std::vector<WorkerInfo> get_worker_infos() const;
  // Membership callbacks (see the top of this file).
  void on_join(std::function<void(const WorkerInfo&)> callback);
  void on_leave(std::function<void(const WorkerInfo&)> callback);
  // The options init_rpc used (Error(kFailedPrecondition) before init_rpc).
  std::shared_ptr<const RpcBackendOptions> options() const;

  // This worker's metrics (see the top of this file).
  std::map<std::string, double> get_metrics() const;
  RpcMetrics get_metrics_snapshot() const;
  // The port of the Prometheus endpoint; nullopt when it is off.
  // Error(kFailedPrecondition) before init_rpc.
  std::optional<uint16_t> metrics_port() const;

  void shutdown(bool graceful = true,
                std::optional<std::chrono::milliseconds> timeout = std::nullopt);

  // Sends an encoded request (type kRequest, function and payload set);
  // `timeout` nullopt means options.rpc_timeout. What rpc_async uses;
  // throws and fails as described at the top.
  Future<Message> send(const WorkerRef& to, Message request,
                       std::optional<std::chrono::milliseconds> timeout);

 private:
  struct State;
  std::shared_ptr<State> state() const;  // throws when uninitialized

  template <typename R, typename... Args>
  Future<R> call(const WorkerRef& to, const std::string& function,
                 std::optional<std::chrono::milliseconds> timeout, const Args&... args);

  struct Callbacks;

  const std::shared_ptr<FunctionRegistry> functions_;
  const std::shared_ptr<Callbacks> callbacks_;
  std::mutex lifecycle_mu_;  // serializes init_rpc and shutdown
  mutable std::mutex mu_;
  std::shared_ptr<State> state_;  // GUARDED_BY(mu_); null when uninitialized
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

template <typename R = void, typename... Args>
Future<R> rpc_async(const WorkerRef& to, const std::string& function,
                    const Args&... args) {
  return RpcContext::global().rpc_async<R>(to, function, args...);
}

template <typename R = void, typename... Args>
R rpc_sync(const WorkerRef& to, const std::string& function, const Args&... args) {
  return RpcContext::global().rpc_sync<R>(to, function, args...);
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
  encode_args(request, args...);
  // Decoding runs on the thread that completes the agent's future (no hop
  // to the pool); the caller's callbacks still run on the pool.
  return send(to, std::move(request), timeout)
      .then_inline([function](const Future<Message>& response) -> R {
        return decode_result<R>(response.value(), function);
      });
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
