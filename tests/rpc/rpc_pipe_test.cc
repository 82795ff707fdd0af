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

#include "agents/builtin_backends.h"
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
