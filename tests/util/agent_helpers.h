// Helpers for tests that drive an rpc::RpcAgent directly (rpc/agent.h), one
// agent per rank on threads of the test process: request messages, echo
// handlers, bounded waits on the futures send() returns, and join().
//
//   agents[0]->start(echo_handler());
//   agents[1]->start(blocking_handler(gate));
//   Message got = get(agents[0]->send(agents[0]->worker("w1"),
//                                     request("echo", "hi"), kGuard), kGuard);
//   CHECK(failure_of(agents[0]->send(...), kGuard).kind == "TimeoutError");
//   join_all(agents, kGuard);
//
// get() and failure_of() assert with Catch2 (REQUIRE), so they belong on the
// test's own thread, not in a handler or a thread of on_threads().
//
// Thread safety: the free functions may be called from any thread (but see
// above); the handlers they return may run on any number of threads at once.
#pragma once

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "common/error.h"
#include "rpc/agent.h"
#include "rpc/future.h"
#include "core/message.h"
#include "tests/util/threads.h"

namespace switchboard::testing {

// The bytes of `text`, for a message payload.
inline std::vector<uint8_t> bytes(std::string_view text) { return {text.begin(), text.end()}; }

// A payload read back as text (the inverse of bytes()).
inline std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

// A kRequest message for `function`, carrying `payload` (as bytes) and
// `tensors`; id 0, for the agent to assign.
inline rpc::Message request(std::string function, std::string_view payload,
                            std::vector<Tensor> tensors = {}) {
  rpc::Message m;
  m.type = rpc::MessageType::kRequest;
  m.function = std::move(function);
  m.payload = bytes(payload);
  m.tensors = std::move(tensors);
  return m;
}

// The kResponse that echoes `request`: its payload and tensors (the tensors
// share storage with the request's). No function: responses name none.
inline rpc::Message echo_of(const rpc::Message& request) {
  rpc::Message response;
  response.type = rpc::MessageType::kResponse;
  response.payload = request.payload;
  response.tensors = request.tensors;
  return response;
}

// A handler that answers every request at once with echo_of(request).
inline rpc::RpcAgent::RequestHandler echo_handler() {
  return [](rpc::Message request, const rpc::WorkerInfo&) {
    return rpc::Future<rpc::Message>::ready(echo_of(request));
  };
}

// Echoes like echo_handler(), except that a request for the function "block"
// first passes `gate` (Gate::pass(): counted, then held until the test opens
// the gate or the gate's guard runs out; the echo follows either way). The
// handler shares ownership of `gate`.
inline rpc::RpcAgent::RequestHandler blocking_handler(std::shared_ptr<Gate> gate) {
  return [gate](rpc::Message request, const rpc::WorkerInfo&) {
    if (request.function == "block") gate->pass();
    return rpc::Future<rpc::Message>::ready(echo_of(request));
  };
}

// Waits up to `guard` for `f` and returns its value. Fails the test
// (REQUIRE) when `f` is still pending after `guard`; throws what `f` failed
// with, as Future::value() does.
inline rpc::Message get(const rpc::Future<rpc::Message>& f, std::chrono::milliseconds guard) {
  REQUIRE(f.wait_for(guard));
  return f.value();
}

// What a future failed with: the kind of its error, its message and, for a
// switchboard::Error, its code.
struct Failure {
  // "none" (it succeeded), "TimeoutError", "ConnectionError",
  // "NotFoundError", "Error" (any other switchboard::Error),
  // "invalid_argument", "other" (any other std::exception).
  std::string kind;
  std::string message;
  // The Error's code; kInternal for the kinds that are not an Error.
  ErrorCode code = ErrorCode::kInternal;
};

// Waits up to `guard` for `f` and classifies how it ended (see Failure).
// Fails the test (REQUIRE) when `f` is still pending after `guard`; an error
// that is no std::exception propagates.
inline Failure failure_of(const rpc::Future<rpc::Message>& f, std::chrono::milliseconds guard) {
  REQUIRE(f.wait_for(guard));
  try {
    (void)f.value();
    return {"none", ""};
  } catch (const TimeoutError& e) {
    return {"TimeoutError", e.what(), e.code()};
  } catch (const ConnectionError& e) {
    return {"ConnectionError", e.what(), e.code()};
  } catch (const NotFoundError& e) {
    return {"NotFoundError", e.what(), e.code()};
  } catch (const Error& e) {
    return {"Error", e.what(), e.code()};
  } catch (const std::invalid_argument& e) {
    return {"invalid_argument", e.what()};
  } catch (const std::exception& e) {
    return {"other", e.what()};
  }
}

// The message of what `body` throws as E. Fails the test (FAIL) when it
// throws something else or nothing.
template <typename E>
std::string what_thrown(const std::function<void()>& body) {
  try {
    body();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("threw the wrong exception: " << e.what());
  }
  FAIL("did not throw");
  return "";
}

// Calls join(timeout) on every agent at once, one thread each (join() is a
// barrier of the group, so the agents must join together), and rethrows the
// first failure (lowest rank first; see rethrow_first()) once all returned.
// `Agent` is an RpcAgent or a subclass; no element may be null.
template <typename Agent>
void join_all(std::vector<std::unique_ptr<Agent>>& agents, std::chrono::milliseconds timeout) {
  rethrow_first(on_threads(static_cast<int>(agents.size()),
                           [&](int rank) { agents[rank]->join(timeout); }));
}

}  // namespace switchboard::testing
