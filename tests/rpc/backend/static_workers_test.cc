// StaticWorkers: the exchange through a store (ranks as threads), its
// refusals (a rank that never comes, a name two ranks took) and the lookups.
#include "rpc/backend/static_workers.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/error.h"
#include "store/hash_store.h"
#include "tests/util/threads.h"

using std::chrono::milliseconds;
using switchboard::DuplicateNameError;
using switchboard::HashStore;
using switchboard::NotFoundError;
using switchboard::TimeoutError;
using switchboard::rpc::WorkerInfo;
using switchboard::rpc::backend::StaticWorkers;
using switchboard::testing::on_threads;
using switchboard::testing::rethrow_first;

namespace {

constexpr milliseconds kTimeout{60'000};

std::vector<StaticWorkers> exchange_all(HashStore& store,
                                        const std::vector<std::string>& names) {
  const int n = static_cast<int>(names.size());
  std::vector<StaticWorkers> tables(n);
  rethrow_first(on_threads(n, [&](int rank) {
    tables[rank] =
        StaticWorkers::exchange(store, {"t/names/", names[rank], rank, n}, kTimeout,
                                std::chrono::steady_clock::now() + kTimeout);
  }));
  return tables;
}

}  // namespace

TEST_CASE("every rank gets the same table, by rank", "[static_workers]") {
  HashStore store;
  const std::vector<StaticWorkers> tables =
      exchange_all(store, {"ps", "trainer1", "trainer2"});
  for (const StaticWorkers& t : tables) {
    REQUIRE(t.size() == 3);
    CHECK(t.names() == std::vector<std::string>{"ps", "trainer1", "trainer2"});
    CHECK(t.all()[2] == WorkerInfo{"trainer2", 2});
    CHECK(t.worker("trainer1") == WorkerInfo{"trainer1", 1});
    CHECK(t.worker(0) == WorkerInfo{"ps", 0});
    CHECK(t.name(2) == "trainer2");
    CHECK(t.find(WorkerInfo{"trainer1", 1}) == 1);
    // An id with another worker's name, or out of range: not this group's.
    CHECK(t.find(WorkerInfo{"trainer1", 2}) == -1);
    CHECK(t.find(WorkerInfo{"ps", 3}) == -1);
    CHECK(t.find(WorkerInfo{"ps", -1}) == -1);
  }
  CHECK(switchboard::to_string(store.get("t/names/1")) == "trainer1");
}

TEST_CASE("lookups of unknown workers name what the group has", "[static_workers]") {
  HashStore store;
  const StaticWorkers t = exchange_all(store, {"a", "b"})[0];
  REQUIRE_THROWS_MATCHES(
      t.worker("c"), NotFoundError,
      Catch::Message("no rpc worker named \"c\" (workers: \"a\", \"b\")"));
  REQUIRE_THROWS_MATCHES(t.worker(2), NotFoundError,
                         Catch::Message("no rpc worker with id 2 (ids 0 to 1)"));
  REQUIRE_THROWS_AS(t.worker(-1), NotFoundError);
}

TEST_CASE("a name that two ranks took is refused on every rank", "[static_workers]") {
  HashStore store;
  const std::vector<std::string> names = {"w", "x", "w", "x", "y"};
  const int n = static_cast<int>(names.size());
  const auto errors = on_threads(n, [&](int rank) {
    StaticWorkers::exchange(store, {"d/", names[rank], rank, n}, kTimeout,
                            std::chrono::steady_clock::now() + kTimeout);
  });
  for (const auto& error : errors) {
    REQUIRE(error);
    REQUIRE_THROWS_MATCHES(
        std::rethrow_exception(error), DuplicateNameError,
        Catch::Message("rpc worker names must be unique: \"w\" is used by "
                       "ranks 0 and 2; \"x\" is used by ranks 1 and 3"));
  }
}

TEST_CASE("a rank that never publishes is named in the timeout", "[static_workers]") {
  HashStore store;
  // Ranks 0 and 2 of 4 come; 1 and 3 never do. The wait is short because
  // the store can only time out: nothing will ever set those keys.
  const auto errors = on_threads(2, [&](int i) {
    const int rank = i * 2;
    StaticWorkers::exchange(store, {"m/", "w" + std::to_string(rank), rank, 4},
                            milliseconds(250),
                            std::chrono::steady_clock::now() + milliseconds(250));
  });
  for (int i = 0; i < 2; ++i) {
    REQUIRE(errors[i]);
    REQUIRE_THROWS_MATCHES(
        std::rethrow_exception(errors[i]), TimeoutError,
        Catch::Message(
            "rpc worker \"w" + std::to_string(i * 2) + "\" (rank " +
            std::to_string(i * 2) +
            " of 4): timed out after 250 ms waiting for ranks [1, 3] to start"));
  }
}

TEST_CASE("check_request names what is wrong with a call, the backend's own checks last",
          "[static_workers]") {
  HashStore store;
  const StaticWorkers t = exchange_all(store, {"ps", "trainer"})[0];
  switchboard::rpc::Message request;
  request.function = "step";
  const auto message_of = [](std::exception_ptr error) {
    REQUIRE(error != nullptr);
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
  };
  const WorkerInfo trainer{"trainer", 1};
  CHECK(t.check_request(1, trainer, request, milliseconds(5)) == nullptr);
  const WorkerInfo stranger{"nobody", 7};
  const std::exception_ptr missing =
      t.check_request(t.find(stranger), stranger, request, milliseconds(5));
  CHECK_THROWS_AS(std::rethrow_exception(missing), NotFoundError);
  CHECK(message_of(missing) ==
        "rpc to \"nobody\" (id 7) function \"step\": no such worker in this group of 2");
  CHECK(message_of(t.check_request(1, trainer, request, milliseconds(-1))) ==
        "rpc to \"trainer\" function \"step\": negative timeout -1 ms");
  bool asked = false;
  const auto more = [&]() -> std::optional<std::string> {
    asked = true;
    return "tensor 0 is on cuda:0";
  };
  CHECK(message_of(t.check_request(1, trainer, request, milliseconds(-1), more)) ==
        "rpc to \"trainer\" function \"step\": negative timeout -1 ms");
  CHECK_FALSE(asked);  // the backend's checks come last
  CHECK(message_of(t.check_request(1, trainer, request, milliseconds(5), more)) ==
        "rpc to \"trainer\" function \"step\": tensor 0 is on cuda:0");
  request.type = switchboard::rpc::MessageType::kResponse;
  CHECK_THROWS_AS(
      std::rethrow_exception(t.check_request(1, trainer, request, milliseconds(5))),
      std::invalid_argument);
}
