// FunctionRegistry: the functions a worker serves over RPC, by name.
//
//   FunctionRegistry registry("w1");
//   registry.register_function("add", [](int64_t a, double b) { return a + b; });
//   Future<Message> response = registry.call(request, from);
//
// register_function deduces the argument and result types from the callable
// (a lambda, a function pointer or a std::function; arguments by value, by
// const& or by &&, never by non-const &), and call() decodes the request's
// arguments as those types (core/serialize.h), runs the function and encodes
// its result. A function may return Future<R> (PyTorch's @async_execution):
// the response then completes when that future does, with its value or its
// error, and no thread waits for it.
//
// call() never throws for a bad request and its future never fails: every
// failure becomes an error response (MessageType::kError, payload
// encode_remote_error() naming this worker), which the caller rethrows as
// a RemoteError:
//   unknown function     switchboard::NotFoundError
//                          worker "w1" has no function "foo"
//   wrong arity or types switchboard::rpc::ArgumentError
//                          function "add" expects (int64, float64), received (int64, str)
//   malformed payload    switchboard::rpc::SerializationError
//   the function threw   the exception's own type and what()
//
// Thread safety: thread-safe. Functions may be registered while calls run;
// a registered function is called concurrently from whatever threads call
// call() (the agent's pool), so it must be thread-safe itself. No lock is
// held while a function runs.
#pragma once

#include <exception>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "rpc/call_context.h"

#include "common/check.h"
#include "common/mutex.h"
#include "rpc/future.h"
#include "core/message.h"
#include "core/serialize.h"

namespace switchboard::rpc {

class FunctionRegistry {
 public:
  // `worker_name` names this worker in error responses.
  explicit FunctionRegistry(std::string worker_name);
  FunctionRegistry(const FunctionRegistry&) = delete;
  FunctionRegistry& operator=(const FunctionRegistry&) = delete;

  // Registers `f` under `name`; the registry keeps a copy (or the moved
  // callable) until it is destroyed. Throws RegistryError naming the
  // function and the worker when `name` is taken, std::invalid_argument
  // when it is empty.
  template <typename F>
  void register_function(std::string name, F&& f);

  // Registers `f` as register_function() does, to run on the thread that
  // receives its request (the agent's I/O thread, or the same-host lane's
  // reader) instead of the pool: one thread hand-off less per call. Only
  // for short functions that never block (no sleeping, no locks held long,
  // no rpc_sync, no waiting on futures): while one runs, that thread reads
  // nothing else, so every call on its connection waits. A function that
  // returns a Future is fine when it returns at once.
  template <typename F>
  void register_inline_function(std::string name, F&& f) SB_EXCLUDES(mutex_);
  // Whether `name` was registered inline.
  bool runs_inline(std::string_view name) const SB_EXCLUDES(mutex_);

  // The backend kit's server side: a function that takes its request as it
  // came (payload and tensors undecoded) and answers with a response of its
  // own making, for adapters that carry another framework's messages over
  // Switchboard (a torch RpcAgent whose payloads are pickles). The caller
  // sends with RpcContext::send() and gets the response's payload and
  // tensors as they were. The function runs like any other: on the pool,
  // in the call's context (current_call(): caller, deadline, cancellation),
  // behind the interceptors; it may return a pending Future. The registry
  // makes its result the response (type kResponse, the request's id, no
  // function); when it throws or its future fails, the caller gets a kError
  // response instead (decode_remote_error: core/remote_error.h). Throws as
  // register_function().
  using RawFunction = std::function<Future<Message>(const Message& request)>;
  void register_raw_function(std::string name, RawFunction f) SB_EXCLUDES(mutex_);

  // Adds an interceptor every later call passes first (rpc/call_context.h).
  void add_interceptor(ServerInterceptor interceptor) SB_EXCLUDES(mutex_);

  bool has_function(std::string_view name) const SB_EXCLUDES(mutex_);
  // The registered names, sorted.
  std::vector<std::string> functions() const SB_EXCLUDES(mutex_);
  std::string worker_name() const SB_EXCLUDES(mutex_);
  // Renames this worker in later error responses (an RpcContext keeps its
  // functions across shutdown and a new init_rpc under another name).
  void set_worker_name(std::string worker_name) SB_EXCLUDES(mutex_);

