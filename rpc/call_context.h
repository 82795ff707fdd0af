// CallContext: what a registered function can know about the call it is
// serving, while it runs: who called it and under which name.
//
//   rpc::register_function("whoami", [] {
//     const rpc::CallContext* call = rpc::current_call();
//     return call ? call->caller.name : std::string("(not in a call)");
//   });
//
// The deadline travels with the request (the caller's timeout), and calls
// made while serving a call inherit it: a nested rpc_sync/rpc_async waits
// for the time left at most, as gRPC's deadlines do.
//
// current_call() is set on the thread that runs a registered function, for
// as long as the function's own code runs there (an async function's
// synchronous part included, not the code that completes its future
// later). Copy what you need before handing work to another thread. A call
// made from inside a function (a nested call) does not change it.
//
// cancelled() tells a function that its caller stopped waiting: it
// cancelled the call, its deadline passed, or it is gone.
//
// Thread safety: the context belongs to the thread that serves the call.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "core/message.h"

namespace switchboard::rpc {

// Where a served call learns that its own caller cancelled it
// (CallTable implements it).
class CancellationSource {
 public:
  virtual bool request_cancelled(int peer, uint64_t id) const = 0;

 protected:
  ~CancellationSource() = default;
};

struct CallContext {
  WorkerInfo caller;     // the worker that made the call (itself for a self-call)
  std::string function;  // the name it called
  uint64_t id = 0;       // the call's id on the caller's side (Message::id)
  // When the caller stops waiting, by this worker's steady clock: the
  // caller's timeout counted from the request's arrival here (time spent
  // waiting for the pool included). Absent when the call has no timeout.
  // Calls made while serving this one default to the time left, and never
  // wait longer (RpcContext::send()).
  std::optional<std::chrono::steady_clock::time_point> deadline;
  // What cancelled() reads: the caller's epoch when the call arrived, and
  // where its current one is kept (its agent moves it on when the caller
  // is gone). Null: no such signal (a registry called directly).
  const std::atomic<uint32_t>* caller_epoch = nullptr;
  uint32_t epoch_at_arrival = 0;
  // Told when the caller cancels this very call (Future::cancel()); null:
  // no such signal.
  const CancellationSource* table = nullptr;

  // Whether the caller no longer waits for the answer: it cancelled the
  // call (Future::cancel()), its deadline passed, or its connection to this
  // worker was lost (it died, left, was evicted or was cut off). A long
  // function may check it and stop early; its answer would not be read.
  // Cheap: a clock read and two atomic loads (a lock only while some call
  // of this worker is cancelled and not yet over).
  bool cancelled() const {
    if (deadline && std::chrono::steady_clock::now() >= *deadline) return true;
    if (caller_epoch != nullptr &&
        caller_epoch->load(std::memory_order_relaxed) != epoch_at_arrival) {
      return true;
    }
    return table != nullptr && table->request_cancelled(caller.id, id);
  }
};

// A per-call timeout: rpc_sync<R>(to, "f", with_timeout(2s), args...)
// (also for RRef calls: rref.rpc_sync<R>("f", with_timeout(2s), args...)).
struct CallTimeout {
  std::chrono::milliseconds value;
};
template <typename Rep, typename Period>
CallTimeout with_timeout(std::chrono::duration<Rep, Period> timeout) {
  return {std::chrono::duration_cast<std::chrono::milliseconds>(timeout)};
}

// The call this thread is serving now; null outside a registered function.
const CallContext* current_call();

// A server interceptor (gRPC's term): it sees every call this worker serves,
// on the pool thread, before the function runs, with the call's context.
// It returns "" to let the call run, or a reason to refuse it: the caller
// then gets a RemoteError with code PermissionDenied, saying `worker "w0"
// refused function "f" from "w9": <reason>`, and the function does not
// run. What it throws refuses the call the same way, with the exception's
// message. Interceptors run in the order they were added; the first that
// refuses ends the call. They must be thread-safe (calls are served
// concurrently), and may record what they see (timings, counts).
using ServerInterceptor = std::function<std::string(const CallContext&)>;

// An interceptor that lets only workers whose name fully matches the
// ECMAScript regular expression `callers` call `function`; other
// functions pass. std::invalid_argument for a bad expression.
//   context.add_server_interceptor(rpc::allow_callers("apply_update", "ps|trainer-[0-9]+"));
ServerInterceptor allow_callers(std::string function, const std::string& callers);

// What a client interceptor sees of a call this worker is about to make.
struct ClientCall {
  WorkerInfo to;          // the worker called
  std::string function;   // the function called
  // How long the call will wait (0: no limit): its timeout, or the time
  // left of the call being served when that is shorter (the deadline rule).
  std::chrono::milliseconds timeout{0};
  size_t payload_bytes = 0;  // the encoded arguments, tensors' bytes apart
  size_t tensors = 0;        // how many tensors travel with it

  // Runs `done` once the call completes, with its error (null when it
  // succeeded), on the thread that completes it, before the caller's
  // future completes; also when a later interceptor refuses the call.
  // Keep it short and non-blocking (record a timing, count an error).
  // What it throws is dropped.
  void on_done(std::function<void(std::exception_ptr)> done) {
    done_callbacks.push_back(std::move(done));
  }
  std::vector<std::function<void(std::exception_ptr)>> done_callbacks;
};

// A client interceptor (gRPC's term): it sees every call this worker
// makes (rpc_sync, rpc_async and RpcContext::send, nested calls included)
// on the calling thread, before the request is sent. It returns "" to let
// the call go, or a reason to refuse it: the call is not sent, and its
// future fails with Error(kPermissionDenied) saying `rpc to "w1" function
// "f": refused by this worker's client interceptor: <reason>`. What it
// throws refuses the call the same way, with the exception's message.
// Interceptors run in the order they were added; the first that refuses
// ends the call. They must be thread-safe (calls are made from many
// threads at once). With none added, a call costs one atomic load more.
using ClientInterceptor = std::function<std::string(ClientCall&)>;

// Sets current_call() for its scope (the function registry uses it; a
// backend that dispatches requests itself may too). Nests: the previous
// context is restored on destruction.
class ScopedCallContext {
 public:
  explicit ScopedCallContext(const CallContext* context);
  ~ScopedCallContext();
  ScopedCallContext(const ScopedCallContext&) = delete;
  ScopedCallContext& operator=(const ScopedCallContext&) = delete;

 private:
  const CallContext* previous_;
};

}  // namespace switchboard::rpc
