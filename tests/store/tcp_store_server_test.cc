// TcpStoreServer semantics over raw sockets: PyTorch 1.13's captured
// exchanges byte for byte (as captured from a PyTorch 1.13 client), WAIT parking
// and release, watch events, pipelining and fragmentation, and the 2.x
// extensions. Bad input and lifecycle: tcp_store_server_bad_input_test.cc.
//
// No test relies on timing: a parked WAIT is known to be registered once a
// GETNUMKEYS sent after it on the same connection has been answered.
#include <catch2/catch.hpp>

#include "store/tcp_store_server.h"
#include "tests/store/raw_tcp_client.h"

using namespace switchboard;
using namespace sbtest;
using switchboard::tcpstore::QueryType;

namespace {

// Sends WAIT `keys` and proves it is parked: the GETNUMKEYS behind it is
// answered first (a STOP_WAITING would have come before the count).
void park_wait(RawTcpClient& client, const std::vector<std::string>& keys) {
  client.send(cat({wait_request(keys), num_keys_request()}));
  client.read(8);
}

// Returns after every request `client` sent before was applied.
int64_t sync(RawTcpClient& client) {
  client.send(num_keys_request());
  return client.read_i64();
}

}  // namespace

TEST_CASE("PyTorch's captured set and get exchange gets identical bytes",
          "[store][server][bytes]") {
  TcpStoreServer server;
  RawTcpClient client(server.port());
  // set("a", b"xyz"), then get("a") = WAIT ["/a"] + GET "/a".
  client.send(hex({0x00, 0x02, 0, 0, 0, 0, 0, 0, 0, 0x2f, 0x61, 0x03, 0, 0, 0, 0, 0, 0, 0,
                   0x78, 0x79, 0x7a}));
  client.send(hex({0x05, 0x01, 0, 0, 0, 0, 0, 0, 0, 0x02, 0, 0, 0, 0, 0, 0, 0, 0x2f, 0x61}));
  CHECK(client.read(1) == hex({0x00}));
  client.send(hex({0x02, 0x02, 0, 0, 0, 0, 0, 0, 0, 0x2f, 0x61}));
  CHECK(client.read(11) == hex({0x03, 0, 0, 0, 0, 0, 0, 0, 0x78, 0x79, 0x7a}));
}

// Bytes as written in a capture: "00cef7853c".
Bytes from_hex(const std::string& text) {
  Bytes out;
  for (size_t i = 0; i + 1 < text.size(); i += 2) {
    out.push_back(static_cast<uint8_t>(std::stoi(text.substr(i, 2), nullptr, 16)));
  }
  return out;
}

TEST_CASE("PyTorch 2.11's captured session (VALIDATE, PING, set, get, add, check) gets "
          "identical bytes",
          "[store][server][bytes][torch2]") {
  TcpStoreServer server;
  RawTcpClient client(server.port());
  // TCPStore("127.0.0.1", port, is_master=False): VALIDATE with the magic
  // and PING with its nonce (the pid), in one packet; the nonce comes back.
  client.send(from_hex("00cef7853c0d96750000"));
  CHECK(client.read(4) == from_hex("96750000"));
  // set("a", "xyz"), get("a") = WAIT ["/a"] + GET "/a", add("cnt", 5),
  // check(["a"]), numbered as PyTorch 2.x numbers them.
  client.send(from_hex("0102000000000000002f61030000000000000078797a"));
  client.send(from_hex("06010000000000000002000000000000002f61"));
  CHECK(client.read(1) == from_hex("00"));
  client.send(from_hex("0302000000000000002f61"));
  CHECK(client.read(11) == from_hex("030000000000000078797a"));
  client.send(from_hex("0404000000000000002f636e740500000000000000"));
  CHECK(client.read(8) == from_hex("0500000000000000"));
  client.send(from_hex("05010000000000000002000000000000002f61"));
  CHECK(client.read(1) == from_hex("00"));
  // A PyTorch 1.13 client on another connection sees the same keys.
  RawTcpClient legacy(server.port());
  legacy.send(get_request("/a"));
  CHECK(legacy.read_value() == to_bytes("xyz"));
}

