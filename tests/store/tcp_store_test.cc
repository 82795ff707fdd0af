// TcpStore against TcpStoreServer across real processes on 127.0.0.1:
// contention, blocked gets woken from another process, timeouts, reconnects.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <set>
#include <sstream>

#include "common/error.h"
#include "store/call_bound.h"
#include "store/tcp_store.h"
#include "store/tcp_store_server.h"
#include "tests/util/subprocess.h"

using namespace switchboard;
using namespace std::chrono_literals;

namespace {

TcpStore connect(const std::string& port) {
  TcpStoreOptions options;
  options.timeout = 60s;
  return TcpStore("127.0.0.1", static_cast<uint16_t>(std::stoi(port)), options);
}

}  // namespace

// args: port, count. Prints every value add() returned, one per line.
SB_CHILD_MAIN(adder) {
  TcpStore store = connect(args.at(0));
  int count = std::stoi(args.at(1));
  for (int i = 0; i < count; ++i) fmt::print("{}\n", store.add("counter", 1));
  return 0;
}

// args: port, id. Races for "leader" and prints the winner.
SB_CHILD_MAIN(candidate) {
  TcpStore store = connect(args.at(0));
  Bytes winner = store.compare_set("leader", {}, to_bytes(args.at(1)));
  fmt::print("{}\n", to_string(winner));
  return 0;
}

// args: port, key. Blocks in get() and prints the value.
SB_CHILD_MAIN(getter) {
  TcpStore store = connect(args.at(0));
  fmt::print("{}\n", to_string(store.get(args.at(1))));
  return 0;
}

// args: port, world_size. Counts itself in "init/" as a worker.
SB_CHILD_MAIN(worker) {
  TcpStoreOptions options;
  options.timeout = 60s;
  options.world_size = std::stoi(args.at(1));
  TcpStore store("127.0.0.1", static_cast<uint16_t>(std::stoi(args.at(0))), options);
  fmt::print("joined\n");
  return 0;
}

TEST_CASE("adds from four client processes are atomic", "[store][tcp][multiprocess]") {
  TcpStoreServer server;
  std::vector<sbtest::Subprocess> children;
  for (int i = 0; i < 4; ++i) {
    children.push_back(sbtest::spawn_child("adder", {std::to_string(server.port()), "100"}));
  }
  std::set<int64_t> seen;
  for (auto& child : children) {
    std::istringstream lines(child.read_all());
    for (int64_t value; lines >> value;) CHECK(seen.insert(value).second);
    CHECK(child.wait() == 0);
  }
  CHECK(seen.size() == 400);
  CHECK(*seen.begin() == 1);
  CHECK(*seen.rbegin() == 400);
}

TEST_CASE("exactly one of several processes wins a compare_set election",
          "[store][tcp][multiprocess]") {
  TcpStoreServer server;
  std::vector<sbtest::Subprocess> children;
  for (int i = 0; i < 4; ++i) {
    children.push_back(sbtest::spawn_child(
        "candidate", {std::to_string(server.port()), fmt::format("rank{}", i)}));
  }
  std::set<std::string> winners;
  for (auto& child : children) {
    winners.insert(child.read_line());
    CHECK(child.wait() == 0);
  }
  CHECK(winners.size() == 1);
}

TEST_CASE("a get blocked in one process is woken by a set in another",
          "[store][tcp][multiprocess]") {
  TcpStoreServer server;
  auto getter = sbtest::spawn_child("getter", {std::to_string(server.port()), "late"});
  TcpStore store("127.0.0.1", server.port());
  store.set("late", "woken");
  CHECK(getter.read_line() == "woken");
  CHECK(getter.wait() == 0);
}

TEST_CASE("a master waits for its workers through init/ and times out naming the count",
          "[store][tcp][multiprocess]") {
  TcpStoreOptions options;
  options.is_master = true;
  options.world_size = 3;
  options.wait_for_workers = false;  // the port is needed before waiting
  options.timeout = 60s;
  TcpStore master("127.0.0.1", 0, options);
  std::vector<sbtest::Subprocess> workers;
  for (int i = 0; i < 2; ++i) {
    workers.push_back(sbtest::spawn_child("worker", {std::to_string(master.port()), "3"}));
  }
  master.wait_for_workers(3);
  for (auto& worker : workers) CHECK(worker.wait() == 0);
  master.set_timeout(100ms);
  CHECK_THROWS_WITH(master.wait_for_workers(4), Catch::Contains("only 3 of 4"));
}

