// TcpStoreServer under bad input, many clients and shutdown, plus the
// standalone store_server binary. Bad input has no error reply in this
// protocol: the server closes that one connection, counts a protocol error
// and keeps serving everyone else with every key intact.
#include <signal.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <set>
#include <thread>

#include "common/error.h"
#include "store/tcp_store_server.h"
#include "tests/store/raw_tcp_client.h"
#include "tests/util/subprocess.h"

using namespace switchboard;
using namespace sbtest;
using switchboard::tcpstore::QueryType;

namespace {

Bytes u64(uint64_t value) {
  Bytes out;
  switchboard::tcpstore::put_u64(out, value);
  return out;
}

bool closed(const std::string& how) { return how == "eof" || how == "reset"; }

// Returns the key count once every request `client` sent before was applied.
int64_t sync_count(RawTcpClient& client) {
  client.send(num_keys_request());
  return client.read_i64();
}

struct BadInput {
  const char* name;
  Bytes bytes;
  bool then_half_close = false;
};

}  // namespace

TEST_CASE("bad input closes only that connection and loses no key",
          "[store][server][bad-input]") {
  Bytes set_cut = set_request("key", "value");
  set_cut.resize(set_cut.size() - 3);
  auto input = GENERATE_COPY(values<BadInput>({
      {"unknown query code 13", hex({0x0d})},
      {"unknown query code 0xff", hex({0xff, 0, 0, 0})},
      {"a truncated frame, then end of stream", set_cut, true},
      {"an absurd key length 2^60", cat({hex({0x02}), u64(1ull << 60), hex({'k'})})},
      {"an absurd key count", cat({hex({0x05}), u64(1ull << 40)})},
      {"GET of a missing key", get_request("missing")},
      {"ADD on a non-integer value", add_request("text", 1)},
      {"MULTI_GET with a missing key", request(QueryType::kMultiGet, {"kept", "missing"})},
  }));
  INFO(input.name);
  TcpStoreServer server;
  RawTcpClient good(server.port());
  good.send(cat({set_request("kept", "v"), set_request("text", "abc"), num_keys_request()}));
  REQUIRE(good.read_i64() == 2);

  RawTcpClient bad(server.port());
  bad.send(input.bytes);
  if (input.then_half_close) bad.shutdown_write();
  CHECK(closed(bad.read_close()));
  CHECK(server.protocol_errors() == 1);

  // The connection opened before keeps working, with every key intact.
  good.send(cat({get_request("kept"), get_request("text"), num_keys_request(),
                 add_request("n", 1)}));
  CHECK(good.read_value() == to_bytes("v"));
  CHECK(good.read_value() == to_bytes("abc"));
  CHECK(good.read_i64() == 2);
  CHECK(good.read_i64() == 1);
  // And so does a new one.
  RawTcpClient fresh(server.port());
  fresh.send(num_keys_request());
  CHECK(fresh.read_i64() == 3);
  CHECK(server.protocol_errors() == 1);
}

TEST_CASE("replies queued before bad input are still sent, then the connection closes",
          "[store][server][bad-input]") {
  TcpStoreServer server;
  RawTcpClient client(server.port());
  client.send(cat({set_request("a", "1"), num_keys_request(), get_request("a"), hex({0xff})}));
  CHECK(client.read_i64() == 1);
  CHECK(client.read_value() == to_bytes("1"));
  CHECK(closed(client.read_close()));
}

TEST_CASE("a value over the configured limit closes the connection",
          "[store][server][bad-input]") {
  TcpStoreServerOptions options;
  options.limits.max_value_bytes = 16;
  TcpStoreServer server(options);
  RawTcpClient client(server.port());
  client.send(cat({set_request("ok", std::string(16, 'x')), num_keys_request()}));
  CHECK(client.read_i64() == 1);
  client.send(set_request("big", std::string(17, 'x')));
  CHECK(closed(client.read_close()));
  CHECK(server.protocol_errors() == 1);
}

TEST_CASE("a connection closed for bad input leaves no wait or watch behind",
          "[store][server][bad-input]") {
  TcpStoreServer server;
  RawTcpClient setter(server.port());
  RawTcpClient bad(server.port());
  bad.send(request(QueryType::kWatchKey, {"w"}));
  CHECK(bad.read_u8() == 3);
  bad.send(cat({wait_request({"w"}), num_keys_request()}));
  CHECK(bad.read_i64() == 0);
  bad.send(hex({0x0d}));
  CHECK(closed(bad.read_close()));
  setter.send(cat({set_request("w", "v"), delete_request("w"), set_request("w", "again")}));
  CHECK(setter.read_i64() == 1);
  CHECK(sync_count(setter) == 1);
}

