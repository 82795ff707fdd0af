// Interoperability with real PyTorch TCPStores: PyTorch's client against our
// server, and our client against PyTorch's server, with PyTorch 2.11 from
// PyPI in the project's virtual environment (@sb_venv, made by
// tools/setup), whose server runs with libuv (its default) and without.
// (PyTorch 1.13's numbering of the query types is checked without 1.13:
// tcp_store_test's LegacyServer, tcp_store_server_test's captured bytes.)
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "common/error.h"
#include "store/tcp_store.h"
#include "store/tcp_store_server.h"
#include "tests/util/subprocess.h"

using namespace switchboard;
using namespace std::chrono_literals;

namespace {

int finish(sbtest::Subprocess& python) {
  std::string output = python.read_all();
  INFO("python output:\n" << output);
  int status = python.wait();
  CHECK(output.find("ALL OK") != std::string::npos);
  return status;
}

// A PyTorch server to talk to.
struct Torch {
  const char* what;
  const char* server;  // the master's server: "libuv" or "classic"
  std::string python() const { return sbtest::runfile("external/sb_venv/python"); }
};

const Torch kTorch2Libuv{"PyTorch 2.11 (libuv server)", "libuv"};
const Torch kTorch2Classic{"PyTorch 2.11 (the server without libuv)", "classic"};

}  // namespace

TEST_CASE("a PyTorch TCPStore client works against our server for every operation",
          "[store][interop][torch]") {
  const Torch torch = kTorch2Libuv;  // its client is the same with either server
  INFO(torch.what);
  TcpStoreServer server;
  TcpStoreOptions options;
  options.timeout = 60s;
  TcpStore ours("127.0.0.1", server.port(), options);
  ours.set("from_cpp", "hello");
  sbtest::Subprocess python({torch.python(),
                             sbtest::runfile("tests/store/torch_store_client.py"),
                             "127.0.0.1", std::to_string(server.port()), "1"});
  CHECK(finish(python) == 0);
  // What PyTorch wrote is readable under the same names.
  CHECK(to_string(ours.get("from_torch")) == "torch-value");
  CHECK(to_string(ours.get("torch_done")) == "1");
  CHECK(ours.add("cnt", 0) == -2);
  CHECK(server.protocol_errors() == 0);
}

TEST_CASE("our client works against a PyTorch TCPStore master",
          "[store][interop][torch]") {
  const Torch torch = GENERATE(kTorch2Libuv, kTorch2Classic);
  INFO(torch.what);
  const std::vector<std::string> argv = {
      torch.python(), sbtest::runfile("tools/torch_store_server/torch_store_server.py"),
      "--until", "cpp_client", "--timeout", "60", "--server", torch.server};
  sbtest::Subprocess python(argv);
  std::string line = python.read_line();
  REQUIRE(line.rfind("port=", 0) == 0);
  uint16_t port = static_cast<uint16_t>(std::stoi(line.substr(5)));
  TcpStoreOptions options;
  options.timeout = 30s;
  TcpStore store("127.0.0.1", port, options);
  CHECK(to_string(store.get("from_torch")) == "torch-value");
  // PyTorch 2.x's server answered the client's VALIDATE and PING, and has
  // every query.
  CHECK(store.server_speaks_torch2());
  CHECK(store.server_has_extensions());
  store.set("from_cpp", "cpp-value");
  CHECK(store.add("cpp_cnt", 1) == 1);
  CHECK(store.add("cpp_cnt", 2) == 3);
  CHECK(to_string(store.compare_set("cas", {}, to_bytes("a"))) == "a");
  CHECK(to_string(store.compare_set("cas", to_bytes("x"), to_bytes("b"))) == "a");
  CHECK(store.check({"from_torch", "cas"}));
  CHECK(store.delete_key("cas"));
  CHECK_FALSE(store.check({"cas"}));
  // A timed-out wait is cancelled: a late STOP_WAITING cannot corrupt later
  // replies.
  try {
    store.wait({"late_key"}, 200ms);
    FAIL("wait returned for a missing key");
  } catch (const TimeoutError& e) {
    CHECK_THAT(e.what(), Catch::Contains("late_key"));
  }
  store.set("late_key", "now");
  CHECK(store.add("after_timeout", 1) == 1);
  CHECK(store.add("after_timeout", 1) == 2);
  // Operations PyTorch 1.13 lacked (our client emulates them there).
  store.append("appended", to_bytes("ab"));
  store.append("appended", to_bytes("cd"));
  store.multi_set({"m1", "m2"}, {to_bytes("one"), to_bytes("two")});
  auto values = store.multi_get({"m1", "m2"});
  REQUIRE(values.size() == 2);
  CHECK(to_string(values[1]) == "two");
  store.set("text", "abc");
  CHECK_THROWS_WITH(store.add("text", 1), Catch::Contains("not an integer"));
  store.set("cpp_done", "1");
  CHECK(finish(python) == 0);
}