TEST_CASE("PyTorch 2.x's queue requests close the connection, which the server names; other "
          "connections go on",
          "[store][server][torch2]") {
  TcpStoreServer server;
  RawTcpClient other(server.port());
  other.send(set_request("/k", "v"));
  for (int type : {14, 15, 16, 17}) {
    INFO("query type " << type);
    RawTcpClient client(server.port());
    client.send(from_hex("00cef7853c"));
    client.send(Bytes{static_cast<uint8_t>(type), 1, 0, 0, 0, 0, 0, 0, 0, 'q'});
    CHECK_THAT(client.read_close(), Catch::Equals("eof") || Catch::Equals("reset"));
  }
  // A VALIDATE with another magic is refused too.
  RawTcpClient wrong(server.port());
  wrong.send(from_hex("00cef7853c00cef7853d"));
  CHECK_THAT(wrong.read_close(), Catch::Equals("eof") || Catch::Equals("reset"));
  other.send(get_request("/k"));
  CHECK(other.read_value() == to_bytes("v"));
}

TEST_CASE("ADD replies the new value as i64 and stores it as ASCII",
          "[store][server][bytes]") {
  TcpStoreServer server;
  RawTcpClient client(server.port());
  client.send(add_request("/cnt", 5));
  CHECK(client.read_i64() == 5);
  // add("cnt", -7) as captured: f9 ff.. -> fe ff.. (-2).
  client.send(hex({0x03, 0x04, 0, 0, 0, 0, 0, 0, 0, 0x2f, 0x63, 0x6e, 0x74,
                   0xf9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}));
  CHECK(client.read(8) == hex({0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}));
  client.send(get_request("/cnt"));
  CHECK(client.read_value() == to_bytes("-2"));
}

TEST_CASE("ADD parses like stoll and wraps on overflow", "[store][server]") {
  TcpStoreServer server;
  RawTcpClient client(server.port());
  client.send(cat({set_request("ws", " 7"), add_request("ws", 1), set_request("suffix", "5abc"),
                   add_request("suffix", 0), set_request("plus", "+8"),
                   add_request("plus", 1), add_request("max", INT64_MAX),
                   add_request("max", 1), get_request("max")}));
  CHECK(client.read_i64() == 8);
  CHECK(client.read_i64() == 5);
  CHECK(client.read_i64() == 9);
  CHECK(client.read_i64() == INT64_MAX);
  CHECK(client.read_i64() == INT64_MIN);
  CHECK(client.read_value() == to_bytes(std::to_string(INT64_MIN)));
}

TEST_CASE("COMPARE_SET follows PyTorch's four cases", "[store][server][bytes]") {
  TcpStoreServer server;
  RawTcpClient client(server.port());
  auto cas = [&](const std::string& key, const std::string& expected,
                 const std::string& desired) {
    client.send(request(QueryType::kCompareSet, {key},
                        {to_bytes(expected), to_bytes(desired)}));
    return to_string(client.read_value());
  };
  // Missing key, non-empty expected: replies `expected`, creates nothing.
  CHECK(cas("/cs_missing", "exp", "new") == "exp");
  client.send(request(QueryType::kCheck, {"/cs_missing"}));
  CHECK(client.read_u8() == 1);
  CHECK(sync(client) == 0);
  // Missing key, empty expected: creates.
  CHECK(cas("k", "", "one") == "one");
  // Present and equal: replaces. A prefix does not match.
  CHECK(cas("k", "one", "two") == "two");
  CHECK(cas("k", "tw", "three") == "two");
  // Present and different: current value, nothing written.
  CHECK(cas("k", "zzz", "four") == "two");
  // An empty present value matches an empty expected.
  client.send(set_request("empty", ""));
  CHECK(cas("empty", "", "filled") == "filled");
  CHECK(sync(client) == 2);
}

