// The Store conformance suite: every implementation must pass all of it.
#include <catch2/catch.hpp>

#include <atomic>
#include <set>
#include <thread>

#include "common/error.h"
#include "store/call_bound.h"
#include "tests/store/store_fixtures.h"

using switchboard::Bytes;
using switchboard::Store;
using switchboard::to_bytes;
using switchboard::to_string;
using namespace std::chrono_literals;

#define STORE_FIXTURES SB_STORE_FIXTURES

TEMPLATE_TEST_CASE("set then get returns the value, including empty and binary values",
                   "[store][conformance]", STORE_FIXTURES) {
  TestType fixture;
  auto store = fixture.open();
  store->set("a", "xyz");
  CHECK(to_string(store->get("a")) == "xyz");
  store->set("empty", Bytes{});
  CHECK(store->get("empty").empty());
  Bytes binary = {0, 1, 255, 0, 7};
  store->set("bin", binary);
  CHECK(store->get("bin") == binary);
  store->set("a", "replaced");
  CHECK(to_string(store->get("a")) == "replaced");
}

TEMPLATE_TEST_CASE("get of a missing key times out naming the key",
                   "[store][conformance]", STORE_FIXTURES) {
  TestType fixture;
  auto store = fixture.open();
  store->set_timeout(50ms);
  try {
    (void)store->get("never_set");
    FAIL("get returned for a missing key");
  } catch (const switchboard::TimeoutError& e) {
    CHECK_THAT(e.what(), Catch::Contains("never_set"));
  }
}

TEMPLATE_TEST_CASE("a StoreCallBound ends get and wait that would wait forever: a deadline for "
                   "every call of the scope, or a cap on each; leaving the scope lifts it",
                   "[store][conformance][call_bound]", STORE_FIXTURES) {
  using switchboard::StoreCallBound;
  TestType fixture;
  auto store = fixture.open();
  store->set_timeout(Store::kNoTimeout);
  store->set("present", "1");
  {
    StoreCallBound bound(std::chrono::steady_clock::now() + 50ms);
    CHECK_THROWS_AS(store->get("never_set"), switchboard::TimeoutError);
    // The deadline has passed: every later call of the scope ends at once.
    CHECK_THROWS_AS(store->wait({"never_set"}, Store::kNoTimeout), switchboard::TimeoutError);
  }
  {
    StoreCallBound cap(50ms);
    try {
      store->wait({"present", "absent"}, Store::kNoTimeout);
      FAIL("wait returned with a key missing");
    } catch (const switchboard::TimeoutError& e) {
      CHECK_THAT(e.what(), Catch::Contains("absent"));
    }
    // Each call gets the cap afresh.
    CHECK_THROWS_AS(store->multi_get({"present", "absent"}), switchboard::TimeoutError);
    CHECK(to_string(store->get("present")) == "1");
  }
  CHECK(StoreCallBound::bounded(Store::kNoTimeout) == Store::kNoTimeout);
  CHECK(to_string(store->get("present")) == "1");
}

TEMPLATE_TEST_CASE("get blocks until another handle sets the key",
                   "[store][conformance]", STORE_FIXTURES) {
  TestType fixture;
  auto reader = fixture.open();
  auto writer = fixture.open();
  std::atomic<bool> started{false};
  std::thread waiter([&] {
    started = true;
    CHECK(to_string(reader->get("late")) == "here");
  });
  while (!started) std::this_thread::yield();
  writer->set("late", "here");
  waiter.join();
}

TEMPLATE_TEST_CASE("add counts from zero and rejects non-integers",
                   "[store][conformance]", STORE_FIXTURES) {
  TestType fixture;
  auto store = fixture.open();
  CHECK(store->add("cnt", 5) == 5);
  CHECK(store->add("cnt", -7) == -2);
  CHECK(to_string(store->get("cnt")) == "-2");
  store->set("text", "abc");
  try {
    store->add("text", 1);
    FAIL("add on a non-integer succeeded");
  } catch (const switchboard::Error& e) {
    CHECK(e.code() == switchboard::ErrorCode::kFailedPrecondition);
    CHECK_THAT(e.what(), Catch::Contains("text"));
  }
  // The store still works after the rejected add.
  CHECK(store->add("cnt", 2) == 0);
}

