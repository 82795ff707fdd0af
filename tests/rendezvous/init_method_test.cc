// rendezvous(): init_method resolution (env://, tcp://, file://), rank and
// world size from the torchrun, SLURM and Open MPI variables, who hosts the
// TcpStore, and every malformed input refused with a message naming it.
//
// Only 127.0.0.1 and ephemeral ports; every blocking wait is bounded by the
// rendezvous timeout.
#include "rendezvous/init_method.h"

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/error.h"
#include "store/file_store.h"
#include "store/store.h"
#include "store/tcp_store.h"
#include "store/tcp_store_server.h"

using namespace switchboard;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;

namespace {

constexpr std::chrono::milliseconds kTimeout = 5s;

const char* const kVariables[] = {
    "RANK",         "WORLD_SIZE",           "SLURM_PROCID",
    "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "MASTER_ADDR",  "MASTER_PORT",          "SWITCHBOARD_STORE",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT",
    "SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST", "SLURM_JOB_ID",
    "LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK",
};

// Saves every variable the tests touch, clears them, and restores them on
// destruction.
class EnvGuard {
 public:
  EnvGuard() {
    for (const char* name : kVariables) {
      const char* value = std::getenv(name);
      saved_.emplace_back(name, value ? std::optional<std::string>(value) : std::nullopt);
      ::unsetenv(name);
    }
  }
  ~EnvGuard() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name, value->c_str(), 1);
      } else {
        ::unsetenv(name);
      }
    }
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

  void set(const char* name, const std::string& value) {
    ::setenv(name, value.c_str(), 1);
  }

 private:
  std::vector<std::pair<const char*, std::optional<std::string>>> saved_;
};

// A fresh directory under the test's temporary directory, removed at the end.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string templ = std::string(base && *base ? base : "/tmp") + "/rendezvous.XXXXXX";
    REQUIRE(::mkdtemp(templ.data()) != nullptr);
    path_ = templ;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TcpStore* as_tcp(const rendezvous::Rendezvous& r) {
  return dynamic_cast<TcpStore*>(r.store.get());
}

// A plain client of the server at `port`, as another process would be.
TcpStore client(uint16_t port) {
  TcpStoreOptions options;
  options.timeout = kTimeout;
  return TcpStore("127.0.0.1", port, options);
}

// Runs `body`, expecting std::invalid_argument whose message contains every
// one of `parts`.
template <typename Body>
void require_invalid(Body&& body, const std::vector<std::string>& parts) {
  try {
    body();
    FAIL("no std::invalid_argument was thrown");
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    INFO("message: " << what);
    for (const auto& part : parts) CHECK_THAT(what, Contains(part));
  }
}

}  // namespace

TEST_CASE("env_rank and env_world_size: RANK, then SLURM, then Open MPI",
          "[rendezvous]") {
  EnvGuard env;
  CHECK(rendezvous::env_rank() == std::nullopt);
  CHECK(rendezvous::env_world_size() == std::nullopt);

  env.set("OMPI_COMM_WORLD_RANK", "5");
  env.set("OMPI_COMM_WORLD_SIZE", "6");
  CHECK(rendezvous::env_rank() == std::optional<int>(5));
  CHECK(rendezvous::env_world_size() == std::optional<int>(6));

  env.set("SLURM_PROCID", "3");
  env.set("SLURM_NTASKS", "4");
  CHECK(rendezvous::env_rank() == std::optional<int>(3));
  CHECK(rendezvous::env_world_size() == std::optional<int>(4));

  env.set("RANK", "1");
  env.set("WORLD_SIZE", "2");
  CHECK(rendezvous::env_rank() == std::optional<int>(1));
  CHECK(rendezvous::env_world_size() == std::optional<int>(2));

  // Each of the two is looked up on its own.
  ::unsetenv("WORLD_SIZE");
  CHECK(rendezvous::env_rank() == std::optional<int>(1));
  CHECK(rendezvous::env_world_size() == std::optional<int>(4));
  ::unsetenv("SLURM_NTASKS");
  CHECK(rendezvous::env_world_size() == std::optional<int>(6));

  // An empty variable counts as unset.
  env.set("RANK", "");
  CHECK(rendezvous::env_rank() == std::optional<int>(3));

  // Rank 0 and world size 1 are the smallest accepted.
  env.set("RANK", "0");
  env.set("WORLD_SIZE", "1");
  CHECK(rendezvous::env_rank() == std::optional<int>(0));
  CHECK(rendezvous::env_world_size() == std::optional<int>(1));
}

