// MembershipToken: mutual exclusion over a HashStore and over a TcpStore
// with real clients, the holder named in timeouts, a dead holder's lease
// taken over, a lost lease reported by renew() and release(), and leases
// that never depend on clocks agreeing.
//
// Clocks: a token measures by the Clock it is given (std::chrono's steady
// clock by default), and nothing compares two tokens' clocks. The tests
// give tokens clocks offset by minutes either way, as the clocks of
// different hosts are (steady clocks count from each host's boot, wall
// clocks drift), and check that acquire, release, takeover and renewal
// behave as with one clock. Wall clocks are read nowhere in the token; the
// older version's values, which carried a wall-clock expiry, show that the
// time in them is ignored.
//
// A dead holder is a token that stops renewing and never releases (as a
// killed process does), or a value written straight into the Store: that
// is all a killed process leaves behind. Waits are bounded; the durations
// are leases, acquire() timeouts and, where a holder must stay alive, its
// renewals every 20 ms against a lease 30 times as long. Elapsed times are
// checked against a lease from below (the token never takes over early,
// whatever the scheduling) and against a generous bound from above.
#include "rendezvous/membership_token.h"

#include <fmt/format.h>

#include <algorithm>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "store/hash_store.h"
#include "store/tcp_store.h"
#include "store/tcp_store_server.h"
#include "tests/util/subprocess.h"
#include "tests/util/threads.h"

using namespace switchboard;
using namespace std::chrono_literals;
using rendezvous::MembershipToken;
using testing::on_threads;
using testing::rethrow_first;
using Steady = std::chrono::steady_clock;

namespace {

constexpr auto kGuard = 30'000ms;
// How much later than its lease a waiter may take a dead holder's token
// over: its polling (at most 50 ms) plus room for a loaded machine.
constexpr auto kSlack = 3'000ms;
const std::string kKey = "rpc/dyn/token";

std::string value_of(Store& store) {
  const Bytes bytes = store.get(kKey);
  return std::string(bytes.begin(), bytes.end());
}

void set_value(Store& store, const std::string& value) {
  store.set(kKey, Bytes(value.begin(), value.end()));
}

// A token value as this version writes it (docs/wire_formats.md).
std::string token_value(const std::string& holder, int64_t lease_ms) {
  return fmt::format("{}\n9223372036854775807\n{}\nghost-nonce", holder, lease_ms);
}

// A clock that reads `offset` away from this host's steady clock: another
// host's clock, as far as the token can tell.
MembershipToken::Clock skewed(Steady::duration offset) {
  return [offset] { return Steady::now() + offset; };
}

// A clock that runs `factor` times as fast as the steady clock, so that a
// test waits out a 10 s lease in a fraction of that.
MembershipToken::Clock fast(int factor) {
  const Steady::time_point start = Steady::now();
  return [start, factor] { return start + (Steady::now() - start) * factor; };
}

int64_t ms_since(Steady::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Steady::now() - start).count();
}

// Both ways a clock can disagree with another: minutes ahead, and behind.
const std::vector<std::chrono::minutes> kSkews = {10min, -10min};

}  // namespace