TEMPLATE_TEST_CASE("compare_set follows PyTorch's four cases",
                   "[store][conformance]", STORE_FIXTURES) {
  TestType fixture;
  auto store = fixture.open();
  // Missing key, non-empty expected: nothing written, expected returned.
  CHECK(to_string(store->compare_set("k", to_bytes("exp"), to_bytes("new"))) == "exp");
  CHECK_FALSE(store->check({"k"}));
  // Missing key, empty expected: created.
  CHECK(to_string(store->compare_set("k", {}, to_bytes("v1"))) == "v1");
  CHECK(to_string(store->get("k")) == "v1");
  // Present and equal: replaced.
  CHECK(to_string(store->compare_set("k", to_bytes("v1"), to_bytes("v2"))) == "v2");
  // Present and different: current value returned, nothing written.
  CHECK(to_string(store->compare_set("k", to_bytes("v1"), to_bytes("v3"))) == "v2");
  CHECK(to_string(store->get("k")) == "v2");
}

TEMPLATE_TEST_CASE("wait returns once all keys exist and times out naming the missing ones",
                   "[store][conformance]", STORE_FIXTURES) {
  TestType fixture;
  auto store = fixture.open();
  store->wait({});
  store->set("present", "1");
  store->wait({"present"}, 50ms);
  try {
    store->wait({"present", "absent1", "absent2"}, 50ms);
    FAIL("wait returned with keys missing");
  } catch (const switchboard::TimeoutError& e) {
    CHECK_THAT(e.what(), Catch::Contains("absent1") && Catch::Contains("absent2"));
  }
  // The handle keeps working after a timed-out wait.
  store->set("absent1", "x");
  CHECK(store->add("after_timeout", 1) == 1);
  CHECK(to_string(store->get("absent1")) == "x");
}

TEMPLATE_TEST_CASE("check, delete_key and num_keys agree", "[store][conformance]",
                   STORE_FIXTURES) {
  TestType fixture;
  auto store = fixture.open();
  int64_t base = store->num_keys();
  CHECK(store->check({}));
  CHECK_FALSE(store->check({"x"}));
  store->set("x", "1");
  store->set("y", "2");
  CHECK(store->check({"x", "y"}));
  CHECK(store->num_keys() == base + 2);
  CHECK(store->delete_key("x"));
  CHECK_FALSE(store->delete_key("x"));
  CHECK_FALSE(store->check({"x", "y"}));
  CHECK(store->num_keys() == base + 1);
}

TEMPLATE_TEST_CASE("multi_set, multi_get and append", "[store][conformance]",
                   STORE_FIXTURES) {
  TestType fixture;
  auto store = fixture.open();
  store->multi_set({"m1", "m2", "m3"},
                   {to_bytes("one"), Bytes{}, to_bytes("three")});
  auto values = store->multi_get({"m3", "m1", "m2"});
  REQUIRE(values.size() == 3);
  CHECK(to_string(values[0]) == "three");
  CHECK(to_string(values[1]) == "one");
  CHECK(values[2].empty());
  CHECK_THROWS_AS(store->multi_set({"a"}, {}), std::invalid_argument);
  store->set_timeout(50ms);
  CHECK_THROWS_AS(store->multi_get({"m1", "nope"}), switchboard::TimeoutError);

  store->append("log", to_bytes("ab"));
  store->append("log", to_bytes("cd"));
  CHECK(to_string(store->get("log")) == "abcd");
}

TEMPLATE_TEST_CASE("concurrent adds from several handles are atomic",
                   "[store][conformance]", STORE_FIXTURES) {
  TestType fixture;
  constexpr int kThreads = 4;
  constexpr int kAddsEach = 50;
  std::vector<std::shared_ptr<Store>> handles;
  for (int i = 0; i < kThreads; ++i) handles.push_back(fixture.open());
  std::vector<std::vector<int64_t>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kAddsEach; ++i) seen[t].push_back(handles[t]->add("ctr", 1));
    });
  }
  for (auto& thread : threads) thread.join();
  std::set<int64_t> all;
  for (const auto& values : seen) all.insert(values.begin(), values.end());
  CHECK(all.size() == kThreads * kAddsEach);
  CHECK(*all.begin() == 1);
  CHECK(*all.rbegin() == kThreads * kAddsEach);
}

TEMPLATE_TEST_CASE("keys and values with NUL bytes and non-ASCII text round-trip",
                   "[store][conformance]", STORE_FIXTURES) {
  TestType fixture;
  auto store = fixture.open();
  std::string key("k\0ey\xc3\xa9", 6);
  Bytes value = {0, 0, 1, 0};
  store->set(key, value);
  CHECK(store->get(key) == value);
  CHECK(store->check({key}));
}