TEST_CASE("env_rank and env_world_size refuse malformed values, naming them",
          "[rendezvous]") {
  EnvGuard env;
  for (const char* variable : {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"}) {
    for (const char* bad : {"x", "-1", "1x", " 1", "99999999999"}) {
      INFO(variable << "=" << bad);
      EnvGuard inner;
      inner.set(variable, bad);
      require_invalid([] { (void)rendezvous::env_rank(); },
                      {variable, std::string("\"") + bad + "\""});
    }
  }
  for (const char* variable : {"WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"}) {
    for (const char* bad : {"x", "0", "-2", "3.0"}) {
      INFO(variable << "=" << bad);
      EnvGuard inner;
      inner.set(variable, bad);
      require_invalid([] { (void)rendezvous::env_world_size(); },
                      {variable, std::string("\"") + bad + "\""});
    }
  }
  // A malformed higher-priority variable is an error, not skipped.
  env.set("RANK", "x");
  env.set("SLURM_PROCID", "1");
  require_invalid([] { (void)rendezvous::env_rank(); }, {"RANK", "\"x\""});
}

TEST_CASE("env:// without MASTER_ADDR or MASTER_PORT names what is missing",
          "[rendezvous]") {
  EnvGuard env;
  env.set("RANK", "0");
  env.set("WORLD_SIZE", "1");

  SECTION("both missing") {
    require_invalid([] { rendezvous::rendezvous("env://", -1, std::nullopt, kTimeout); },
                    {"env://", "MASTER_ADDR and MASTER_PORT are not set"});
    // An empty init_method means env://.
    require_invalid([] { rendezvous::rendezvous("", -1, std::nullopt, kTimeout); },
                    {"MASTER_ADDR", "MASTER_PORT"});
  }
  SECTION("MASTER_ADDR missing") {
    env.set("MASTER_PORT", "0");
    try {
      rendezvous::rendezvous("env://", -1, std::nullopt, kTimeout);
      FAIL("no std::invalid_argument was thrown");
    } catch (const std::invalid_argument& e) {
      CHECK_THAT(e.what(), Contains("MASTER_ADDR is not set"));
      CHECK_THAT(e.what(), !Contains("MASTER_PORT"));
    }
  }
  SECTION("MASTER_PORT missing") {
    env.set("MASTER_ADDR", "127.0.0.1");
    try {
      rendezvous::rendezvous("env://", -1, std::nullopt, kTimeout);
      FAIL("no std::invalid_argument was thrown");
    } catch (const std::invalid_argument& e) {
      CHECK_THAT(e.what(), Contains("MASTER_PORT is not set"));
      CHECK_THAT(e.what(), !Contains("MASTER_ADDR"));
    }
  }
  SECTION("MASTER_PORT malformed") {
    env.set("MASTER_ADDR", "127.0.0.1");
    for (const char* bad : {"http", "65536", "-1", "80x"}) {
      INFO(bad);
      env.set("MASTER_PORT", bad);
      require_invalid([] { rendezvous::rendezvous("env://", -1, std::nullopt, kTimeout); },
                      {"MASTER_PORT", std::string("\"") + bad + "\""});
    }
  }
}

TEST_CASE("rank 0 given a store address that is not its own says so and what to set",
          "[rendezvous]") {
  EnvGuard env;
  env.set("RANK", "0");
  env.set("WORLD_SIZE", "2");
  // In the benchmarking range: no host here has it (nothing is sent; rank 0
  // only finds it cannot bind it).
  env.set("MASTER_ADDR", "198.18.255.254");
  env.set("MASTER_PORT", "29500");
  require_invalid([] { rendezvous::rendezvous("env://", -1, std::nullopt, kTimeout); },
                  {"rank 0 hosts the store at MASTER_ADDR 198.18.255.254:29500",
                   "not an address of this host",
                   "SWITCHBOARD_STORE=tcp://198.18.255.254:29500"});
  require_invalid(
      [] { rendezvous::rendezvous("tcp://198.18.255.254:29501", 0, 2, kTimeout); },
      {"init_method 198.18.255.254:29501", "not an address of this host"});
}

TEST_CASE("unknown schemes and malformed tcp:// URLs are refused, naming the URL",
          "[rendezvous]") {
  EnvGuard env;
  for (const char* url : {"foo://x", "tcp:/127.0.0.1:5", "127.0.0.1:5", "ENV://",
                          "env:/", "file:/tmp/x"}) {
    INFO(url);
    require_invalid([&] { rendezvous::rendezvous(url, 0, 1, kTimeout); },
                    {std::string("\"") + url + "\"", "env://", "tcp://", "file://"});
  }
  for (const char* url : {"tcp://nohost", "tcp://:5", "tcp://h:", "tcp://"}) {
    INFO(url);
    require_invalid([&] { rendezvous::rendezvous(url, 0, 1, kTimeout); },
                    {std::string("\"") + url + "\"", "host:port"});
  }
  for (const char* url : {"tcp://h:99999", "tcp://h:65536", "tcp://h:-1", "tcp://h:5x"}) {
    INFO(url);
    require_invalid([&] { rendezvous::rendezvous(url, 0, 1, kTimeout); },
                    {std::string("\"") + url + "\"", "[0, 65535]"});
  }
  require_invalid([] { rendezvous::rendezvous("file://", 0, 1, kTimeout); },
                  {"\"file://\"", "path is empty"});
}

TEST_CASE("a rank outside [0, world_size) is refused before any store is opened",
          "[rendezvous]") {
  EnvGuard env;
  TempDir dir;
  const std::string file_url = "file://" + dir.path() + "/store";
  // Nothing listens on these: were a store opened first, the client would
  // retry until the timeout and throw ConnectionError instead.
  const std::string tcp_url = "tcp://127.0.0.1:0";

  for (const std::string& url : {file_url, tcp_url}) {
    INFO(url);
    require_invalid([&] { rendezvous::rendezvous(url, 2, 2, kTimeout); },
                    {"rank 2", "[0, 2)"});
    require_invalid([&] { rendezvous::rendezvous(url, 7, 1, kTimeout); },
                    {"rank 7", "[0, 1)"});
    // No rank at all (and none in the environment) in a static group.
    require_invalid([&] { rendezvous::rendezvous(url, -1, 4, kTimeout); },
                    {"rank -1", "[0, 4)"});
  }
  CHECK_FALSE(std::filesystem::exists(dir.path() + "/store"));

  // The same through the environment.
  env.set("MASTER_ADDR", "127.0.0.1");
  env.set("MASTER_PORT", "0");
  env.set("RANK", "3");
  env.set("WORLD_SIZE", "3");
  require_invalid([] { rendezvous::rendezvous("env://", -1, std::nullopt, kTimeout); },
                  {"rank 3", "[0, 3)"});
  env.set("RANK", "0");
  require_invalid([] { rendezvous::rendezvous("env://", 5, std::nullopt, kTimeout); },
                  {"rank 5", "[0, 3)"});
}

TEST_CASE("tcp://: rank 0 of a static group hosts the store, rank 1 connects",
          "[rendezvous]") {
  EnvGuard env;
  rendezvous::Rendezvous host = rendezvous::rendezvous("tcp://127.0.0.1:0", 0, 2, kTimeout);
  CHECK(host.rank == 0);
  CHECK(host.world_size == std::optional<int>(2));
  TcpStore* host_store = as_tcp(host);
  REQUIRE(host_store != nullptr);
  REQUIRE(host_store->server() != nullptr);
  const uint16_t port = host_store->port();
  REQUIRE(port != 0);
  CHECK(host_store->server()->port() == port);
  CHECK(host_store->timeout() == kTimeout);

  const std::string url = "tcp://127.0.0.1:" + std::to_string(port);
  rendezvous::Rendezvous worker = rendezvous::rendezvous(url, 1, 2, kTimeout);
  CHECK(worker.rank == 1);
  CHECK(worker.world_size == std::optional<int>(2));
  TcpStore* worker_store = as_tcp(worker);
  REQUIRE(worker_store != nullptr);
  CHECK(worker_store->server() == nullptr);
  CHECK(worker_store->port() == port);

  host.store->set("from_host", "hello");
  CHECK(to_string(worker.store->get("from_host")) == "hello");
  worker.store->set("from_worker", "world");
  CHECK(to_string(host.store->get("from_worker")) == "world");
  CHECK(host.store->add("counter", 2) == 2);
  CHECK(worker.store->add("counter", 3) == 5);

  SECTION("a dynamic group's worker never hosts, even as rank 0") {
    rendezvous::Rendezvous dynamic = rendezvous::rendezvous(url, 0, std::nullopt, kTimeout);
    CHECK(dynamic.rank == 0);
    CHECK(dynamic.world_size == std::nullopt);
    REQUIRE(as_tcp(dynamic) != nullptr);
    CHECK(as_tcp(dynamic)->server() == nullptr);
    CHECK(to_string(dynamic.store->get("from_host")) == "hello");

    rendezvous::Rendezvous unranked = rendezvous::rendezvous(url, -1, std::nullopt, kTimeout);
    CHECK(unranked.rank == -1);
    CHECK(unranked.world_size == std::nullopt);
    CHECK(to_string(unranked.store->get("from_worker")) == "world");
  }
  SECTION("tcp:// ignores MASTER_ADDR and MASTER_PORT") {
    env.set("MASTER_ADDR", "203.0.113.1");
    env.set("MASTER_PORT", "1");
    rendezvous::Rendezvous other = rendezvous::rendezvous(url, 1, 2, kTimeout);
    CHECK(to_string(other.store->get("from_host")) == "hello");
  }
}

TEST_CASE("env:// with SWITCHBOARD_STORE: every rank is a client of the server",
          "[rendezvous]") {
  EnvGuard env;
  TcpStoreServer server;
  REQUIRE(server.port() != 0);
  const std::string port = std::to_string(server.port());
  env.set("SWITCHBOARD_STORE", "tcp://127.0.0.1:" + port);
  env.set("MASTER_ADDR", "127.0.0.1");
  env.set("MASTER_PORT", port);
  env.set("SLURM_PROCID", "1");
  env.set("SLURM_NTASKS", "3");

  rendezvous::Rendezvous one = rendezvous::rendezvous("env://", -1, std::nullopt, kTimeout);
  CHECK(one.rank == 1);
  CHECK(one.world_size == std::optional<int>(3));
  REQUIRE(as_tcp(one) != nullptr);
  CHECK(as_tcp(one)->server() == nullptr);
  one.store->set("one", "1");
  CHECK(to_string(one.store->get("one")) == "1");

  // Rank 0 does not host: it connects to the standalone server.
  env.set("SLURM_PROCID", "0");
  rendezvous::Rendezvous zero = rendezvous::rendezvous("env://", -1, std::nullopt, kTimeout);
  CHECK(zero.rank == 0);
  CHECK(zero.world_size == std::optional<int>(3));
  REQUIRE(as_tcp(zero) != nullptr);
  CHECK(as_tcp(zero)->server() == nullptr);
  CHECK(as_tcp(zero)->port() == server.port());
  zero.store->set("zero", "0");

  TcpStore other = client(server.port());
  CHECK(to_string(other.get("zero")) == "0");
  CHECK(to_string(other.get("one")) == "1");
  CHECK(to_string(zero.store->get("one")) == "1");

  // Explicit arguments win over the environment.
  rendezvous::Rendezvous explicit_args = rendezvous::rendezvous("env://", 2, 5, kTimeout);
  CHECK(explicit_args.rank == 2);
  CHECK(explicit_args.world_size == std::optional<int>(5));
  CHECK(to_string(explicit_args.store->get("zero")) == "0");
}

TEST_CASE(
    "under torchrun's agent store every rank is a client of it, under the prefix of the "
    "attempt its rank's starts count, whatever each node's restart count says",
    "[rendezvous][torchrun]") {
  EnvGuard env;
  TcpStoreServer agent;  // stands in for torchrun's elastic agent's store
  REQUIRE(agent.port() != 0);
  const std::string port = std::to_string(agent.port());
  env.set("MASTER_ADDR", "127.0.0.1");
  env.set("MASTER_PORT", port);
  env.set("TORCHELASTIC_USE_AGENT_STORE", "True");
  env.set("WORLD_SIZE", "2");
  TcpStore probe = client(agent.port());
  const std::string tcp = "tcp://127.0.0.1:" + port;
  // Round 0: both nodes' count is 0, and each rank's first start is attempt
  // 0, through either method. Rank 0 does not host (the port is taken by
  // the agent): it connects.
  env.set("TORCHELASTIC_RESTART_COUNT", "0");
  rendezvous::Rendezvous zero = rendezvous::rendezvous("env://", 0, 2, kTimeout);
  CHECK(zero.world_size == std::optional<int>(2));
  CHECK(zero.rank == 0);
  rendezvous::Rendezvous one = rendezvous::rendezvous(tcp, 1, 2, kTimeout);
  zero.store->set("zero", "round 0");
  CHECK(to_string(one.store->get("zero")) == "round 0");
  CHECK(to_string(probe.get("/worker/attempt_0/zero")) == "round 0");
  CHECK_FALSE(probe.check({"zero"}));
  // Rank 1's worker failed. As PyTorch 2.x's agents count, its node's
  // restart count is 1, while rank 0's node, restarted only because the
  // other node re-joined, keeps 0. The round's workers still meet under one
  // prefix, and read nothing of the failed attempt.
  env.set("TORCHELASTIC_RESTART_COUNT", "1");
  rendezvous::Rendezvous one_again = rendezvous::rendezvous("env://", 1, 2, kTimeout);
  env.set("TORCHELASTIC_RESTART_COUNT", "0");
  rendezvous::Rendezvous zero_again = rendezvous::rendezvous(tcp, 0, 2, kTimeout);
  CHECK_FALSE(one_again.store->check({"zero"}));
  one_again.store->set("one", "round 1");
  CHECK(to_string(zero_again.store->get("one")) == "round 1");
  CHECK(to_string(probe.get("/worker/attempt_1/one")) == "round 1");
  CHECK(to_string(probe.get("switchboard/elastic/starts/0")) == "2");
  CHECK(to_string(probe.get("switchboard/elastic/starts/1")) == "2");
  // Anything but "True" leaves rank 0 hosting, as before.
  env.set("TORCHELASTIC_USE_AGENT_STORE", "False");
  env.set("MASTER_PORT", "0");
  rendezvous::Rendezvous host = rendezvous::rendezvous("env://", 0, std::nullopt, kTimeout);
  REQUIRE(as_tcp(host) != nullptr);
  CHECK(as_tcp(host)->server() != nullptr);
}

TEST_CASE("env_local_rank: LOCAL_RANK, then SLURM_LOCALID, then Open MPI", "[rendezvous][slurm]") {
  EnvGuard env;
  CHECK(rendezvous::env_local_rank() == std::nullopt);
  env.set("OMPI_COMM_WORLD_LOCAL_RANK", "3");
  CHECK(rendezvous::env_local_rank() == std::optional<int>(3));
  env.set("SLURM_LOCALID", "2");
  CHECK(rendezvous::env_local_rank() == std::optional<int>(2));
  env.set("LOCAL_RANK", "1");
  CHECK(rendezvous::env_local_rank() == std::optional<int>(1));
  env.set("LOCAL_RANK", "-1");
  require_invalid([] { (void)rendezvous::env_local_rank(); }, {"LOCAL_RANK", "\"-1\""});
}

TEST_CASE("the first node of a SLURM node list, and malformed lists named",
          "[rendezvous][slurm]") {
  CHECK(rendezvous::slurm_first_node("node7") == "node7");
  CHECK(rendezvous::slurm_first_node("node[0-2]") == "node0");
  CHECK(rendezvous::slurm_first_node("node[07-12,20],gpu1") == "node07");
  CHECK(rendezvous::slurm_first_node("a,b[1-3]") == "a");
  CHECK(rendezvous::slurm_first_node("rack[2-3]-n[5,9]") == "rack2-n5");
  CHECK(rendezvous::slurm_first_node("198.18.0.1") == "198.18.0.1");
  for (const char* bad : {"", "node[1-2", "node1]", "node[]", "node[a-b]", ",x"}) {
    INFO(bad);
    require_invalid([bad] { rendezvous::slurm_first_node(bad); }, {"SLURM node list"});
  }
  CHECK(rendezvous::slurm_store_port(1234) == 21234);
  CHECK(rendezvous::slurm_store_port(98765) == 28765);
}

TEST_CASE("under srun without MASTER_ADDR the store is on the step's first node",
          "[rendezvous][slurm]") {
  EnvGuard env;
  TcpStoreServer server;  // stands in for task 0's store on the first node
  REQUIRE(server.port() != 0);
  env.set("SLURM_PROCID", "1");
  env.set("SLURM_NTASKS", "2");
  env.set("SLURM_JOB_ID", "77");
  env.set("SLURM_JOB_NODELIST", "nosuchnode[3-4]");
  env.set("SLURM_STEP_NODELIST", "localhost,nosuchnode9");
  env.set("MASTER_PORT", std::to_string(server.port()));
  rendezvous::Rendezvous r = rendezvous::rendezvous("env://", -1, std::nullopt, kTimeout);
  CHECK(r.rank == 1);
  CHECK(r.world_size == std::optional<int>(2));
  r.store->set("k", "v");
  CHECK(to_string(client(server.port()).get("k")) == "v");
  // Outside srun (no SLURM_PROCID) nothing is guessed.
  ::unsetenv("SLURM_PROCID");
  env.set("RANK", "1");
  require_invalid([] { rendezvous::rendezvous("env://", -1, std::nullopt, kTimeout); },
                  {"MASTER_ADDR is"});
  // Rank 0 on a node that is not the first refuses to host, naming where the
  // address came from.
  ::unsetenv("RANK");
  env.set("SLURM_PROCID", "0");
  env.set("SLURM_STEP_NODELIST", "198.18.255.254");
  require_invalid([] { rendezvous::rendezvous("env://", -1, std::nullopt, kTimeout); },
                  {"SLURM_STEP_NODELIST", "198.18.255.254", "not an address of this host"});
}

TEST_CASE("with SWITCHBOARD_STORE each attempt of an elastic job (launch --max-restarts) "
          "meets under its own prefix; rank 0's own store is never prefixed",
          "[rendezvous][elastic]") {
  EnvGuard env;
  TcpStoreServer server;  // the launcher's store server
  REQUIRE(server.port() != 0);
  const std::string port = std::to_string(server.port());
  env.set("SWITCHBOARD_STORE", "tcp://127.0.0.1:" + port);
  env.set("MASTER_ADDR", "127.0.0.1");
  env.set("MASTER_PORT", port);
  env.set("WORLD_SIZE", "2");
  env.set("TORCHELASTIC_RESTART_COUNT", "1");
  rendezvous::Rendezvous first = rendezvous::rendezvous("env://", 0, std::nullopt, kTimeout);
  first.store->set("k", "attempt 1");
  TcpStore probe = client(server.port());
  CHECK(to_string(probe.get("/worker/attempt_1/k")) == "attempt 1");
  CHECK_FALSE(probe.check({"k"}));
  env.set("TORCHELASTIC_RESTART_COUNT", "2");
  rendezvous::Rendezvous second = rendezvous::rendezvous("env://", 1, std::nullopt, kTimeout);
  CHECK_FALSE(second.store->check({"k"}));
  // Without SWITCHBOARD_STORE rank 0 hosts a store of its own for the attempt:
  // host and clients both see it unprefixed.
  ::unsetenv("SWITCHBOARD_STORE");
  env.set("MASTER_PORT", "0");
  rendezvous::Rendezvous host = rendezvous::rendezvous("env://", 0, std::nullopt, kTimeout);
  REQUIRE(as_tcp(host) != nullptr);
  REQUIRE(as_tcp(host)->server() != nullptr);
  env.set("MASTER_PORT", std::to_string(as_tcp(host)->port()));
  rendezvous::Rendezvous peer = rendezvous::rendezvous("env://", 1, std::nullopt, kTimeout);
  REQUIRE(as_tcp(peer) != nullptr);
  peer.store->set("p", "v");
  CHECK(to_string(host.store->get("p")) == "v");
}

TEST_CASE("env:// without SWITCHBOARD_STORE: rank 0 hosts on MASTER_PORT",
          "[rendezvous]") {
  EnvGuard env;
  env.set("MASTER_ADDR", "127.0.0.1");
  env.set("MASTER_PORT", "0");
  env.set("RANK", "0");
  env.set("WORLD_SIZE", "2");
  rendezvous::Rendezvous host = rendezvous::rendezvous("env://", -1, std::nullopt, kTimeout);
  CHECK(host.rank == 0);
  CHECK(host.world_size == std::optional<int>(2));
  REQUIRE(as_tcp(host) != nullptr);
  REQUIRE(as_tcp(host)->server() != nullptr);
  const uint16_t port = as_tcp(host)->port();
  REQUIRE(port != 0);

  env.set("MASTER_PORT", std::to_string(port));
  env.set("RANK", "1");
  rendezvous::Rendezvous worker = rendezvous::rendezvous("env://", -1, std::nullopt, kTimeout);
  CHECK(worker.rank == 1);
  REQUIRE(as_tcp(worker) != nullptr);
  CHECK(as_tcp(worker)->server() == nullptr);
  worker.store->set("k", "v");
  CHECK(to_string(host.store->get("k")) == "v");
}

TEST_CASE("env:// uses the Open MPI variables when nothing else is set",
          "[rendezvous]") {
  EnvGuard env;
  env.set("OMPI_COMM_WORLD_RANK", "0");
  env.set("OMPI_COMM_WORLD_SIZE", "1");
  CHECK(rendezvous::env_rank() == std::optional<int>(0));
  CHECK(rendezvous::env_world_size() == std::optional<int>(1));

  env.set("MASTER_ADDR", "127.0.0.1");
  env.set("MASTER_PORT", "0");
  rendezvous::Rendezvous r = rendezvous::rendezvous("env://", -1, std::nullopt, kTimeout);
  CHECK(r.rank == 0);
  CHECK(r.world_size == std::optional<int>(1));
  REQUIRE(as_tcp(r) != nullptr);
  CHECK(as_tcp(r)->server() != nullptr);
  CHECK(as_tcp(r)->port() != 0);
  r.store->set("ompi", "yes");
  CHECK(to_string(r.store->get("ompi")) == "yes");
}

TEST_CASE("file://: two rendezvous on one path share the store", "[rendezvous]") {
  EnvGuard env;
  TempDir dir;
  const std::string path = dir.path() + "/store";
  const std::string url = "file://" + path;
  {
    rendezvous::Rendezvous a = rendezvous::rendezvous(url, 0, 2, kTimeout);
    rendezvous::Rendezvous b = rendezvous::rendezvous(url, 1, 2, kTimeout);
    CHECK(a.rank == 0);
    CHECK(b.rank == 1);
    CHECK(a.world_size == std::optional<int>(2));
    auto* file_a = dynamic_cast<FileStore*>(a.store.get());
    REQUIRE(file_a != nullptr);
    CHECK(file_a->path() == path);
    CHECK(std::filesystem::exists(path));

    a.store->set("from_a", "1");
    CHECK(to_string(b.store->get("from_a")) == "1");
    b.store->set("from_b", "2");
    CHECK(to_string(a.store->get("from_b")) == "2");
  }
  // The last of the group's users removed the file.
  CHECK_FALSE(std::filesystem::exists(path));

  require_invalid([] { rendezvous::rendezvous("file://", 0, 1, kTimeout); }, {"\"file://\""});
}
