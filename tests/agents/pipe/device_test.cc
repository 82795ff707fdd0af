// PIPE device maps: validation at init on every worker, and CUDA tensors
// at call time in a binary without a CUDA runtime (pipe_cuda_test.cc covers
// the path with one). Workers are RpcContexts on threads over one
// HashStore, on 127.0.0.1.
#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agents/builtin_backends.h"
#include "agents/pipe/agent.h"
#include "common/error.h"
#include "core/tensor.h"
#include "rpc/rpc.h"
#include "store/hash_store.h"
#include "tests/util/threads.h"

using namespace switchboard;
using namespace std::chrono_literals;
using agents::pipe::PipeAgent;
using agents::pipe::PipeAgentOptions;
using rpc::Future;
using rpc::RpcContext;
using rpc::with_timeout;
using switchboard::testing::on_threads;
using switchboard::testing::rethrow_first;
#include "tests/agents/pipe/test_util.h"

using namespace switchboard::pipe_test;

// ---- 1. device maps at init ---------------------------------------------------

TEST_CASE("a device map with an invalid target index fails init on every worker",
          "[pipe][device_map]") {
  auto store = std::make_shared<HashStore>();
  std::vector<std::unique_ptr<RpcContext>> contexts;
  for (int rank = 0; rank < 2; ++rank) contexts.push_back(std::make_unique<RpcContext>());
  const auto errors = on_threads(2, [&](int rank) {
    auto options = pipe_options({{"device_count", "1"}});
    if (rank == 0) typed(options).set_device_map("w1", {{"cuda:0", "cuda:1"}});
    contexts[rank]->init_rpc(worker_name(rank), "PIPE", rank, 2, options, store);
  });
  for (int rank = 0; rank < 2; ++rank) {
    INFO("w" << rank);
    REQUIRE(errors[rank] != nullptr);
    std::string message;
    CHECK(kind_of(errors[rank], message) == "invalid_argument");
    INFO(message);
    CHECK_THAT(message, Catch::Contains("\"w0\""));
    CHECK_THAT(message, Catch::Contains("{cuda:0: cuda:1}"));
    CHECK_THAT(message, Catch::Contains("target devices with invalid indices"));
    CHECK_FALSE(contexts[rank]->initialized());
  }
}

TEST_CASE("a valid device map initializes and gives the target its reverse map",
          "[pipe][device_map]") {
  auto store = std::make_shared<HashStore>();
  std::vector<std::unique_ptr<rpc::RpcAgent>> agents(2);
  rethrow_first(on_threads(2, [&](int rank) {
    auto options = pipe_options({{"device_count", "1"}});
    if (rank == 0) typed(options).set_device_map("w1", {{"cuda:0", "cuda:0"}});
    rpc::BackendInit init;
    init.store = store;
    init.name = worker_name(rank);
    init.rank = rank;
    init.world_size = 2;
    init.options = options;
    agents[rank] = rpc::init_backend(rpc::backend_type("PIPE"), init);
  }));
  auto& w0 = dynamic_cast<PipeAgent&>(*agents[0]);
  auto& w1 = dynamic_cast<PipeAgent&>(*agents[1]);
  const rpc::DeviceMaps expected{{"w0", {{Device::cuda(0), Device::cuda(0)}}}};
  CHECK(w1.reverse_device_maps() == expected);
  CHECK(w0.reverse_device_maps().empty());
  CHECK(w0.devices() == std::vector<Device>{Device::cuda(0)});
  CHECK(w1.devices() == std::vector<Device>{Device::cuda(0)});
  for (auto& agent : agents) agent->shutdown();
}

TEST_CASE("set_device_map refuses a map that is not 1-to-1, naming both sources",
          "[pipe][device_map]") {
  auto options = pipe_options();
  try {
    typed(options).set_device_map("w1", {{"cuda:0", "cuda:1"}, {"cuda:1", "cuda:1"}});
    FAIL("set_device_map accepted two sources for cuda:1");
  } catch (const std::invalid_argument& e) {
    const std::string message = e.what();
    INFO(message);
    CHECK_THAT(message, Catch::Contains("\"w1\""));
    CHECK_THAT(message, Catch::Contains("cuda:0"));
    CHECK_THAT(message, Catch::Contains("cuda:1 both map to cuda:1"));
  }
  CHECK(typed(options).device_maps.empty());
}

// ---- 2. CUDA tensors at call time ---------------------------------------------

namespace {

// Two RpcContexts "w0", "w1" with device_count 1 each; `map_w0_to_w1`
// gives w0 the map {cuda:0: cuda:0} to w1. Both serve "echo", "add" and
// "make_cuda" (returns a CUDA tensor).
struct CudaPair {
  explicit CudaPair(bool map_w0_to_w1) {
    auto store = std::make_shared<HashStore>();
    for (int rank = 0; rank < 2; ++rank) {
      contexts.push_back(std::make_unique<RpcContext>());
      contexts[rank]->register_function("echo", [](Tensor t) { return t; });
      contexts[rank]->register_function("add", [](int64_t a, int64_t b) { return a + b; });
      contexts[rank]->register_function("make_cuda", [] { return fake_cuda_tensor(); });
    }
    rethrow_first(on_threads(2, [&](int rank) {
      auto options = pipe_options({{"device_count", "1"}});
      if (rank == 0 && map_w0_to_w1) typed(options).set_device_map("w1", {{"cuda:0", "cuda:0"}});
      contexts[rank]->init_rpc(worker_name(rank), "PIPE", rank, 2, options, store);
    }));
  }
  ~CudaPair() {
    on_threads(2, [&](int rank) { contexts[rank]->shutdown(true, kGuard); });
  }
  RpcContext& operator[](int rank) { return *contexts[rank]; }

