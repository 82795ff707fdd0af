// TcpStore against TcpStoreServer across real processes on 127.0.0.1:
// contention, blocked gets woken from another process, timeouts, reconnects.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

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

// Stands in for PyTorch 1.13's TCPStore server, whose numbering of the
// query types predates 2.x's: a connection that opens with 2.x's VALIDATE
// is closed at once, as 1.13 closes it (it reads a SET of a key it cannot
// hold); any other is relayed to `upstream`, our server, which reads a
// connection that did not validate in 1.13's numbering.
class LegacyServer {
 public:
  explicit LegacyServer(uint16_t upstream) : upstream_(upstream) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in at{};
    at.sin_family = AF_INET;
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(at);
    REQUIRE(::bind(listener_, reinterpret_cast<sockaddr*>(&at), length) == 0);
    REQUIRE(::listen(listener_, 16) == 0);
    REQUIRE(::getsockname(listener_, reinterpret_cast<sockaddr*>(&at), &length) == 0);
    port_ = ntohs(at.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~LegacyServer() {
    stopping_ = true;
    ::shutdown(listener_, SHUT_RDWR);
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int fd : open_) ::shutdown(fd, SHUT_RDWR);
    }
    acceptor_.join();
    for (std::thread& relay : relays_) relay.join();
    for (int fd : open_) ::close(fd);
    ::close(listener_);
  }
  uint16_t port() const { return port_; }
  int refused() const { return refused_; }

 private:
  void accept_loop() {
    while (!stopping_) {
      const int client = ::accept(listener_, nullptr, nullptr);
      if (client < 0) return;
      std::lock_guard<std::mutex> lock(mu_);
      open_.push_back(client);
      relays_.emplace_back([this, client] { relay(client); });
    }
  }
  int connect_upstream() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in at{};
    at.sin_family = AF_INET;
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    at.sin_port = htons(upstream_);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&at), sizeof(at)) != 0) {
      ::close(fd);
      return -1;
    }
    std::lock_guard<std::mutex> lock(mu_);
    open_.push_back(fd);
    return fd;
  }
  void relay(int client) {
    // The first query's type (1 byte) and what follows it (4 bytes): 2.x's
    // VALIDATE is type 0 followed by its magic.
    uint8_t first[5];
    size_t got = 0;
    while (got < sizeof(first)) {
      const ssize_t n = ::read(client, first + got, sizeof(first) - got);
      if (n <= 0) return;
      got += static_cast<size_t>(n);
    }
    uint32_t magic;
    std::memcpy(&magic, first + 1, sizeof(magic));
    if (first[0] == 0 && magic == 0x3C85F7CE) {
      ++refused_;
      ::shutdown(client, SHUT_RDWR);
      return;
    }
    const int server = connect_upstream();
    if (server < 0 || ::write(server, first, sizeof(first)) != sizeof(first)) return;
    pollfd fds[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
    uint8_t buffer[64 * 1024];
    while (::poll(fds, 2, -1) > 0) {
      for (int i = 0; i < 2; ++i) {
        if (fds[i].revents == 0) continue;
        const ssize_t n = ::read(fds[i].fd, buffer, sizeof(buffer));
        if (n <= 0 || ::write(fds[1 - i].fd, buffer, static_cast<size_t>(n)) != n) {
          ::shutdown(client, SHUT_RDWR);
          ::shutdown(server, SHUT_RDWR);
          return;
        }
      }
    }
  }

  const uint16_t upstream_;
  int listener_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> refused_{0};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<int> open_;  // every socket, shut down and closed at the end
  std::vector<std::thread> relays_;
};

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

TEST_CASE("against a server of PyTorch 1.13's numbering, our client falls back to it when "
          "the server closes at the VALIDATE, and every operation works",
          "[store][tcp]") {
  TcpStoreServer server;
  LegacyServer legacy(server.port());
  TcpStoreOptions options;
  options.timeout = 30s;
  TcpStore store("127.0.0.1", legacy.port(), options);
  CHECK_FALSE(store.server_speaks_torch2());
  CHECK(legacy.refused() == 1);
  store.set("a", "xyz");
  CHECK(to_string(store.get("a")) == "xyz");
  CHECK(store.add("n", 2) == 2);
  CHECK(to_string(store.compare_set("cas", {}, to_bytes("v"))) == "v");
  CHECK(store.check({"a", "cas"}));
  CHECK(store.delete_key("cas"));
  CHECK_FALSE(store.check({"cas"}));
  CHECK(store.num_keys() >= 2);
  CHECK_THROWS_AS(store.wait({"missing"}, 50ms), TimeoutError);
  CHECK(store.add("n", 1) == 3);
  // Our server took every query in 1.13's numbering: a key set through the
  // relay is the key a 2.x client reads directly.
  TcpStore direct("127.0.0.1", server.port(), options);
  CHECK(direct.server_speaks_torch2());
  CHECK(to_string(direct.get("a")) == "xyz");
  CHECK(server.protocol_errors() == 0);
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