  // Serves `request` (type kRequest; request.function names the function)
  // from `from`, which the function sees as current_call()
  // (rpc/call_context.h) while it runs.
  // Synchronous functions run inline, on the calling thread, and the
  // returned future is already complete. An async function's response
  // completes on the thread that completes its future (or that future's
  // executor). The response has type kResponse (payload: encode_result) or
  // kError (payload: encode_remote_error) and the request's id. Dropping the
  // returned future cancels nothing.
  Future<Message> call(const Message& request, const WorkerInfo& from) const
      SB_EXCLUDES(mutex_);

 private:
  // Decodes a request's arguments, runs the function, returns the response;
  // may throw (call() turns the exception into an error response).
  using Handler =
      std::function<Future<Message>(const Message& request, const std::string& worker)>;

  void add(std::string name, Handler handler) SB_EXCLUDES(mutex_);

  mutable Mutex mutex_;
  std::string worker_name_ SB_GUARDED_BY(mutex_);
  std::map<std::string, std::shared_ptr<const Handler>, std::less<>> handlers_
      SB_GUARDED_BY(mutex_);
  std::set<std::string, std::less<>> inline_ SB_GUARDED_BY(mutex_);
  // Copied on change, so that a call reads them without the lock.
  std::shared_ptr<const std::vector<ServerInterceptor>> interceptors_ SB_GUARDED_BY(mutex_) =
      std::make_shared<const std::vector<ServerInterceptor>>();
};

// ---------------------------------------------------------------------------
// Implementation.

namespace detail {

// Argument and result types of a callable with exactly one signature
// (kDeducible is false for generic lambdas and overloaded functors).
template <typename F, typename = void>
struct CallableTraits {
  static constexpr bool kDeducible = false;
};
template <typename F>
struct CallableTraits<F, std::void_t<decltype(&F::operator())>>
    : CallableTraits<decltype(&F::operator())> {};
template <typename R, typename... A>
struct CallableTraits<R(A...)> {
  static constexpr bool kDeducible = true;
  using Result = R;
  using Args = std::tuple<A...>;
};
template <typename R, typename... A>
struct CallableTraits<R (*)(A...)> : CallableTraits<R(A...)> {};
template <typename R, typename... A>
struct CallableTraits<R (*)(A...) noexcept> : CallableTraits<R(A...)> {};
template <typename C, typename R, typename... A>
struct CallableTraits<R (C::*)(A...)> : CallableTraits<R(A...)> {};
template <typename C, typename R, typename... A>
struct CallableTraits<R (C::*)(A...) const> : CallableTraits<R(A...)> {};
template <typename C, typename R, typename... A>
struct CallableTraits<R (C::*)(A...) noexcept> : CallableTraits<R(A...)> {};
template <typename C, typename R, typename... A>
struct CallableTraits<R (C::*)(A...) const noexcept> : CallableTraits<R(A...)> {};

template <typename T>
struct FutureTraits : std::false_type {};
template <typename T>
struct FutureTraits<Future<T>> : std::true_type {
  using Value = T;
};

// Checks a parameter type can be decoded into; the decoded values are
// stored in a tuple of these types.
template <typename A>
constexpr bool check_parameter() {
  using V = std::remove_cvref_t<A>;
  static_assert(
      !std::is_lvalue_reference_v<A> || std::is_const_v<std::remove_reference_t<A>>,
      "registered functions take arguments by value, const& or &&, "
      "not by non-const reference");
  static_assert(!std::is_pointer_v<V> && !std::is_same_v<V, std::string_view>,
                "registered functions take owning argument types (std::string, not "
                "std::string_view or const char*)");
  static_assert(std::is_default_constructible_v<V>,
                "argument types must be default-constructible (msgpack decodes into "
                "them)");
  return true;
}

template <typename Tuple>
struct DecodedArgs;
template <typename... A>
struct DecodedArgs<std::tuple<A...>> {
  static constexpr bool kOk = (check_parameter<A>() && ...);
  using Type = std::tuple<std::remove_cvref_t<A>...>;
};

Message make_response(uint64_t id);
Message make_error_response(uint64_t id, std::string_view worker,
                            std::exception_ptr error);

// What a request's function waits for before it runs: while its arguments
// are decoded on this thread, the RRef layer adds here the owner's
// confirmation of each RRef among them that its owner has not yet counted
// (torch runs a function only once every RRef among its arguments is
// confirmed). A scope: the innermost one on a thread collects; scopes nest.
class ArgumentWaits {
 public:
  ArgumentWaits();
  ~ArgumentWaits();
  ArgumentWaits(const ArgumentWaits&) = delete;
  ArgumentWaits& operator=(const ArgumentWaits&) = delete;