  std::vector<std::unique_ptr<RpcContext>> contexts;
};

// rpc_async of "echo" with a CUDA tensor; records whether it threw instead
// of failing the future.
Outcome echo_cuda(RpcContext& from, const std::string& to,
                  std::chrono::milliseconds timeout = kGuard) {
  std::optional<Future<Tensor>> call;
  try {
    call = from.rpc_async<Tensor>(to, "echo", with_timeout(timeout), fake_cuda_tensor());
  } catch (...) {
    Outcome thrown;
    thrown.kind = "thrown " + kind_of(std::current_exception(), thrown.message);
    return thrown;
  }
  return outcome_of(*call);
}

}  // namespace

TEST_CASE(
    "a CUDA tensor to a worker without a device map fails the call naming the worker and "
    "the device, and the agent keeps working",
    "[pipe][device_map][cuda]") {
  CudaPair pair(/*map_w0_to_w1=*/false);
  // rpc_async encodes the tensor as is; the agent's send() refuses it
  // through the future (send never throws).
  const Outcome outcome = echo_cuda(pair[0], "w1");
  INFO(outcome.kind << ": " << outcome.message);
  CHECK(outcome.kind == "invalid_argument");
  CHECK_THAT(outcome.message, Catch::Contains("\"w1\""));
  CHECK_THAT(outcome.message, Catch::Contains("cuda:0"));
  CHECK_THAT(outcome.message, Catch::Contains("set_device_map"));
  // A reply holding a CUDA tensor has no reverse map to travel by.
  const Outcome reply = outcome_of(pair[0].rpc_async<Tensor>("w1", "make_cuda"));
  INFO("reply: " << reply.kind << ": " << reply.message);
  CHECK(reply.kind == "RemoteError");
  CHECK_THAT(reply.message, Catch::Contains("cuda:0"));
  CHECK_THAT(reply.message, Catch::Contains("\"w0\""));
  CHECK(pair[0].rpc_sync<int64_t>("w1", "add", int64_t{20}, int64_t{22}) == 42);
  CHECK(pair[1].rpc_sync<int64_t>("w0", "add", int64_t{1}, int64_t{2}) == 3);
}

TEST_CASE(
    "without a CUDA runtime linked, a mapped CUDA tensor is refused naming the worker and "
    "the missing target, and the agent keeps working",
    "[pipe][device_map][cuda]") {
  CudaPair pair(/*map_w0_to_w1=*/true);
  const Outcome outcome = echo_cuda(pair[0], "w1");
  INFO(outcome.kind << ": " << outcome.message);
  CHECK(outcome.kind == "invalid_argument");
  CHECK_THAT(outcome.message, Catch::Contains("\"w1\""));
  CHECK_THAT(outcome.message, Catch::Contains("cannot be staged"));
  CHECK_THAT(outcome.message, Catch::Contains("link //core:cuda_allocator"));
  // The reply path: w1's reverse map sends cuda:0 back to w0's cuda:0,
  // which this binary cannot stage either (tests/agents/pipe/cuda_test.cc
  // covers the path with a CUDA runtime).
  const Outcome reply = outcome_of(pair[0].rpc_async<Tensor>("w1", "make_cuda"));
  INFO("reply: " << reply.kind << ": " << reply.message);
  CHECK(reply.kind == "RemoteError");
  CHECK_THAT(reply.message, Catch::Contains("\"w0\""));
  CHECK_THAT(reply.message, Catch::Contains("link //core:cuda_allocator"));
  CHECK(pair[0].rpc_sync<int64_t>("w1", "add", int64_t{20}, int64_t{22}) == 42);
}

// Regression: send() registered a self-send as pending before copying its
// tensors; a copy that threw (a CUDA tensor) failed the future but left
// the entry behind, so join() (graceful shutdown) waited for a call that
// could never complete.
TEST_CASE("a self-send of a CUDA tensor fails and leaves nothing pending for join",
          "[pipe][device_map][cuda][join]") {
  CudaPair pair(/*map_w0_to_w1=*/false);
  const Outcome outcome = echo_cuda(pair[0], "w0", /*timeout=*/0ms);
  INFO(outcome.kind << ": " << outcome.message);
  CHECK(outcome.kind == "invalid_argument");
  CHECK_THAT(outcome.message, Catch::Contains("cuda:0"));
  CHECK(pair[0].rpc_sync<int64_t>("w0", "add", int64_t{1}, int64_t{1}) == 2);
  // The reply of a self-send holding a CUDA tensor: its copy threw on the
  // pool, so the call never completed and the handler was never counted
  // out (join waited forever).
  const Outcome reply =
      outcome_of(pair[0].rpc_async<Tensor>("w0", "make_cuda", with_timeout(0ms)));
  INFO("reply: " << reply.kind << ": " << reply.message);
  CHECK(reply.kind == "RemoteError");
  CHECK_THAT(reply.message, Catch::Contains("cuda:0"));
  const auto errors =
      on_threads(2, [&](int rank) { pair[rank].shutdown(true, 20s); });
  for (const auto& error : errors) {
    std::string message;
    if (error) FAIL_CHECK(kind_of(error, message) << ": " << message);
  }
}

