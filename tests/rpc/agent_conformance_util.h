// Helpers shared by the RpcAgent conformance suite's source files: the
// factory's groups, sends bounded by kGuard, and tensors to compare.
// Internal to //tests/rpc:agent_conformance.
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "common/error.h"
#include "rpc/future.h"
#include "core/message.h"
#include "core/remote_error.h"
#include "rpc/thread_pool.h"
#include "store/hash_store.h"
#include "tests/rpc/agent_conformance.h"
#include "tests/util/agent_helpers.h"
#include "tests/util/threads.h"

namespace switchboard::agent_conformance::suite {

using namespace std::chrono_literals;
using agent_conformance::agent_factory;
using agent_conformance::AgentSpec;
using agent_conformance::Limitation;
using rpc::Future;
using rpc::Message;
using rpc::MessageType;
using rpc::Promise;
using rpc::RpcAgent;
using rpc::WorkerInfo;
using switchboard::testing::blocking_handler;
using switchboard::testing::bytes;
using switchboard::testing::echo_handler;
using switchboard::testing::echo_of;
using switchboard::testing::Failure;
using switchboard::testing::Gate;
using switchboard::testing::on_threads;
using switchboard::testing::request;
using switchboard::testing::rethrow_first;
using switchboard::testing::text;
using switchboard::testing::what_thrown;

// Bounds every wait for something that must happen.
constexpr std::chrono::milliseconds kGuard = 60s;

using Agents = std::vector<std::unique_ptr<RpcAgent>>;

// ------------------------------------------------------------------ skipping

// True (after printing "skipped: <reason>") when `reason` is set.
inline bool skipped(const std::optional<std::string>& reason) {
  if (!reason) return false;
  WARN("skipped: " << *reason);
  fmt::print("skipped: {}\n", *reason);
  return true;
}

inline bool skipped_for(Limitation what) { return skipped(agent_factory().limitation(what)); }

// Skips a case that needs groups of `n` workers where the backend makes
// smaller ones.
inline bool skipped_unless_workers(int n) {
  const int most = agent_factory().max_world_size();
  if (n <= most) return false;
  return skipped(fmt::format("the {} backend makes groups of at most {} workers; this "
                             "case needs {}",
                             agent_factory().name(), most, n));
}

// ------------------------------------------------------------------ groups

inline AgentSpec spec(std::shared_ptr<Store> store, std::string name, int rank, int world_size,
               std::chrono::milliseconds rendezvous_timeout = kGuard) {
  return AgentSpec{std::move(store), std::move(name), rank, world_size, rendezvous_timeout};
}

// One agent per name (rank = index) of a fresh group, constructed
// concurrently; rethrows the first failure.
inline Agents make_group(const std::vector<std::string>& names,
                  std::shared_ptr<Store> store = std::make_shared<HashStore>()) {
  const int n = static_cast<int>(names.size());
  Agents agents(n);
  rethrow_first(on_threads(n, [&](int rank) {
    agents[rank] = agent_factory().make_agent(spec(store, names[rank], rank, n));
  }));
  return agents;
}

// w0 and w1, started: w0 echoes; w1 echoes too, but holds each request for
// the function "block" at `latch` first (blocking_handler()).
inline Agents make_pair_held_at(const std::shared_ptr<Gate>& latch) {
  Agents agents = make_group({"w0", "w1"});
  agents[0]->start(echo_handler());
  agents[1]->start(blocking_handler(latch));
  return agents;
}

// ------------------------------------------------------------------ calls

// send(), which must not throw: its errors travel in the future.
inline Future<Message> send(RpcAgent& from, const WorkerInfo& to, Message m,
                     std::chrono::milliseconds timeout) {
  try {
    return from.send(to, std::move(m), timeout);
  } catch (const std::exception& e) {
    FAIL("send() threw instead of failing its future: " << e.what());
  }
  return Future<Message>();
}

// send() to the worker named `to`.
inline Future<Message> send(RpcAgent& from, const std::string& to, Message m,
                     std::chrono::milliseconds timeout = kGuard) {
  return send(from, from.worker(to), std::move(m), timeout);
}

inline Message get(const Future<Message>& f) { return switchboard::testing::get(f, kGuard); }

inline Failure failure_of(const Future<Message>& f) {
  return switchboard::testing::failure_of(f, kGuard);
}

inline void join_all(Agents& agents, std::chrono::milliseconds timeout = kGuard) {
  switchboard::testing::join_all(agents, timeout);
}

// Echoes like echo_handler(), with the request's function before its
// payload ("f: payload"), so that the caller sees which function arrived.
inline RpcAgent::RequestHandler function_echo_handler() {
  return [](Message request, const WorkerInfo&) {
    Message response = echo_of(request);
    response.payload = bytes(request.function + ": " + text(request.payload));
    return Future<Message>::ready(response);
  };
}

// ------------------------------------------------------------------ tensors

// A tensor whose bytes follow a pattern seeded by `seed` (bool: 0 or 1).
inline Tensor patterned(const Tensor::Shape& shape, DType dtype, int seed) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* p = static_cast<uint8_t*>(t.data());
  for (size_t i = 0; i < t.nbytes(); ++i) {
    p[i] = static_cast<uint8_t>(dtype == DType::kBool ? (i + seed) % 2 : i * 131 + seed);
  }
  return t;
}

// Same dtype, shape and bytes, both contiguous (a byte compare: NaN
// patterns are fine).
inline bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.dtype() == b.dtype() && a.shape() == b.shape() &&
         a.is_contiguous() && b.is_contiguous() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

}  // namespace switchboard::agent_conformance::suite