TEST_CASE("GETNUMKEYS, DELETE_KEY and CHECK reply as captured", "[store][server][bytes]") {
  TcpStoreServer server;
  RawTcpClient client(server.port());
  client.send(cat({set_request("/a", "1"), set_request("/b", "2"), set_request("init/", "1")}));
  client.send(hex({0x06}));
  CHECK(client.read(8) == hex({0x03, 0, 0, 0, 0, 0, 0, 0}));
  client.send(hex({0x08, 0x02, 0, 0, 0, 0, 0, 0, 0, 0x2f, 0x61}));
  CHECK(client.read(8) == hex({0x01, 0, 0, 0, 0, 0, 0, 0}));
  client.send(hex({0x08, 0x02, 0, 0, 0, 0, 0, 0, 0, 0x2f, 0x61}));
  CHECK(client.read(8) == hex({0, 0, 0, 0, 0, 0, 0, 0}));
  // check(["k1"]): NOT_READY, then READY once set.
  Bytes check_k1 = hex({0x04, 0x01, 0, 0, 0, 0, 0, 0, 0, 0x03, 0, 0, 0, 0, 0, 0, 0,
                        0x2f, 0x6b, 0x31});
  client.send(check_k1);
  CHECK(client.read(1) == hex({0x01}));
  client.send(cat({set_request("/k1", "v"), check_k1}));
  CHECK(client.read(1) == hex({0x00}));
  client.send(request(QueryType::kCheck, {}));
  CHECK(client.read_u8() == 0);
  client.send(request(QueryType::kCheck, {"/k1", "/a"}));
  CHECK(client.read_u8() == 1);
}

TEST_CASE("keys and values are opaque bytes", "[store][server]") {
  TcpStoreServer server;
  RawTcpClient client(server.port());
  std::string all_bytes;
  for (int i = 0; i < 256; ++i) all_bytes += static_cast<char>(i);
  client.send(cat({set_request("", "empty key"), set_request(all_bytes, all_bytes),
                   set_request("empty value", ""), get_request(""), get_request(all_bytes),
                   get_request("empty value")}));
  CHECK(client.read_value() == to_bytes("empty key"));
  CHECK(client.read_value() == to_bytes(all_bytes));
  CHECK(client.read_value().empty());
}

TEST_CASE("a watched key reports every change with PyTorch's event bytes",
          "[store][server][watch][bytes]") {
  TcpStoreServer server;
  RawTcpClient watcher(server.port());
  RawTcpClient writer(server.port());
  watcher.send(hex({0x07, 0x02, 0, 0, 0, 0, 0, 0, 0, 0x2f, 0x77}));
  CHECK(watcher.read(1) == hex({0x03}));
  writer.send(cat({set_request("/w", "v1"), set_request("/w", "v2"), set_request("/w", "v3"),
                   delete_request("/w")}));
  CHECK(writer.read_i64() == 1);
  // The captured events, byte for byte.
  CHECK(watcher.read(29) == hex({0x01, 0x02, 0, 0, 0, 0, 0, 0, 0, 0x2f, 0x77,  //
                                 0, 0, 0, 0, 0, 0, 0, 0,                       //
                                 0x02, 0, 0, 0, 0, 0, 0, 0, 0x76, 0x31}));
  CHECK(watcher.read(31) == hex({0x00, 0x02, 0, 0, 0, 0, 0, 0, 0, 0x2f, 0x77,  //
                                 0x02, 0, 0, 0, 0, 0, 0, 0, 0x76, 0x31,        //
                                 0x02, 0, 0, 0, 0, 0, 0, 0, 0x76, 0x32}));
  CHECK(watcher.read(31) == event(0, "/w", "v2", "v3"));
  CHECK(watcher.read(29) == hex({0x02, 0x02, 0, 0, 0, 0, 0, 0, 0, 0x2f, 0x77,  //
                                 0x02, 0, 0, 0, 0, 0, 0, 0, 0x76, 0x33,        //
                                 0, 0, 0, 0, 0, 0, 0, 0}));
}