TEST_CASE("a client started before its server connects once the server listens",
          "[store][tcp]") {
  // Find a free port by binding a server, stop it, start the client first.
  uint16_t port = 0;
  {
    TcpStoreServer probe;
    port = probe.port();
  }
  auto getter = sbtest::spawn_child("getter", {std::to_string(port), "k"});
  TcpStoreServerOptions options;
  options.port = port;
  TcpStoreServer server(options);
  TcpStore store("127.0.0.1", port);
  store.set("k", "connected");
  CHECK(getter.read_line() == "connected");
  CHECK(getter.wait() == 0);
}

TEST_CASE("connecting to a port nobody listens on fails naming the address",
          "[store][tcp]") {
  uint16_t port = 0;
  {
    TcpStoreServer probe;
    port = probe.port();
  }
  TcpStoreOptions options;
  options.timeout = 200ms;
  CHECK_THROWS_WITH(TcpStore("127.0.0.1", port, options),
                    Catch::Contains(fmt::format("127.0.0.1:{}", port)));
}

TEST_CASE("a server that goes away fails calls with ConnectionError, and a new server is reached",
          "[store][tcp]") {
  auto server = std::make_unique<TcpStoreServer>();
  uint16_t port = server->port();
  TcpStoreOptions options;
  options.timeout = 5s;
  TcpStore store("127.0.0.1", port, options);
  store.set("a", "1");
  CHECK(store.add("n", 1) == 1);
  server->stop();
  CHECK_THROWS_AS(store.add("n", 1), ConnectionError);
  TcpStoreServerOptions again;
  again.port = port;
  server = std::make_unique<TcpStoreServer>(again);
  CHECK(store.add("n", 1) == 1);  // a fresh server: the old keys are gone
}

TEST_CASE("with its server gone, a call that would try to reconnect forever ends at the "
          "thread's StoreCallBound, naming the address",
          "[store][tcp][call_bound]") {
  auto server = std::make_unique<TcpStoreServer>();
  const uint16_t port = server->port();
  TcpStoreOptions options;
  options.timeout = Store::kNoTimeout;
  TcpStore store("127.0.0.1", port, options);
  store.set("a", "1");
  server->stop();
  StoreCallBound bound(std::chrono::steady_clock::now() + 200ms);
  // The first call may find the old connection broken at once; the next
  // ones reconnect, refused until the bound.
  for (int i = 0; i < 2; ++i) {
    try {
      (void)store.check({"a"});
      FAIL("check() answered without a server");
    } catch (const ConnectionError& e) {
      CHECK_THAT(e.what(), Catch::Contains(fmt::format("127.0.0.1:{}", port)));
    } catch (const TimeoutError& e) {
      CHECK_THAT(e.what(), Catch::Contains(fmt::format("127.0.0.1:{}", port)));
    }
  }
}

TEST_CASE("our client speaks PyTorch 2.x's numbering to our server, and a timed-out wait is "
          "cancelled there, so later replies stay in step",
          "[store][tcp]") {
  TcpStoreServer server;
  TcpStore store("127.0.0.1", server.port());
  // Our server answered the client's VALIDATE and PING: PyTorch 2.x's
  // numbering, which has CANCEL_WAIT.
  CHECK(store.server_speaks_torch2());
  CHECK(store.server_has_extensions());
  CHECK_THROWS_AS(store.wait({"missing"}, 50ms), TimeoutError);
  store.set("missing", "now");  // would release a stale wait, if one were left
  CHECK(store.add("x", 1) == 1);
  CHECK(store.add("x", 1) == 2);
  CHECK(server.num_connections() == 1);  // cancelled, not reconnected
}

TEST_CASE("the in-process master serves several clients and stops with its owner",
          "[store][tcp]") {
  TcpStoreOptions options;
  options.is_master = true;
  auto master = std::make_unique<TcpStore>("127.0.0.1", 0, options);
  REQUIRE(master->server() != nullptr);
  TcpStore other("127.0.0.1", master->port());
  master->set("shared", "yes");
  CHECK(to_string(other.get("shared")) == "yes");
  master.reset();
  CHECK_THROWS_AS(other.add("n", 1), ConnectionError);
}