TEST_CASE("the token names its holder and is free again after release", "[token]") {
  auto store = std::make_shared<HashStore>();
  MembershipToken a(store, kKey, "trainer-1");
  CHECK_FALSE(a.held());
  a.acquire(kGuard);
  CHECK(a.held());
  const std::string first = value_of(*store);
  CHECK(MembershipToken::holder_of(first) == "trainer-1");
  // The documented format: holder, the older versions' guard, the lease.
  CHECK_THAT(first, Catch::StartsWith("trainer-1\n9223372036854775807\n10000\n"));
  a.renew();
  CHECK(MembershipToken::holder_of(value_of(*store)) == "trainer-1");
  // A renewal writes a new value, so that waiters count the lease again.
  CHECK(value_of(*store) != first);
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
  CHECK_THROWS_AS(MembershipToken(store, kKey, "w", 0ms), std::invalid_argument);
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
    CHECK_THAT(message, Catch::Contains("held by \"ps\" (its value unchanged for "));
    CHECK_THAT(message, Catch::Contains("ms as \"trainer-3\" saw it; lease of 60000 ms ends in"));
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

TEST_CASE("two workers whose clocks disagree by minutes take turns", "[token][clock]") {
  for (const auto skew : kSkews) {
    INFO("a's clock is " << skew.count() << " min off b's");
    auto store = std::make_shared<HashStore>();
    MembershipToken a(store, kKey, "a", MembershipToken::kDefaultLease, skewed(skew));
    MembershipToken b(store, kKey, "b", MembershipToken::kDefaultLease, skewed(-skew));
    a.acquire(kGuard);
    // Held: b is kept out, whichever way its clock is off.
    CHECK_THROWS_AS(b.acquire(50ms), TimeoutError);
    a.release();
    // Released: b takes it at once, without waiting out a's lease.
    const auto start = Steady::now();
    b.acquire(kGuard);
    CHECK(ms_since(start) < kSlack.count());
    CHECK_THROWS_AS(a.acquire(50ms), TimeoutError);
    b.release();
    a.acquire(kGuard);
    a.release();
    CHECK(value_of(*store).empty());
  }
}

TEST_CASE("a dead holder's token is taken over after its lease as the waiter counts it, "
          "whichever way the clocks disagree",
          "[token][clock]") {
  for (const auto skew : kSkews) {
    INFO("the dead holder's clock is " << skew.count() << " min off the waiter's");
    auto store = std::make_shared<HashStore>();
    // The holder takes the token with a 250 ms lease, then stops renewing:
    // it is dead as far as the others can tell. The waiter's own lease is
    // the default 10 s; it waits out the holder's.
    MembershipToken dead(store, kKey, "dead-worker", 250ms, skewed(skew));
    dead.acquire(kGuard);
    MembershipToken waiter(store, kKey, "w1", MembershipToken::kDefaultLease, skewed(-skew));
    const auto start = Steady::now();
    // Well inside the lease: refused, naming the dead holder.
    CHECK_THROWS_WITH(waiter.acquire(1ms), Catch::Contains("held by \"dead-worker\""));
    // Waiting long enough: taken over one lease after the first look, not
    // before, and not much after.
    waiter.acquire(kGuard);
    const int64_t elapsed = ms_since(start);
    CHECK(elapsed >= 250);
    CHECK(elapsed < 250 + kSlack.count());
    CHECK(MembershipToken::holder_of(value_of(*store)) == "w1");
    // Should the holder come back, it learns that it lost the token.
    CHECK_THROWS_WITH(dead.renew(), Catch::Contains("\"dead-worker\" lost it to \"w1\""));
  }
}

TEST_CASE("a killed holder's value is taken over one lease after the waiter first sees it",
          "[token]") {
  auto store = std::make_shared<HashStore>();
  // What a worker killed mid-join leaves: its name and its 300 ms lease.
  set_value(*store, token_value("dead-worker", 300));
  MembershipToken b(store, kKey, "w1");
  const auto start = Steady::now();
  CHECK_THROWS_WITH(b.acquire(1ms), Catch::Contains("held by \"dead-worker\""));
  b.acquire(kGuard);
  const int64_t elapsed = ms_since(start);
  CHECK(elapsed >= 300);
  CHECK(elapsed < 300 + kSlack.count());
  CHECK(MembershipToken::holder_of(value_of(*store)) == "w1");
}

TEST_CASE("a renewal starts the waiter's count of the lease again", "[token]") {
  auto store = std::make_shared<HashStore>();
  MembershipToken holder(store, kKey, "holder", 900ms);
  holder.acquire(kGuard);
  MembershipToken waiter(store, kKey, "waiter");
  CHECK_THROWS_AS(waiter.acquire(500ms), TimeoutError);
  holder.renew();
  // 1000 ms and more since the waiter first looked, more than the lease,
  // but the value it sees now is about 500 ms old at most as it counts.
  try {
    waiter.acquire(500ms);
    FAIL("took over a token that was renewed within its lease");
  } catch (const TimeoutError& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("held by \"holder\""));
  }
  CHECK(MembershipToken::holder_of(value_of(*store)) == "holder");
}

