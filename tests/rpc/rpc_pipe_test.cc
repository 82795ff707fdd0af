// The RPC conformance suite over the built-in PIPE backend (the default),
// reached by name as a user would.
#include "tests/rpc/rpc_conformance.h"

namespace switchboard::conformance {

const Backend& conformance_backend() {
  static const Backend backend{"PIPE", {{"listen_address", "127.0.0.1"}}, nullptr};
  return backend;
}

}  // namespace switchboard::conformance

#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "agents/builtin_backends.h"
#include "common/error.h"
#include "rpc/backend_registry.h"
#include "store/hash_store.h"

TEST_CASE("init_rpc without a backend uses PIPE with its default options", "[rpc][pipe]") {
  switchboard::rpc::RpcContext context;
  context.register_function("twice", [](int64_t x) { return 2 * x; });
  context.init_rpc("solo", 0, 1, nullptr, std::make_shared<switchboard::HashStore>());
  CHECK(dynamic_cast<const switchboard::agents::PipeRpcBackendOptions*>(
            context.options().get()) != nullptr);
  CHECK(context.rpc_sync<int64_t>("solo", "twice", int64_t{21}) == 42);
  context.shutdown();
}

namespace {

std::shared_ptr<switchboard::rpc::RpcBackendOptions> pipe_options_with(
    const switchboard::rpc::Extras& extras) {
  switchboard::rpc::Extras all = {{"listen_address", "127.0.0.1"}};
  all.insert(extras.begin(), extras.end());
  return switchboard::rpc::construct_rpc_backend_options(
      switchboard::rpc::backend_type("PIPE"), std::chrono::seconds(30), "env://", all);
}

}  // namespace

TEST_CASE("every PIPE setting is set through the public options, and reaches the agent",
          "[rpc][pipe][options]") {
  using switchboard::agents::PipeRpcBackendOptions;
  auto options = pipe_options_with({{"max_dynamic_ranks", "8"},
                                    {"shm", "0"},
                                    {"shm_ring_bytes", "65536"},
                                    {"max_function_length", "100"},
                                    {"max_payload_bytes", "1024"},
                                    {"max_tensors", "2"},
                                    {"max_tensor_bytes", "4096"},
                                    {"max_requests_per_peer", "16"}});
  const auto& typed = dynamic_cast<const PipeRpcBackendOptions&>(*options);
  CHECK(typed.max_dynamic_ranks == 8);
  CHECK(typed.shm == std::optional<bool>(false));
  CHECK(typed.shm_ring_bytes == 65536);
  CHECK(typed.limits.max_function_length == 100);
  CHECK(typed.limits.max_payload_bytes == 1024);
  CHECK(typed.limits.max_tensors == 2);
  CHECK(typed.limits.max_tensor_bytes == 4096);
  CHECK(typed.max_requests_per_peer == 16);
  CHECK_THROWS_WITH(pipe_options_with({{"shm_ring_bytes", "5000"}}),
                    Catch::Contains("power of two"));
  CHECK_THROWS_WITH(pipe_options_with({{"shm", "2"}}), Catch::Contains("\"shm\""));

  // The dynamic ranks' bound reaches the agent.
  {
    switchboard::rpc::RpcContext joiner;
    CHECK_THROWS_WITH(joiner.init_rpc("j", "PIPE", 9, switchboard::rpc::kDynamicGroup, options,
                                      std::make_shared<switchboard::HashStore>()),
                      Catch::Contains("[0, 8)"));
  }
  // So do the frame limits: a payload over 1024 bytes closes the connection
  // it came on, and the call fails.
  auto store = std::make_shared<switchboard::HashStore>();
  std::vector<std::unique_ptr<switchboard::rpc::RpcContext>> workers(2);
  std::vector<std::thread> starting;
  for (int r = 0; r < 2; ++r) {
    workers[r] = std::make_unique<switchboard::rpc::RpcContext>();
    workers[r]->register_function("size", [](std::string s) { return int64_t(s.size()); });
  }
  for (int r = 0; r < 2; ++r) {
    starting.emplace_back([&, r] {
      workers[r]->init_rpc("w" + std::to_string(r), "PIPE", r, 2, options, store);
    });
  }
  for (auto& t : starting) t.join();
  CHECK(workers[0]->rpc_sync<int64_t>("w1", "size", std::string(100, 'x')) == 100);
  CHECK_THROWS_AS(workers[0]->rpc_sync<int64_t>("w1", "size", std::string(4096, 'x')),
                  switchboard::ConnectionError);
  for (auto& w : workers) w->shutdown(false);
}
