// MembershipToken: mutual exclusion over a HashStore and over a TcpStore
// with real clients, the holder named in timeouts, a dead holder's lease
// taken over, a lost lease reported by renew() and release().
//
// A dead holder is simulated by writing the value it would have left in
// the Store (its name and lease expiry): that is all a killed process
// leaves behind. Waits are bounded; the only durations are leases and
// acquire() timeouts, and no assertion depends on how long anything took.
#include "rpc/membership_token.h"

#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "store/hash_store.h"
#include "store/tcp_store.h"
#include "store/tcp_store_server.h"
#include "tests/util/threads.h"

using namespace switchboard;
using namespace std::chrono_literals;
using rpc::MembershipToken;
using testing::on_threads;
using testing::rethrow_first;

namespace {

constexpr auto kGuard = 30'000ms;
const std::string kKey = "rpc/dyn/token";

std::string value_of(Store& store) {
  const Bytes bytes = store.get(kKey);
  return std::string(bytes.begin(), bytes.end());
}

void set_value(Store& store, const std::string& value) {
  store.set(kKey, Bytes(value.begin(), value.end()));
}

int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

TEST_CASE("the token names its holder and is free again after release", "[token]") {
  auto store = std::make_shared<HashStore>();
  MembershipToken a(store, kKey, "trainer-1");
  CHECK_FALSE(a.held());
  a.acquire(kGuard);
  CHECK(a.held());
  CHECK(MembershipToken::holder_of(value_of(*store)) == "trainer-1");
  a.renew();
  CHECK(MembershipToken::holder_of(value_of(*store)) == "trainer-1");
  a.release();
  CHECK_FALSE(a.held());
  CHECK(value_of(*store).empty());
  MembershipToken b(store, kKey, "trainer-2");
  b.acquire(kGuard);
  CHECK(MembershipToken::holder_of(value_of(*store)) == "trainer-2");
  // Misuse is a caller bug.
  CHECK_THROWS_AS(b.acquire(kGuard), std::invalid_argument);
  CHECK_THROWS_AS(a.release(), std::invalid_argument);
  CHECK_THROWS_AS(MembershipToken(store, kKey, "two\nlines"), std::invalid_argument);
}

TEST_CASE("a taken token times out the next worker, naming the holder and its lease",
          "[token]") {
  auto store = std::make_shared<HashStore>();
  MembershipToken a(store, kKey, "ps", 60'000ms);
  a.acquire(kGuard);
  MembershipToken b(store, kKey, "trainer-3");
  try {
    b.acquire(50ms);
    FAIL("acquired a token that \"ps\" holds");
  } catch (const TimeoutError& e) {
    const std::string message = e.what();
    CHECK_THAT(message, Catch::Contains("\"trainer-3\" could not take it within 50 ms"));
    CHECK_THAT(message, Catch::Contains("held by \"ps\""));
    CHECK_THAT(message, Catch::Contains("lease ends in"));
    CHECK_THAT(message, Catch::Contains(kKey));
  }
  CHECK_FALSE(b.held());
  a.release();
  b.acquire(kGuard);
  CHECK(b.held());
}

TEST_CASE("the destructor releases a held token", "[token]") {
  auto store = std::make_shared<HashStore>();
  {
    MembershipToken a(store, kKey, "w0");
    a.acquire(kGuard);
  }
  CHECK(value_of(*store).empty());
}

TEST_CASE("a dead holder's token is taken over once its lease ends, not before",
          "[token]") {
  auto store = std::make_shared<HashStore>();
  // What a worker killed mid-join leaves: its name and a lease 300 ms out.
  set_value(*store, fmt::format("dead-worker\n{}\nabc", wall_ms() + 300));
  MembershipToken b(store, kKey, "w1");
  // Well inside the lease: refused, naming the dead holder.
  CHECK_THROWS_WITH(b.acquire(1ms), Catch::Contains("held by \"dead-worker\""));
  // Waiting long enough: taken over after the lease.
  b.acquire(kGuard);
  CHECK(MembershipToken::holder_of(value_of(*store)) == "w1");
}

TEST_CASE("a token value that is not one (corrupt) does not wedge the group", "[token]") {
  auto store = std::make_shared<HashStore>();
  set_value(*store, "garbage without a lease");
  MembershipToken a(store, kKey, "w0");
  a.acquire(kGuard);
  CHECK(MembershipToken::holder_of(value_of(*store)) == "w0");
}

TEST_CASE("a holder whose lease ran out and was taken over learns it on renew and release",
          "[token]") {
  auto store = std::make_shared<HashStore>();
  MembershipToken slow(store, kKey, "slow", 1ms);
  slow.acquire(kGuard);
  MembershipToken next(store, kKey, "next");
  next.acquire(kGuard);  // waits out slow's 1 ms lease, then takes over
  CHECK_THROWS_WITH(slow.renew(), Catch::Contains("\"slow\" lost it to \"next\""));
  CHECK_FALSE(slow.held());
  // release() of a lost token says so too.
  MembershipToken slow2(store, kKey, "slow2", 1ms);
  next.release();
  slow2.acquire(kGuard);
  MembershipToken next2(store, kKey, "next2");
  next2.acquire(kGuard);
  try {
    slow2.release();
    FAIL("release() of a token taken over succeeded");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kFailedPrecondition);
    CHECK_THAT(std::string(e.what()), Catch::Contains("\"slow2\" lost it to \"next2\""));
  }
  CHECK(MembershipToken::holder_of(value_of(*store)) == "next2");
}

namespace {

// Four workers each take the token 25 times; inside, they check that
// nobody else is inside (a plain counter in the Store: a second holder
// would see it at 1).
void contend(const std::function<std::shared_ptr<Store>(int)>& connect) {
  rethrow_first(on_threads(4, [&](int rank) {
    std::shared_ptr<Store> store = connect(rank);
    MembershipToken token(store, kKey, fmt::format("w{}", rank));
    for (int round = 0; round < 25; ++round) {
      token.acquire(kGuard);
      const int64_t inside = store->add("inside", 1);
      REQUIRE(inside == 1);
      store->add("entries", 1);
      REQUIRE(store->add("inside", -1) == 0);
      token.release();
    }
  }));
}

}  // namespace

TEST_CASE("concurrent workers hold the token one at a time (HashStore)", "[token]") {
  auto store = std::make_shared<HashStore>();
  contend([&](int) { return store; });
  CHECK(store->add("entries", 0) == 100);
}

TEST_CASE("concurrent workers hold the token one at a time (TcpStore clients)", "[token]") {
  TcpStoreServer server;
  TcpStoreOptions options;
  options.timeout = kGuard;
  contend([&](int) {
    return std::make_shared<TcpStore>("127.0.0.1", server.port(), options);
  });
  TcpStore check("127.0.0.1", server.port(), options);
  CHECK(check.add("entries", 0) == 100);
}