  // Adds `pending` to this thread's innermost scope (none: ignored). What
  // waits for it runs on `executor`.
  static void add(Future<void> pending, std::shared_ptr<Executor> executor);
  // Completes once everything added did, or fails with the first failure;
  // invalid when nothing was added.
  Future<void> all() const;

 private:
  std::vector<Future<void>> pending_;
  std::shared_ptr<Executor> executor_;
  ArgumentWaits* previous_;
};

// The response for a completed result (value or error) of an async function.
template <typename V>
Message response_from(uint64_t id, const std::string& worker, const Future<V>& done) {
  try {
    Message response = make_response(id);
    if constexpr (std::is_void_v<V>) {
      done.value();
      encode_result(response);
    } else {
      encode_result(response, done.value());
    }
    return response;
  } catch (...) {
    return make_error_response(id, worker, std::current_exception());
  }
}

}  // namespace detail

template <typename F>
void FunctionRegistry::register_function(std::string name, F&& f) {
  using Fn = std::decay_t<F>;
  using Traits = detail::CallableTraits<Fn>;
  static_assert(Traits::kDeducible,
                "register_function needs a callable with one signature (a lambda with "
                "typed parameters, a function pointer or a std::function), not a "
                "generic lambda or an overloaded functor");
  using R = typename Traits::Result;
  using Decoded = detail::DecodedArgs<typename Traits::Args>;
  static_assert(Decoded::kOk);
  using Args = typename Decoded::Type;

  auto fn = std::make_shared<Fn>(std::forward<F>(f));
  Handler handler = [fn, name](const Message& request,
                               const std::string& worker) -> Future<Message> {
    const uint64_t id = request.id;
    auto run = [fn, name, id, worker](Args args) -> Future<Message> {
      if constexpr (detail::FutureTraits<R>::value) {
        using V = typename detail::FutureTraits<R>::Value;
        R future = std::apply(*fn, std::move(args));
        SB_REQUIRE(future.valid(), "function \"{}\" returned an invalid Future", name);
        return future.then([id, worker](const Future<V>& done) {
          return detail::response_from<V>(id, worker, done);
        });
      } else {
        Message response = detail::make_response(id);
        if constexpr (std::is_void_v<R>) {
          std::apply(*fn, std::move(args));
          encode_result(response);
        } else {
          encode_result(response, std::apply(*fn, std::move(args)));
        }
        return Future<Message>::ready(std::move(response));
      }
    };
    std::optional<Args> decoded;
    Future<void> confirmed;
    {
      detail::ArgumentWaits waits;
      decoded.emplace(decode_args<Args>(request, name));
      confirmed = waits.all();
    }
    if (!confirmed.valid()) return run(std::move(*decoded));
    // RRefs among the arguments that their owners have not yet counted:
    // the function runs once they have, in this call's context.
    auto args = std::make_shared<Args>(std::move(*decoded));
    std::optional<CallContext> context;
    if (const CallContext* serving = current_call()) context = *serving;
    return confirmed.then([run, args, context, id, worker](
                              const Future<void>& done) -> Future<Message> {
      try {
        done.value();
        if (!context) return run(std::move(*args));
        ScopedCallContext scope(&*context);
        return run(std::move(*args));
      } catch (...) {
        return Future<Message>::ready(
            detail::make_error_response(id, worker, std::current_exception()));
      }
    });
  };
  add(std::move(name), std::move(handler));
}

template <typename F>
void FunctionRegistry::register_inline_function(std::string name, F&& f) {
  const std::string key = name;
  register_function(std::move(name), std::forward<F>(f));
  MutexLock lock(mutex_);
  inline_.insert(key);
}

}  // namespace switchboard::rpc