TEST_CASE("a live holder that renews is never taken over, even by a waiter whose clock is "
          "far ahead or behind",
          "[token][clock]") {
  for (const auto skew : kSkews) {
    INFO("the waiter's clock is " << skew.count() << " min off the holder's");
    auto store = std::make_shared<HashStore>();
    // Both clocks run on one stepped time, `fake`, which the holder moves
    // 100 ms on (and renews) each time the waiter has read its clock, so
    // the waiter never sees the value unchanged for more than 100 ms of its
    // 600 ms lease, whatever the scheduling. No real time is waited for.
    const Steady::time_point base = Steady::now();
    std::atomic<int64_t> fake_ms{0};
    std::atomic<uint64_t> waiter_reads{0};
    MembershipToken holder(store, kKey, "holder", 600ms, [&, skew] {
      return base - skew + std::chrono::milliseconds(fake_ms.load());
    });
    holder.acquire(kGuard);
    MembershipToken waiter(store, kKey, "waiter", 600ms, [&, skew] {
      ++waiter_reads;
      return base + skew + std::chrono::milliseconds(fake_ms.load());
    });
    std::atomic<bool> done{false};
    std::string outcome;  // written by the waiter's thread, read after it ended
    rethrow_first(on_threads(2, [&](int rank) {
      if (rank == 0) {
        uint64_t seen = waiter_reads.load();
        while (!done.load()) {
          if (waiter_reads.load() == seen) {
            std::this_thread::yield();
            continue;
          }
          seen = waiter_reads.load();
          fake_ms += 100;
          holder.renew();
        }
        return;
      }
      // Three leases' worth of waiting (by its clock): never long enough.
      try {
        waiter.acquire(1'800ms);
        outcome = "took over a token whose holder renews it";
      } catch (const TimeoutError& e) {
        outcome = e.what();
      }
      done = true;
    }));
    CHECK_THAT(outcome, Catch::Contains("held by \"holder\""));
    CHECK(holder.held());
    holder.release();
    waiter.acquire(kGuard);
  }
}

TEST_CASE("values this version cannot read are held for the default lease from first sight, "
          "whatever time they carry",
          "[token][clock]") {
  const int64_t wall_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
  struct Case {
    std::string value;
    std::string holder;  // as named in the timeout
  };
  const std::string older = "\"old-worker\" (an older version's value unchanged for";
  const std::string unknown = "an unknown holder (the value \"";
  static constexpr char kHostile[] = "nul\0and \"quotes\" and \x01\xff";
  const std::vector<Case> cases = {
      // An older version's values: an expiry in its wall-clock time, here
      // long past (a clock behind) and far ahead. Neither is trusted.
      {fmt::format("old-worker\n{}\nabc", wall_ms - 600'000), older},
      {fmt::format("old-worker\n{}\nabc", wall_ms + 600'000), older},
      // Bytes that are no token value.
      {"garbage without a lease", unknown},
      {"\n\n\n", unknown},
      {"\n9223372036854775807\n300\nn", unknown},  // no holder
      {"x\n9223372036854775807\n-5\nn", unknown},
      {"x\n9223372036854775807\n0\nn", unknown},
      {"x\n9223372036854775807\n99999999999999999999999\nn", unknown},
      {"x\n9223372036854775807\n300ms\nn", unknown},
      {"x\n1\n300\nn", unknown},
      {"x\n9223372036854775807\n300\nn\nmore", unknown},
      {std::string(kHostile, sizeof(kHostile) - 1), unknown},
      {std::string(1 << 20, '\xfe'), unknown},
  };
  for (const Case& c : cases) {
    INFO("value: " << c.value.substr(0, 80));
    auto store = std::make_shared<HashStore>();
    set_value(*store, c.value);
    // A clock 100 times as fast: the 10 s default lease passes in 100 ms.
    const MembershipToken::Clock clock = fast(100);
    MembershipToken waiter(store, kKey, "w0", 300ms, clock);
    const auto start = clock();
    try {
      waiter.acquire(1ms);
      FAIL("took over a value it cannot read at first sight");
    } catch (const TimeoutError& e) {
      const std::string message = e.what();
      CHECK_THAT(message, Catch::Contains("held by " + c.holder));
      CHECK_THAT(message, Catch::Contains("lease of 10000 ms, assumed, ends in"));
      // Hostile bytes come back escaped and cut short.
      CHECK(message.size() < 1'000);
      CHECK(std::none_of(message.begin(), message.end(), [](char ch) {
        return static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) >= 0x7f;
      }));
    }
    waiter.acquire(600'000ms);  // by the fast clock: 6 s
    CHECK(clock() - start >= MembershipToken::kDefaultLease);
    CHECK(MembershipToken::holder_of(value_of(*store)) == "w0");
  }
  // A worker whose own lease is longer than the default assumes its own.
  auto store = std::make_shared<HashStore>();
  set_value(*store, "garbage");
  MembershipToken patient(store, kKey, "w1", 20'000ms);
  CHECK_THROWS_WITH(patient.acquire(1ms),
                    Catch::Contains("lease of 20000 ms, assumed, ends in"));
  // A lease as long as an int64 holds, too long for the clock's
  // nanoseconds: still a lease that has not run out after 100 s (by a
  // clock a million times as fast, 100 ms).
  set_value(*store, token_value("greedy", 9'223'372'036'854'775'806));
  MembershipToken waiter(store, kKey, "w2", 300ms, fast(1'000'000));
  CHECK_THROWS_WITH(waiter.acquire(100'000ms), Catch::Contains("held by \"greedy\""));
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
  // A token whose key was deleted under its holder: renew() says so.
  store->delete_key(kKey);
  CHECK_THROWS_WITH(next2.renew(), Catch::Contains("the token's key was deleted"));
}

namespace {

// Four workers each take the token 25 times; inside, they check that
// nobody else is inside (a plain counter in the Store: a second holder
// would see it at 1). Their clocks disagree by up to 40 minutes.
void contend(const std::function<std::shared_ptr<Store>(int)>& connect) {
  const std::vector<std::chrono::minutes> skews = {-20min, -1min, 1min, 20min};
  rethrow_first(on_threads(4, [&](int rank) {
    std::shared_ptr<Store> store = connect(rank);
    MembershipToken token(store, kKey, fmt::format("w{}", rank), MembershipToken::kDefaultLease,
                          skewed(skews[rank]));
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

TEST_CASE("concurrent workers hold the token one at a time, and a dead holder's token is "
          "taken over, on PyTorch 2.11's own TCPStore server (torchrun's agent store)",
          "[token][torch]") {
  // PyTorch 2.11's server (libuv, as torchrun's agent runs it), from the
  // project's virtual environment (@sb_venv). (The token also holds on
  // PyTorch 1.13's server, which differs from ours where the token leans on
  // it: compare_set on a missing key with a non-empty expected value
  // answers that value without writing it, and a WAIT is not woken by a key
  // that compare_set created. It was checked there until Debian's 1.13 left
  // the test machines.)
  const std::string python_path = sbtest::runfile("external/sb_venv/python");
  if (::access(python_path.c_str(), X_OK) != 0) {
    std::printf("skipped: no %s (the server is PyTorch's)\n", python_path.c_str());
    return;
  }
  sbtest::Subprocess python(
      {python_path, sbtest::runfile("tools/torch_store_server/torch_store_server.py")});
  const std::string line = python.read_line();
  REQUIRE(line.rfind("port=", 0) == 0);
  const auto port = static_cast<uint16_t>(std::stoi(line.substr(5)));
  TcpStoreOptions options;
  options.timeout = kGuard;
  auto connect = [&] { return std::make_shared<TcpStore>("127.0.0.1", port, options); };
  REQUIRE(connect()->server_has_extensions());
  contend([&](int) { return connect(); });
  CHECK(connect()->add("entries", 0) == 100);

  // A holder that died (its value stays) is taken over one lease after the
  // waiter first saw it.
  std::shared_ptr<Store> store = connect();
  set_value(*store, token_value("dead-worker", 300));
  MembershipToken waiter(store, kKey, "w1", 300ms);
  const auto start = Steady::now();
  waiter.acquire(kGuard);
  CHECK(ms_since(start) >= 300);
  CHECK(MembershipToken::holder_of(value_of(*store)) == "w1");
  waiter.release();
  // A renewal after the token was deleted, which torch's compare_set would
  // answer as a success, is caught.
  MembershipToken holder(store, kKey, "holder");
  holder.acquire(kGuard);
  store->delete_key(kKey);
  CHECK_THROWS_WITH(holder.renew(), Catch::Contains("the token's key was deleted"));
}
