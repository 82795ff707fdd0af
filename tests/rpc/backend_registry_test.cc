// The BackendType registry: registration, case-insensitive lookup, dispatch
// to a backend's handlers, ExtrasReader, the built-in registrar, and handlers
// running without the registry's lock. Also rpc::validate_worker_name.
//
// The registry is process-global and has no unregister: every test uses
// backend names of its own.
#include "rpc/backend_registry.h"

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "rpc/agent.h"
#include "rpc/future.h"
#include "store/hash_store.h"

using namespace switchboard;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;

namespace switchboard::rpc {

// The registry's own way of naming an entry, declared token for token as in
// rpc/backend_registry.cc (one definition, so the ODR holds). Only the
// "never registered" tests use it: a BackendType otherwise always names a
// registered backend.
class BackendRegistryAccess {
 public:
  static BackendType make(std::string name) { return BackendType(std::move(name)); }
};

}  // namespace switchboard::rpc

namespace {

// An agent that does nothing: start() keeps the handler, send() fails.
class FakeAgent : public rpc::RpcAgent {
 public:
  explicit FakeAgent(rpc::WorkerInfo self) : RpcAgent(std::move(self), 1) {}

  void start(RequestHandler handler) override { handler_ = std::move(handler); }
  rpc::Future<rpc::Message> send(const rpc::WorkerInfo& to, rpc::Message request,
                                 Timeout timeout) override {
    return rpc::Future<rpc::Message>::failed(std::make_exception_ptr(
        Error(ErrorCode::kUnavailable, "FakeAgent cannot send to " + to.name)));
  }
  rpc::WorkerInfo worker(const std::string& name) const override { return self(); }
  rpc::WorkerInfo worker(int id) const override { return self(); }
  std::vector<rpc::WorkerInfo> workers() const override { return {self()}; }
  void join(Timeout timeout) override {}
  void shutdown() override {}

  const RequestHandler& handler() const { return handler_; }

 private:
  RequestHandler handler_;
};

// A backend's own options, as every real backend has.
struct FakeOptions : rpc::RpcBackendOptions {
  std::string flavor;
  int64_t depth = 0;
  bool fast = false;
  rpc::Extras extras_seen;
};

std::shared_ptr<rpc::RpcBackendOptions> plain_options(std::chrono::milliseconds timeout,
                                                      const std::string& init_method,
                                                      const rpc::Extras& extras) {
  auto options = std::make_shared<rpc::RpcBackendOptions>();
  options->rpc_timeout = timeout;
  options->init_method = init_method;
  return options;
}

std::unique_ptr<rpc::RpcAgent> plain_agent(const rpc::BackendInit& init) {
  return std::make_unique<FakeAgent>(rpc::WorkerInfo{init.name, init.rank});
}

bool lists(const std::vector<rpc::BackendType>& backends, const std::string& name) {
  return std::any_of(backends.begin(), backends.end(),
                     [&](const rpc::BackendType& b) { return b.name() == name; });
}

// The built-in registrar, installed at static-initialization time as
// agents/builtin_backends.cc does. `builtin_runs` is constant-initialized, so
// it is zero before any dynamic initializer runs.
std::atomic<int> builtin_runs{0};
std::atomic<bool> builtin_saw_itself{false};

void register_builtins() {
  ++builtin_runs;
  rpc::register_backend("test_builtin", plain_options, plain_agent);
  // The registrar may consult the registry it is filling.
  builtin_saw_itself = rpc::backend_registered("TEST_BUILTIN");
}

const bool installed = (rpc::set_builtin_backends(&register_builtins), true);
// Initialized after `installed` (same translation unit, in order): installing
// the registrar must not run it.
const int runs_after_install = builtin_runs.load();

}  // namespace

