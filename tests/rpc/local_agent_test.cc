// The LOCAL test backend (tests/rpc/local_agent.h) beyond the RpcAgent
// conformance suite (tests/rpc/agent_conformance.h, run over LOCAL by
// agent_local_test): its registration and options, the arguments it
// refuses, and its fabric's rules (a rank claimed twice, a store whose
// group is gone).
#include "tests/rpc/local_agent.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "common/error.h"
#include "rpc/agent.h"
#include "rpc/backend_registry.h"
#include "core/message.h"
#include "store/hash_store.h"
#include "tests/util/agent_helpers.h"

using namespace switchboard;
using namespace std::chrono_literals;
using rpc::Message;
using rpc::RpcAgent;
using switchboard::testing::echo_handler;
using switchboard::testing::request;
using switchboard::testing::text;
using switchboard::testing::what_thrown;

namespace {

// Bounds every wait for something that must happen.
constexpr std::chrono::milliseconds kGuard = 30s;

rpc::BackendType local_backend() {
  return switchboard::testing::register_local_backend();
}

std::unique_ptr<RpcAgent> make_agent(std::shared_ptr<Store> store, std::string name,
                                     int rank, std::optional<int> world_size) {
  auto options = rpc::construct_rpc_backend_options(local_backend(), kGuard, "env://",
                                                    {{"num_worker_threads", "4"}});
  return rpc::init_backend(
      local_backend(),
      rpc::BackendInit{std::move(store), std::move(name), rank, world_size, options});
}

Message get(const rpc::Future<Message>& f) { return switchboard::testing::get(f, kGuard); }

}  // namespace

TEST_CASE("LOCAL registers once; a second registration returns the same BackendType",
          "[local_agent][registry]") {
  const rpc::BackendType first = switchboard::testing::register_local_backend();
  const rpc::BackendType second = switchboard::testing::register_local_backend();
  CHECK(first == second);
  CHECK(first.name() == "LOCAL");
  CHECK(rpc::backend_registered("local"));
  CHECK(rpc::backend_type("local") == first);
  // A user registering the name again is told it is taken.
  CHECK_THROWS_AS(
      rpc::register_backend(
          "LOCAL",
          [](std::chrono::milliseconds, const std::string&, const rpc::Extras&) {
            return std::make_shared<rpc::RpcBackendOptions>();
          },
          [](const rpc::BackendInit&) { return std::unique_ptr<RpcAgent>(); }),
      RegistryError);
}

TEST_CASE("LOCAL options: common fields, num_worker_threads, unknown extras refused",
          "[local_agent][registry]") {
  auto options = rpc::construct_rpc_backend_options(local_backend(), 1234ms, "tcp://x:1",
                                                    {{"num_worker_threads", "3"}});
  REQUIRE(dynamic_cast<switchboard::testing::LocalBackendOptions*>(options.get()));
  CHECK(options->rpc_timeout == 1234ms);
  CHECK(options->init_method == "tcp://x:1");
  CHECK(options->num_worker_threads == 3);
  CHECK(rpc::construct_rpc_backend_options(local_backend())->num_worker_threads ==
        rpc::kDefaultNumWorkerThreads);

  const std::string unknown = what_thrown<std::invalid_argument>([] {
    (void)rpc::construct_rpc_backend_options(local_backend(), 1s, "env://",
                                             {{"num_worker_thread", "3"}});
  });
  CHECK_THAT(unknown, Catch::Contains("unknown option \"num_worker_thread\""));
  CHECK_THAT(unknown, Catch::Contains("num_worker_threads"));  // the known ones

  for (std::string bad : {"0", "-2", "4097", "many"}) {
    INFO("num_worker_threads=" << bad);
    CHECK_THROWS_WITH(rpc::construct_rpc_backend_options(local_backend(), 1s, "env://",
                                                         {{"num_worker_threads", bad}}),
                      Catch::Contains("num_worker_threads"));
  }
}

TEST_CASE("LOCAL refuses dynamic groups and bad arguments", "[local_agent]") {
  auto store = std::make_shared<HashStore>();
  CHECK_THROWS_WITH(make_agent(store, "w0", 0, std::nullopt),
                    Catch::Contains("LOCAL backend: dynamic groups are not supported"));
  CHECK_THROWS_AS(make_agent(store, "w0", 0, std::nullopt), std::invalid_argument);
  CHECK_THROWS_AS(make_agent(nullptr, "w0", 0, 1), std::invalid_argument);
  CHECK_THROWS_AS(make_agent(store, "w0", 1, 1), std::invalid_argument);
  CHECK_THROWS_AS(make_agent(store, "w0", 0, 0), std::invalid_argument);
  CHECK_THROWS_WITH(make_agent(store, "bad name", 0, 1),
                    Catch::Contains("invalid rpc worker name \"bad name\""));
}

TEST_CASE("a second worker claiming a taken rank is refused; the owner keeps working",
          "[local_agent][names]") {
  auto store = std::make_shared<HashStore>();
  auto owner = make_agent(store, "owner", 0, 1);
  owner->start(echo_handler());
  CHECK_THAT(what_thrown<std::invalid_argument>(
                 [&] { (void)make_agent(store, "intruder", 0, 1); }),
             Catch::Contains("both claim rank 0"));
  Message got = get(owner->send(owner->self(), request("f", "mine"), kGuard));
  CHECK(text(got.payload) == "mine");
  owner->join(kGuard);
}

TEST_CASE("a store whose group is gone is refused, naming the fabric", "[local_agent]") {
  auto store = std::make_shared<HashStore>();
  make_agent(store, "w0", 0, 1).reset();
  try {
    (void)make_agent(store, "w0", 0, 1);
    FAIL("joined a group that no longer exists");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kFailedPrecondition);
    CHECK_THAT(e.what(), Catch::Contains("no longer exists"));
  }
}