TEST_CASE("every kind of write sends watch events, a failed COMPARE_SET none",
          "[store][server][watch]") {
  TcpStoreServer server;
  RawTcpClient watcher(server.port());
  RawTcpClient writer(server.port());
  for (const char* key : {"n", "c", "ap", "ms"}) {
    watcher.send(request(QueryType::kWatchKey, {key}));
    CHECK(watcher.read_u8() == 3);
  }
  // Watching the same key twice still gives one event per change.
  watcher.send(request(QueryType::kWatchKey, {"n"}));
  CHECK(watcher.read_u8() == 3);
  auto cas = [](const std::string& expected, const std::string& desired) {
    return request(QueryType::kCompareSet, {"c"}, {to_bytes(expected), to_bytes(desired)});
  };
  writer.send(cat({add_request("n", 5), add_request("n", 2), cas("", "x"), cas("bad", "y"),
                   cas("x", "z"), request(QueryType::kAppend, {"ap"}, {to_bytes("12")}),
                   request(QueryType::kAppend, {"ap"}, {to_bytes("3")}),
                   request(QueryType::kMultiSet, {"ms", "other"},
                           {to_bytes("m1"), to_bytes("o")}),
                   set_request("unwatched", "u"), delete_request("n")}));
  writer.read(8 + 8 + 9 + 9 + 9 + 8);
  Bytes expected = cat({event(1, "n", "", "5"), event(0, "n", "5", "7"), event(1, "c", "", "x"),
                        event(0, "c", "x", "z"), event(1, "ap", "", "12"),
                        event(0, "ap", "12", "123"), event(1, "ms", "", "m1"),
                        event(2, "n", "7", "")});
  CHECK(watcher.read(expected.size()) == expected);
  // Nothing else is queued: the next reply on the watcher is its own.
  CHECK(sync(watcher) == 5);
}

TEST_CASE("a parked WAIT is released by a SET on another connection",
          "[store][server][wait]") {
  TcpStoreServer server;
  RawTcpClient waiter(server.port());
  RawTcpClient setter(server.port());
  park_wait(waiter, {"/k"});
  setter.send(set_request("/k", "v"));
  CHECK(waiter.read_u8() == 0);
  waiter.send(get_request("/k"));
  CHECK(waiter.read_value() == to_bytes("v"));
}

TEST_CASE("WAIT on keys that exist, or on none, replies at once", "[store][server][wait]") {
  TcpStoreServer server;
  RawTcpClient client(server.port());
  client.send(cat({wait_request({}), set_request("a", "1"), wait_request({"a", "a"})}));
  CHECK(client.read(2) == hex({0, 0}));
}

TEST_CASE("WAIT with duplicate keys gives one reply", "[store][server][wait]") {
  TcpStoreServer server;
  RawTcpClient waiter(server.port());
  RawTcpClient setter(server.port());
  park_wait(waiter, {"k", "k", "k"});
  setter.send(set_request("k", "v"));
  CHECK(waiter.read_u8() == 0);
  // A second STOP_WAITING would shift these bytes.
  CHECK(sync(waiter) == 1);
}

TEST_CASE("WAIT counts creations: set a, delete a, set b releases WAIT [a, b]",
          "[store][server][wait]") {
  TcpStoreServer server;
  RawTcpClient waiter(server.port());
  RawTcpClient setter(server.port());
  park_wait(waiter, {"a", "b"});
  setter.send(cat({set_request("a", "1"), delete_request("a")}));
  CHECK(setter.read_i64() == 1);
  setter.send(set_request("b", "2"));
  CHECK(waiter.read_u8() == 0);
}

TEST_CASE("every creating write releases waiters: ADD, COMPARE_SET, APPEND, MULTI_SET",
          "[store][server][wait]") {
  TcpStoreServer server;
  RawTcpClient waiter(server.port());
  RawTcpClient setter(server.port());
  park_wait(waiter, {"add", "cas", "app", "ms1", "ms2"});
  setter.send(cat({add_request("add", 1),
                   request(QueryType::kCompareSet, {"cas"}, {{}, to_bytes("v")}),
                   request(QueryType::kAppend, {"app"}, {to_bytes("v")}),
                   request(QueryType::kMultiSet, {"ms1"}, {to_bytes("v")})}));
  setter.read(8 + 9);
  CHECK(sync(waiter) == 4);  // still parked: ms2 is missing
  setter.send(request(QueryType::kMultiSet, {"ms2"}, {to_bytes("v")}));
  CHECK(waiter.read_u8() == 0);
}