TEST_CASE("the built-in registrar runs once, at the registry's first use",
          "[backend_registry]") {
  REQUIRE(installed);
  CHECK(runs_after_install == 0);

  REQUIRE(rpc::backend_registered("test_builtin"));
  CHECK(rpc::backend_type("Test_Builtin").name() == "TEST_BUILTIN");
  CHECK(builtin_saw_itself);
  CHECK(builtin_runs == 1);

  // Many registry calls from several threads, registrations included.
  constexpr int kThreads = 4;
  constexpr int kRounds = 50;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &failures] {
      try {
        for (int i = 0; i < kRounds; ++i) {
          if (!rpc::backend_registered("TEST_BUILTIN")) ++failures;
          if (!lists(rpc::registered_backends(), "TEST_BUILTIN")) ++failures;
          if (rpc::backend_type("test_builtin").name() != "TEST_BUILTIN") ++failures;
          if (i % 10 == 0) {
            rpc::register_backend("builtin_race_" + std::to_string(t) + "_" +
                                      std::to_string(i),
                                  plain_options, plain_agent);
          }
        }
      } catch (...) {
        ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(failures == 0);
  CHECK(builtin_runs == 1);
  CHECK(rpc::backend_registered("BUILTIN_RACE_3_40"));

  // Re-installing after the registrar ran does not run anything again.
  rpc::set_builtin_backends(&register_builtins);
  CHECK(rpc::backend_registered("test_builtin"));
  CHECK(builtin_runs == 1);
}

namespace {
int late_runs = 0;
void register_late() {
  ++late_runs;
  rpc::register_backend("LATE_BUILTIN", plain_options, plain_agent);
}
}  // namespace

TEST_CASE("a registrar installed after the first lookup still runs, once",
          "[backend_registry]") {
  CHECK_FALSE(rpc::backend_registered("LATE_BUILTIN"));  // the registry is consulted
  rpc::set_builtin_backends(&register_late);
  CHECK(rpc::backend_registered("late_builtin"));
  CHECK(late_runs == 1);
  rpc::set_builtin_backends(&register_late);
  CHECK(rpc::backend_registered("LATE_BUILTIN"));
  CHECK(late_runs == 1);
}

TEST_CASE("register_backend: lookup is case-insensitive, names are upper case",
          "[backend_registry]") {
  rpc::BackendType type = rpc::register_backend("my_be", plain_options, plain_agent);
  CHECK(type.name() == "MY_BE");

  CHECK(rpc::backend_registered("my_be"));
  CHECK(rpc::backend_registered("MY_BE"));
  CHECK(rpc::backend_registered("My_Be"));
  CHECK_FALSE(rpc::backend_registered("my_be2"));
  CHECK_FALSE(rpc::backend_registered("my_"));

  CHECK(rpc::backend_type("my_be") == type);
  CHECK(rpc::backend_type("MY_BE") == type);
  CHECK(rpc::backend_type("mY_bE").name() == "MY_BE");

  const auto all = rpc::registered_backends();
  CHECK(lists(all, "MY_BE"));
  CHECK_FALSE(lists(all, "my_be"));
  CHECK(std::count(all.begin(), all.end(), type) == 1);
}

TEST_CASE("register_backend refuses a duplicate in any case", "[backend_registry]") {
  rpc::register_backend("dup_be", plain_options, plain_agent);

  for (const char* again : {"dup_be", "DUP_BE", "Dup_Be"}) {
    INFO(again);
    try {
      rpc::register_backend(again, plain_options, plain_agent);
      FAIL("a duplicate registration was accepted");
    } catch (const RegistryError& e) {
      CHECK(std::string(e.what()) == "RPC backend DUP_BE: already registered");
      CHECK(e.code() == ErrorCode::kRegistry);
    }
  }
  // The first registration is still the one in the table.
  CHECK(rpc::backend_registered("dup_be"));
  const auto all = rpc::registered_backends();
  CHECK(std::count(all.begin(), all.end(), rpc::backend_type("dup_be")) == 1);
}

TEST_CASE("register_backend refuses an empty name or handler", "[backend_registry]") {
  CHECK_THROWS_AS(rpc::register_backend("", plain_options, plain_agent),
                  std::invalid_argument);
  CHECK_THROWS_WITH(rpc::register_backend("no_options_be", nullptr, plain_agent),
                    Contains("no_options_be") && Contains("construct_options_handler"));
  CHECK_THROWS_AS(rpc::register_backend("no_options_be", nullptr, plain_agent),
                  std::invalid_argument);
  CHECK_THROWS_WITH(rpc::register_backend("no_init_be", plain_options, nullptr),
                    Contains("no_init_be") && Contains("init_backend_handler"));
  CHECK_THROWS_AS(rpc::register_backend("no_init_be", plain_options, nullptr),
                  std::invalid_argument);
  CHECK_THROWS_AS(rpc::register_backend("no_init_be", rpc::ConstructOptionsHandler(),
                                        rpc::InitBackendHandler()),
                  std::invalid_argument);
  // Nothing was registered by the failed attempts.
  CHECK_FALSE(rpc::backend_registered("no_options_be"));
  CHECK_FALSE(rpc::backend_registered("no_init_be"));
}

TEST_CASE("unknown backends are a RegistryError naming them", "[backend_registry]") {
  rpc::register_backend("known_for_unknown_test", plain_options, plain_agent);

  try {
    rpc::backend_type("never_registered_be");
    FAIL("backend_type accepted an unknown name");
  } catch (const RegistryError& e) {
    CHECK_THAT(e.what(), Contains("NEVER_REGISTERED_BE") && Contains("not registered") &&
                             Contains("KNOWN_FOR_UNKNOWN_TEST"));
  }
  CHECK_FALSE(rpc::backend_registered("never_registered_be"));

  const rpc::BackendType ghost = rpc::BackendRegistryAccess::make("GHOST_BE");
  CHECK_THROWS_AS(rpc::construct_rpc_backend_options(ghost), RegistryError);
  CHECK_THROWS_WITH(rpc::construct_rpc_backend_options(ghost), Contains("GHOST_BE"));
  rpc::BackendInit init;
  init.name = "w0";
  init.rank = 0;
  CHECK_THROWS_AS(rpc::init_backend(ghost, init), RegistryError);
  CHECK_THROWS_WITH(rpc::init_backend(ghost, init), Contains("GHOST_BE"));
}

TEST_CASE("construct_rpc_backend_options dispatches to the backend's handler",
          "[backend_registry]") {
  struct Seen {
    int calls = 0;
    std::chrono::milliseconds timeout{-1};
    std::string init_method;
    rpc::Extras extras;
  };
  // Catch2 runs the test once per SECTION: register once, reset what the
  // handler saw on every run.
  static const auto seen = std::make_shared<Seen>();
  *seen = Seen{};
  auto construct = [](std::chrono::milliseconds timeout,
                          const std::string& init_method, const rpc::Extras& extras) {
    ++seen->calls;
    seen->timeout = timeout;
    seen->init_method = init_method;
    seen->extras = extras;
    rpc::ExtrasReader reader("OPTS_BE", extras);
    auto options = std::make_shared<FakeOptions>();
    options->rpc_timeout = timeout;
    options->init_method = init_method;
    options->flavor = reader.get("flavor").value_or("plain");
    options->depth = reader.get_int("depth").value_or(1);
    options->fast = reader.get_bool("fast").value_or(false);
    options->extras_seen = extras;
    reader.finish();
    return options;
  };
  static const rpc::BackendType type =
      rpc::register_backend("opts_be", construct, plain_agent);

  SECTION("the common fields and extras reach the handler") {
    const rpc::Extras extras{{"flavor", "spicy"}, {"depth", "7"}, {"fast", "true"}};
    auto options =
        rpc::construct_rpc_backend_options(type, 1234ms, "tcp://127.0.0.1:1", extras);
    REQUIRE(options != nullptr);
    CHECK(seen->calls == 1);
    CHECK(seen->timeout == 1234ms);
    CHECK(seen->init_method == "tcp://127.0.0.1:1");
    CHECK(seen->extras == extras);

    auto* typed = dynamic_cast<FakeOptions*>(options.get());
    REQUIRE(typed != nullptr);
    CHECK(typed->rpc_timeout == 1234ms);
    CHECK(typed->init_method == "tcp://127.0.0.1:1");
    CHECK(typed->flavor == "spicy");
    CHECK(typed->depth == 7);
    CHECK(typed->fast);
  }

  SECTION("defaults") {
    auto options = rpc::construct_rpc_backend_options(type);
    CHECK(seen->timeout == rpc::kDefaultRpcTimeout);
    CHECK(seen->init_method == "env://");
    CHECK(seen->extras.empty());
    auto* typed = dynamic_cast<FakeOptions*>(options.get());
    REQUIRE(typed != nullptr);
    CHECK(typed->flavor == "plain");
    CHECK(typed->depth == 1);
    CHECK_FALSE(typed->fast);
    CHECK(typed->num_worker_threads == rpc::kDefaultNumWorkerThreads);
  }

  SECTION("zero means no timeout and is accepted") {
    auto options = rpc::construct_rpc_backend_options(type, 0ms);
    CHECK(options->rpc_timeout == 0ms);
  }

  SECTION("a negative rpc_timeout is refused before the handler runs") {
    CHECK_THROWS_AS(rpc::construct_rpc_backend_options(type, -1ms),
                    std::invalid_argument);
    CHECK_THROWS_WITH(rpc::construct_rpc_backend_options(type, -5ms),
                      Contains("OPTS_BE") && Contains("rpc_timeout") && Contains("-5"));
    CHECK(seen->calls == 0);
  }

  SECTION("the handler's own errors reach the caller") {
    CHECK_THROWS_WITH(
        rpc::construct_rpc_backend_options(type, 1s, "env://", {{"depht", "3"}}),
        Contains("OPTS_BE") && Contains("unknown option \"depht\""));
    CHECK_THROWS_WITH(
        rpc::construct_rpc_backend_options(type, 1s, "env://", {{"depth", "deep"}}),
        Contains("\"depth\"") && Contains("\"deep\""));
  }
}

TEST_CASE("ExtrasReader reads typed values and refuses what nobody read",
          "[backend_registry]") {
  SECTION("get, get_int, get_bool") {
    const rpc::Extras extras{{"name", "x"},   {"threads", "-42"}, {"big", "9000000000"},
                             {"on", "true"},  {"off", "false"},   {"one", "1"},
                             {"zero", "0"}};
    rpc::ExtrasReader reader("PIPE", extras);
    CHECK(reader.get("name") == std::optional<std::string>("x"));
    CHECK(reader.get("missing") == std::nullopt);
    CHECK(reader.get_int("threads") == std::optional<int64_t>(-42));
    CHECK(reader.get_int("big") == std::optional<int64_t>(9'000'000'000));
    CHECK(reader.get_int("missing_int") == std::nullopt);
    CHECK(reader.get_bool("on") == std::optional<bool>(true));
    CHECK(reader.get_bool("off") == std::optional<bool>(false));
    CHECK(reader.get_bool("one") == std::optional<bool>(true));
    CHECK(reader.get_bool("zero") == std::optional<bool>(false));
    CHECK(reader.get_bool("missing_bool") == std::nullopt);
    CHECK_NOTHROW(reader.finish());
  }

  SECTION("malformed integers name the backend, key and value") {
    for (const char* bad : {"12x", "", "x12", " 12", "1.5", "99999999999999999999"}) {
      INFO("value \"" << bad << "\"");
      const rpc::Extras extras{{"num_worker_threads", bad}};
      rpc::ExtrasReader reader("PIPE", extras);
      try {
        reader.get_int("num_worker_threads");
        FAIL("accepted a malformed integer");
      } catch (const std::invalid_argument& e) {
        CHECK_THAT(e.what(), Contains("\"PIPE\"") && Contains("\"num_worker_threads\"") &&
                                 Contains(std::string("got \"") + bad + "\""));
      }
    }
  }

  SECTION("malformed booleans name the backend, key and value") {
    for (const char* bad : {"yes", "TRUE", "2", ""}) {
      INFO("value \"" << bad << "\"");
      const rpc::Extras extras{{"use_cuda", bad}};
      rpc::ExtrasReader reader("PIPE", extras);
      try {
        reader.get_bool("use_cuda");
        FAIL("accepted a malformed boolean");
      } catch (const std::invalid_argument& e) {
        CHECK_THAT(e.what(), Contains("\"PIPE\"") && Contains("\"use_cuda\"") &&
                                 Contains(std::string("got \"") + bad + "\""));
      }
    }
  }

  SECTION("finish names an unknown key and lists the known ones") {
    const rpc::Extras extras{{"num_worker_thread", "8"}, {"rpc_timeout_ms", "10"}};
    rpc::ExtrasReader reader("PIPE", extras);
    CHECK(reader.get_int("num_worker_threads") == std::nullopt);
    CHECK(reader.get_int("rpc_timeout_ms") == std::optional<int64_t>(10));
    CHECK(reader.get_bool("use_cuda") == std::nullopt);
    try {
      reader.finish();
      FAIL("finish() accepted an unknown key");
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      CHECK_THAT(what, Contains("RPC backend \"PIPE\"") &&
                           Contains("unknown option \"num_worker_thread\"") &&
                           Contains("num_worker_threads") && Contains("rpc_timeout_ms") &&
                           Contains("use_cuda"));
    }
  }

  SECTION("finish passes once every key was read, even when absent ones were asked") {
    const rpc::Extras extras{{"a", "1"}, {"b", "false"}, {"c", "text"}};
    rpc::ExtrasReader reader("MINE", extras);
    reader.get_int("a");
    CHECK_THROWS_WITH(reader.finish(), Contains("\"b\""));
    reader.get_bool("b");
    CHECK_THROWS_WITH(reader.finish(), Contains("\"c\""));
    reader.get("c");
    reader.get("d");
    CHECK_NOTHROW(reader.finish());
  }

  SECTION("no extras at all") {
    const rpc::Extras extras;
    rpc::ExtrasReader reader("MINE", extras);
    CHECK_NOTHROW(reader.finish());
  }
}

TEST_CASE("init_backend passes BackendInit to the handler and returns its agent",
          "[backend_registry]") {
  struct Seen {
    int calls = 0;
    std::shared_ptr<Store> store;
    std::string name;
    int rank = -2;
    std::optional<int> world_size;
    std::shared_ptr<rpc::RpcBackendOptions> options;
    FakeAgent* agent = nullptr;
  };
  auto seen = std::make_shared<Seen>();
  using AgentPtr = std::unique_ptr<rpc::RpcAgent>;
  auto init_handler = [seen](const rpc::BackendInit& init) -> AgentPtr {
    ++seen->calls;
    seen->store = init.store;
    seen->name = init.name;
    seen->rank = init.rank;
    seen->world_size = init.world_size;
    seen->options = init.options;
    auto agent = std::make_unique<FakeAgent>(rpc::WorkerInfo{init.name, init.rank});
    seen->agent = agent.get();
    return agent;
  };
  const rpc::BackendType type =
      rpc::register_backend("init_be", plain_options, init_handler);

  auto store = std::make_shared<HashStore>();
  auto options = rpc::construct_rpc_backend_options(type, 5s, "file:///tmp/x");

  rpc::BackendInit init;
  init.store = store;
  init.name = "trainer:3";
  init.rank = 3;
  init.world_size = 8;
  init.options = options;

  std::unique_ptr<rpc::RpcAgent> agent = rpc::init_backend(type, init);
  REQUIRE(agent != nullptr);
  CHECK(seen->calls == 1);
  CHECK(agent.get() == seen->agent);
  CHECK(seen->store.get() == store.get());
  CHECK(seen->name == "trainer:3");
  CHECK(seen->rank == 3);
  CHECK(seen->world_size == std::optional<int>(8));
  CHECK(seen->options == options);
  CHECK(agent->self() == rpc::WorkerInfo{"trainer:3", 3});
  seen->store.reset();

  // The fake agent behaves as documented.
  bool served = false;
  agent->start([&](rpc::Message, const rpc::WorkerInfo&) {
    served = true;
    return rpc::Future<rpc::Message>::ready(rpc::Message{});
  });
  auto* fake = dynamic_cast<FakeAgent*>(agent.get());
  REQUIRE(fake != nullptr);
  REQUIRE(fake->handler() != nullptr);
  CHECK(fake->handler()(rpc::Message{}, rpc::WorkerInfo{"peer", 0}).value().id == 0);
  CHECK(served);
  auto sent = agent->send(rpc::WorkerInfo{"peer", 0}, rpc::Message{}, 1s);
  CHECK_THROWS_AS(sent.value(), Error);
  CHECK(agent->workers() == std::vector<rpc::WorkerInfo>{agent->self()});
  agent->join(1s);
  agent->shutdown();

  // A dynamic group's BackendInit: no rank, no world size.
  rpc::BackendInit dynamic;
  dynamic.name = "elastic";
  auto other = rpc::init_backend(rpc::backend_type("INIT_BE"), dynamic);
  CHECK(seen->calls == 2);
  CHECK(seen->rank == -1);
  CHECK(seen->world_size == std::nullopt);
  CHECK(seen->store == nullptr);
  CHECK(seen->options == nullptr);
  CHECK(other->self().name == "elastic");
}

TEST_CASE("handlers run without the registry's lock", "[backend_registry]") {
  // Each handler consults and changes the registry; with the lock held this
  // would deadlock. Run on another thread so a deadlock fails the test
  // instead of hanging it (the thread is then detached and leaked).
  auto construct = [](std::chrono::milliseconds timeout, const std::string& init_method,
                      const rpc::Extras& extras) {
    if (!rpc::backend_registered("reentrant_be") ||
        !lists(rpc::registered_backends(), "REENTRANT_BE")) {
      throw std::runtime_error("the options handler does not see its own backend");
    }
    rpc::register_backend("reentrant_from_options", plain_options, plain_agent);
    return plain_options(timeout, init_method, extras);
  };
  auto init_handler = [](const rpc::BackendInit& init) -> std::unique_ptr<rpc::RpcAgent> {
    if (!rpc::backend_registered("reentrant_be")) return nullptr;
    rpc::backend_type("reentrant_be");
    rpc::register_backend("reentrant_from_init", plain_options, plain_agent);
    return std::make_unique<FakeAgent>(rpc::WorkerInfo{init.name, init.rank});
  };
  const rpc::BackendType type =
      rpc::register_backend("reentrant_be", construct, init_handler);

  auto done = std::make_shared<std::promise<std::string>>();
  std::future<std::string> result = done->get_future();
  std::thread([type, done] {
    try {
      auto options = rpc::construct_rpc_backend_options(type);
      rpc::BackendInit init;
      init.name = "w0";
      init.rank = 0;
      init.world_size = 1;
      init.options = options;
      auto agent = rpc::init_backend(type, init);
      done->set_value(agent != nullptr ? agent->self().name : "null agent");
    } catch (const std::exception& e) {
      done->set_value(std::string("threw: ") + e.what());
    }
  }).detach();

  REQUIRE(result.wait_for(10s) == std::future_status::ready);
  CHECK(result.get() == "w0");
  CHECK(rpc::backend_registered("reentrant_from_options"));
  CHECK(rpc::backend_registered("reentrant_from_init"));
}

TEST_CASE("a null agent or options from a handler is an internal error",
          "[backend_registry]") {
  const rpc::BackendType type = rpc::register_backend(
      "null_be",
      [](std::chrono::milliseconds, const std::string&, const rpc::Extras&) {
        return std::shared_ptr<rpc::RpcBackendOptions>();
      },
      [](const rpc::BackendInit&) { return std::unique_ptr<rpc::RpcAgent>(); });
  try {
    rpc::construct_rpc_backend_options(type);
    FAIL("a null options object was accepted");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kInternal);
    CHECK_THAT(e.what(), Contains("NULL_BE"));
  }
  try {
    rpc::init_backend(type, rpc::BackendInit{});
    FAIL("a null agent was accepted");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kInternal);
    CHECK_THAT(e.what(), Contains("NULL_BE"));
  }
}

TEST_CASE("validate_worker_name", "[backend_registry][agent]") {
  for (const std::string& good :
       {std::string("w"), std::string("worker0"), std::string("Trainer_1"),
        std::string("ps-2"), std::string("host:rank:3"), std::string("0"),
        std::string("a_B-9:z"), std::string(rpc::kMaxWorkerNameLength, 'x')}) {
    INFO(good);
    CHECK_NOTHROW(rpc::validate_worker_name(good));
  }
  CHECK(rpc::kMaxWorkerNameLength == 128);

  const std::string too_long(rpc::kMaxWorkerNameLength + 1, 'y');
  for (const std::string& bad :
       {std::string(""), std::string("a b"), std::string("a/b"), std::string("a.b"),
        std::string(" "), std::string("w\n"), std::string("wörker"), too_long}) {
    INFO("name \"" << bad << "\"");
    try {
      rpc::validate_worker_name(bad);
      FAIL("accepted an invalid worker name");
    } catch (const std::invalid_argument& e) {
      CHECK_THAT(e.what(), Contains("\"" + bad + "\"") && Contains("128"));
    }
  }
}