TEST_CASE("ADD from many connections at once returns every value exactly once",
          "[store][server][concurrency]") {
  TcpStoreServer server;
  constexpr int kThreads = 4;
  constexpr int kAddsPerThread = 200;
  std::vector<std::vector<int64_t>> results(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      RawTcpClient client(server.port());
      for (int i = 0; i < kAddsPerThread; ++i) {
        client.send(add_request("counter", 1));
        results[t].push_back(client.read_i64());
      }
    });
  }
  for (auto& thread : threads) thread.join();
  std::set<int64_t> seen;
  for (const auto& values : results) seen.insert(values.begin(), values.end());
  CHECK(seen.size() == kThreads * kAddsPerThread);
  CHECK(*seen.begin() == 1);
  CHECK(*seen.rbegin() == kThreads * kAddsPerThread);
}

TEST_CASE("hundreds of idle connections are held and served", "[store][server][concurrency]") {
  TcpStoreServer server;
  std::vector<std::unique_ptr<RawTcpClient>> clients;
  for (int i = 0; i < 500; ++i) {
    clients.push_back(std::make_unique<RawTcpClient>(server.port()));
  }
  for (auto& client : clients) client->send(add_request("joined", 1));
  for (auto& client : clients) client->read_i64();
  CHECK(server.num_connections() == 500);
  CHECK(server.total_connections() == 500);
  RawTcpClient last(server.port());
  last.send(get_request("joined"));
  CHECK(last.read_value() == to_bytes("500"));
  clients.clear();
  CHECK(eventually([&] { return server.num_connections() == 1; }));
}

TEST_CASE("stop() closes every connection, parked waiters included, and is idempotent",
          "[store][server][lifecycle]") {
  TcpStoreServer server;
  RawTcpClient idle(server.port());
  RawTcpClient waiter(server.port());
  waiter.send(cat({wait_request({"never"}), num_keys_request()}));
  CHECK(waiter.read_i64() == 0);
  server.stop();
  CHECK(closed(idle.read_close()));
  CHECK(closed(waiter.read_close()));
  server.stop();
  CHECK(server.num_connections() == 0);
}

TEST_CASE("binding a port in use throws ConnectionError naming host and port",
          "[store][server][lifecycle]") {
  TcpStoreServer first;
  TcpStoreServerOptions options;
  options.port = first.port();
  std::string where = "127.0.0.1:" + std::to_string(first.port());
  CHECK_THROWS_MATCHES(TcpStoreServer(options), ConnectionError,
                       Catch::Matchers::Predicate<ConnectionError>(
                           [&](const ConnectionError& e) {
                             return std::string(e.what()).find(where) != std::string::npos;
                           },
                           "message names " + where));
}

TEST_CASE("the wildcard addresses accept IPv4 clients", "[store][server][lifecycle]") {
  std::string host = GENERATE(as<std::string>{}, "0.0.0.0", "::");
  if (host == "::" && !std::ifstream("/proc/net/if_inet6")) {
    WARN("no IPv6 on this machine; skipping \"::\"");
    return;
  }
  TcpStoreServerOptions options;
  options.host = host;
  TcpStoreServer server(options);
  CHECK(server.host() == host);
  RawTcpClient client(server.port());
  client.send(num_keys_request());
  CHECK(client.read_i64() == 0);
}

TEST_CASE("store_server prints its port, serves, and exits 0 on SIGTERM",
          "[store][server][tool]") {
  Subprocess server({runfile("tools/store_server/store_server"), "--host", "127.0.0.1",
                     "--port", "0"});
  std::string line = server.read_line(std::chrono::seconds(30));
  REQUIRE(line.rfind("port=", 0) == 0);
  int port = std::stoi(line.substr(5));
  REQUIRE(port > 0);
  {
    RawTcpClient client(static_cast<uint16_t>(port));
    client.send(cat({set_request("k", "v"), get_request("k")}));
    CHECK(client.read_value() == to_bytes("v"));
  }
  server.kill(SIGTERM);
  CHECK(server.wait() == 0);
}

TEST_CASE("store_server rejects bad flags with exit code 2", "[store][server][tool]") {
  std::vector<std::string> bad = GENERATE(as<std::vector<std::string>>{},
                                          std::vector<std::string>{"--bogus"},
                                          std::vector<std::string>{"--port"},
                                          std::vector<std::string>{"--port", "70000"},
                                          std::vector<std::string>{"--port", "x"});
  std::vector<std::string> argv = {runfile("tools/store_server/store_server")};
  argv.insert(argv.end(), bad.begin(), bad.end());
  Subprocess server(argv);
  CHECK(server.read_all(std::chrono::seconds(30)).empty());
  CHECK(server.wait() == 2);
}