TEST_CASE("one SET releases every connection waiting on the key", "[store][server][wait]") {
  TcpStoreServer server;
  std::vector<std::unique_ptr<RawTcpClient>> waiters;
  for (int i = 0; i < 5; ++i) {
    waiters.push_back(std::make_unique<RawTcpClient>(server.port()));
    park_wait(*waiters.back(), {"/barrier"});
  }
  RawTcpClient setter(server.port());
  setter.send(set_request("/barrier", "go"));
  for (auto& waiter : waiters) CHECK(waiter->read_u8() == 0);
}

TEST_CASE("a waiter that disconnected is forgotten when its key is set",
          "[store][server][wait]") {
  TcpStoreServer server;
  RawTcpClient setter(server.port());
  {
    RawTcpClient waiter(server.port());
    park_wait(waiter, {"/gone"});
  }
  REQUIRE(eventually([&] { return server.num_connections() == 1; }));
  setter.send(set_request("/gone", "v"));
  CHECK(sync(setter) == 1);
  RawTcpClient later(server.port());
  later.send(wait_request({"/gone"}));
  CHECK(later.read_u8() == 0);
}

TEST_CASE("a waiter's own later SET releases it, in order with its replies",
          "[store][server][wait]") {
  TcpStoreServer server;
  RawTcpClient client(server.port());
  client.send(cat({wait_request({"self"}), add_request("self", 3)}));
  // ADD replies first, then wakes the waiter.
  CHECK(client.read(9) == cat({i64(3), Bytes{0}}));
}

TEST_CASE("CANCEL_WAIT drops parked waits and replies WAIT_CANCELED",
          "[store][server][wait]") {
  TcpStoreServer server;
  RawTcpClient waiter(server.port());
  RawTcpClient setter(server.port());
  waiter.send(request(QueryType::kCancelWait));
  CHECK(waiter.read_u8() == 1);  // also fine with nothing parked
  waiter.send(cat({wait_request({"x"}), wait_request({"x", "y"}),
                   request(QueryType::kCancelWait)}));
  CHECK(waiter.read_u8() == 1);
  setter.send(cat({set_request("x", "1"), set_request("y", "2")}));
  CHECK(sync(setter) == 2);
  // No STOP_WAITING may arrive after the cancel: the count comes first.
  CHECK(sync(waiter) == 2);
}

TEST_CASE("pipelined requests get their replies in order, in one write or byte by byte",
          "[store][server][stream]") {
  bool bytewise = GENERATE(false, true);
  TcpStoreServer server;
  RawTcpClient client(server.port());
  Bytes requests = cat({set_request("a", "xyz"), set_request("b", ""), get_request("a"),
                        get_request("b"), num_keys_request(), add_request("c", 5),
                        wait_request({"a", "b"}), delete_request("b"),
                        request(QueryType::kCheck, {"a", "b"})});
  Bytes replies = cat({value("xyz"), value(""), i64(2), i64(5), Bytes{0}, i64(1), Bytes{1}});
  if (bytewise) {
    client.send_bytewise(requests);
  } else {
    client.send(requests);
  }
  CHECK(client.read(replies.size()) == replies);
}

TEST_CASE("a value larger than many reads round-trips", "[store][server][stream]") {
  TcpStoreServer server;
  RawTcpClient client(server.port());
  std::string big(5 * 1024 * 1024 + 7, 'x');
  for (size_t i = 0; i < big.size(); i += 4096) big[i] = static_cast<char>(i / 4096);
  client.send(cat({set_request("big", big), get_request("big")}));
  CHECK(client.read_value() == to_bytes(big));
}

TEST_CASE("APPEND, MULTI_SET and MULTI_GET work as PyTorch 2.x defines them",
          "[store][server][extensions]") {
  TcpStoreServer server;
  RawTcpClient client(server.port());
  client.send(cat({request(QueryType::kAppend, {"log"}, {to_bytes("a")}),
                   request(QueryType::kAppend, {"log"}, {to_bytes("bc")}),
                   request(QueryType::kMultiSet, {"k1", "k2", "k1"},
                           {to_bytes("1"), to_bytes(""), to_bytes("3")}),
                   request(QueryType::kMultiGet, {"k2", "log", "k1"}),
                   request(QueryType::kMultiGet, {}), num_keys_request()}));
  CHECK(client.read(8 + 0 + 8 + 3 + 8 + 1 + 8) ==
        cat({value(""), value("abc"), value("3"), i64(3)}));
}
