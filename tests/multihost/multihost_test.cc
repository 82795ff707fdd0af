// Groups across hosts: each host a network namespace on one virtual switch
// (tests/util/netns_spawn.h), every worker a process in its host, and no
// network setting given: each worker must find the address its peers reach
// it at by itself (the route to the store, common/listen_address.h).
//
// Where namespaces cannot be made (not root, no iproute2), every case
// prints "skipped: <reason>".
#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "collective/groups.h"
#include "common/error.h"
#include "common/logging.h"
#include "core/tensor.h"
#include "rendezvous/membership_token.h"
#include "rpc/backend_registry.h"
#include "rpc/rpc.h"
#include "store/file_store.h"
#include "store/tcp_store.h"
#include "tests/multihost/multihost_util.h"
#include "tests/util/netns_spawn.h"
#include "tests/util/subprocess.h"

namespace {

namespace rpc = switchboard::rpc;
namespace col = switchboard::collective;
using sbtest::spawn_child_in;
using sbtest::spawn_in;
using sbtest::spawn_store_server_in;
using sbtest::Subprocess;
using switchboard::Tensor;
using switchboard::netns::NetnsCluster;

constexpr const char* kMasterPort = "29500";  // each cluster is a network of its own

bool skipped() { return NetnsCluster::skipped(); }

using namespace sbtest::multihost;

// A worker on one host: init_rpc over `backend` with no network setting
// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE from the environment; rank 0
// hosts the store), asks every peer which host it runs on, allreduces its
// rank + 1 over a named Gloo group, prints the sockets its host listens on,
// and shuts down gracefully. Prints "listening <addr:port>..." and "ok".
SB_CHILD_MAIN(host_worker) {
  const std::string backend = args.at(0);
  switchboard::init_logging("host_worker");
  const int rank = std::atoi(std::getenv("RANK"));
  const int world = std::atoi(std::getenv("WORLD_SIZE"));
  const std::string here = std::getenv("SB_TEST_HOST_ADDRESS");
  rpc::register_function("where", [here]() { return here; });
  rpc::init_rpc(fmt::format("w{}", rank), backend, rank, world);
  for (int peer = 0; peer < world; ++peer) {
    const std::string there = rpc::rpc_sync<std::string>(fmt::format("w{}", peer), "where");
    fmt::print("w{} runs on {}\n", peer, there);
  }
  col::init_collective_group(world, rank, "GLOO", "across_hosts");
  Tensor t = Tensor::from_vector(std::vector<float>{static_cast<float>(rank + 1)});
  col::allreduce(t, "across_hosts");
  fmt::print("allreduce {}\n", t.data_as<float>()[0]);
  fmt::print("listening {}\n", fmt::join(listening_sockets(), " "));
  std::fflush(stdout);
  col::destroy_collective_group("across_hosts");
  rpc::shutdown();
  fmt::print("ok\n");
  return 0;
}

// A worker of a static PIPE group of three for the partition case: calls
// every peer, says "ready", waits for the "cut" key in the FileStore at
// args[0] (the test cut host 2's link by then), and reports what it sees.
// Workers 0 and 1 call the cut-off w2 (must fail with ConnectionError within
// the heartbeat timeout), call each other, then shut down gracefully with a
// bound. w2 calls w0 (must fail the same way) and stops.
constexpr int kHeartbeatTimeoutMs = 1500;
constexpr int kShutdownBoundMs = 5000;

SB_CHILD_MAIN(partition_worker) {
  using Clock = std::chrono::steady_clock;
  using std::chrono::milliseconds;
  switchboard::init_logging("partition_worker");
  const int rank = std::atoi(std::getenv("RANK"));
  const std::string here = std::getenv("SB_TEST_HOST_ADDRESS");
  rpc::register_function("where", [here]() { return here; });
  auto options = rpc::construct_rpc_backend_options(
      rpc::backend_type("PIPE"), std::chrono::seconds(30), "env://",
      {{"heartbeat_timeout_ms", std::to_string(kHeartbeatTimeoutMs)}});
  rpc::init_rpc(fmt::format("w{}", rank), rank, 3, options);
  for (int peer = 0; peer < 3; ++peer) rpc::rpc_sync<std::string>(fmt::format("w{}", peer), "where");
  fmt::print("ready\n");
  std::fflush(stdout);
  switchboard::FileStore control(args.at(0));
  control.wait({"cut"}, milliseconds(120'000));

  const std::string lost = rank == 2 ? "w0" : "w2";
  auto start = Clock::now();
  try {
    rpc::rpc_sync<std::string>(lost, "where", rpc::with_timeout(std::chrono::seconds(60)));
    fmt::print("{} answered across the cut\n", lost);
  } catch (const switchboard::ConnectionError& e) {
    const auto ms = std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
    fmt::print("{}: ConnectionError after {} ms: {}\n", lost, ms, e.what());
  } catch (const std::exception& e) {
    fmt::print("{}: unexpected error: {}\n", lost, e.what());
  }
  if (rank == 2) {
    rpc::shutdown(false);
    fmt::print("stopped\n");
    return 0;
  }
  const std::string other = fmt::format("w{}", 1 - rank);
  int answered = 0;
  for (int i = 0; i < 20; ++i) answered += !rpc::rpc_sync<std::string>(other, "where").empty();
  fmt::print("{} answered {} of 20\n", other, answered);
  std::fflush(stdout);
  start = Clock::now();
  try {
    rpc::shutdown(true, milliseconds(kShutdownBoundMs));
    fmt::print("graceful shutdown returned");
  } catch (const std::exception& e) {
    fmt::print("graceful shutdown failed ({})", e.what());
  }
  fmt::print(" after {} ms\n",
             std::chrono::duration_cast<milliseconds>(Clock::now() - start).count());
  return 0;
}

// A worker alone in a static group of one, its PIPE port from
// SWITCHBOARD_PORT_RANGE. With args[0] == "taken", the range's only port
// is taken first. Prints "listening on <port>" or "error: <what>".
SB_CHILD_MAIN(range_worker) {
  switchboard::init_logging("range_worker");
  const std::string here = std::getenv("SB_TEST_HOST_ADDRESS");
  int blocker = -1;
  if (args.at(0) == "taken") {
    blocker = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(31000);
    ::inet_pton(AF_INET, here.c_str(), &a.sin_addr);
    if (::bind(blocker, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        ::listen(blocker, 1) != 0) {
      fmt::print("cannot take port 31000\n");
      return 1;
    }
  }
  try {
    rpc::init_rpc("solo", "PIPE", 0, 1);
    for (const std::string& socket : listening_sockets()) {
      if (socket.rfind(here + ":", 0) == 0 && socket != here + ":" + kMasterPort) {
        fmt::print("listening on {}\n", socket.substr(here.size() + 1));
      }
    }
    rpc::shutdown();
  } catch (const std::exception& e) {
    fmt::print("error: {}\n", e.what());
  }
  if (blocker >= 0) ::close(blocker);
  return 0;
}

// A member of a dynamic PIPE group (rpc_timeout 3 s, heartbeat timeout
// 1.5 s), args: name, rank, role, control FileStore path. "member": joins,
// says "ready", waits for the "done" key, stops. "joiner": joins (timing
// it), calls "ps", lists the group, stops.
constexpr int kJoinTimeoutMs = 3000;

SB_CHILD_MAIN(dynamic_member) {
  using Clock = std::chrono::steady_clock;
  switchboard::init_logging("dynamic_member");
  const std::string name = args.at(0);
  const int rank = std::stoi(args.at(1));
  const std::string role = args.at(2);
  const std::string here = std::getenv("SB_TEST_HOST_ADDRESS");
  rpc::register_function("where", [here]() { return here; });
  // SB_TEST_DEFAULTS=<rpc timeout ms>: that timeout and the defaults for the
  // rest (heartbeat timeout 5 s, membership lease 10 s), as a user has them.
  const char* defaults = std::getenv("SB_TEST_DEFAULTS");
  auto options =
      defaults ? rpc::construct_rpc_backend_options(rpc::backend_type("PIPE"),
                                                    std::chrono::milliseconds(std::stoi(defaults)),
                                                    "env://")
               : rpc::construct_rpc_backend_options(
                     rpc::backend_type("PIPE"), std::chrono::milliseconds(kJoinTimeoutMs),
                     "env://", {{"heartbeat_timeout_ms", "1500"}});
  const auto start = Clock::now();
  try {
    rpc::init_rpc(name, "PIPE", rank, rpc::kDynamicGroup, options);
  } catch (const std::exception& e) {
    fmt::print("init failed after {} ms: {}\n",
               std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start)
                   .count(),
               e.what());
    return 0;
  }
  if (role == "member") {
    fmt::print("ready\n");
    std::fflush(stdout);
    switchboard::FileStore control(args.at(3));
    control.wait({"done"}, std::chrono::milliseconds(120'000));
    rpc::shutdown(false);
    return 0;
  }
  fmt::print("joined after {} ms\n",
             std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start)
                 .count());
  try {
    fmt::print("ps answered {}\n", rpc::rpc_sync<std::string>("ps", "where"));
  } catch (const std::exception& e) {
    fmt::print("ps did not answer: {}\n", e.what());
  }
  std::vector<std::string> names;
  for (const auto& w : rpc::get_worker_infos()) names.push_back(w.name);
  std::sort(names.begin(), names.end());
  fmt::print("group: {}\n", fmt::join(names, " "));
  rpc::shutdown(false);
  return 0;
}

// Holds the membership token of the dynamic group in the store at
// MASTER_ADDR:MASTER_PORT with a lease of args[0] ms, renewing it all the
// time, as a worker in a long join or leave does. Says "held";
// says "lost: <why>" when a renewal finds the token taken over.
SB_CHILD_MAIN(token_holder) {
  switchboard::init_logging("token_holder");
  const std::chrono::milliseconds lease(std::stoi(args.at(0)));
  switchboard::TcpStoreOptions options;
  options.timeout = std::chrono::seconds(120);
  auto store = std::make_shared<switchboard::TcpStore>(
      std::getenv("MASTER_ADDR"), static_cast<uint16_t>(std::atoi(std::getenv("MASTER_PORT"))),
      options);
  switchboard::rendezvous::MembershipToken token(store, "pipe/dyn/token", "holder", lease);
  token.acquire(std::chrono::seconds(60));
  fmt::print("held\n");
  std::fflush(stdout);
  for (;;) {
    // Renewals back to back, each one a store round trip: the value keeps
    // changing until the link is cut, whenever that is.
    try {
      token.renew();
    } catch (const std::exception& e) {
      fmt::print("lost: {}\n", e.what());
      return 0;
    }
  }
}

// A rank of a named Gloo group of two with a 4 s timeout; prints how long
// init_collective_group took and how it ended.
constexpr int kGroupTimeoutMs = 4000;

SB_CHILD_MAIN(group_rank) {
  using Clock = std::chrono::steady_clock;
  switchboard::init_logging("group_rank");
  const int rank = std::atoi(std::getenv("RANK"));
  const auto start = Clock::now();
  std::string outcome = "ok";
  try {
    col::init_collective_group(2, rank, "GLOO", "g", std::chrono::milliseconds(kGroupTimeoutMs));
  } catch (const std::exception& e) {
    outcome = e.what();
  }
  fmt::print("init_collective_group returned after {} ms: {}\n",
             std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count(),
             outcome);
  return 0;
}

std::map<std::string, std::string> worker_env(const NetnsCluster& cluster, int rank,
                                              int world, const std::string& master) {
  return {{"MASTER_ADDR", master},
          {"MASTER_PORT", kMasterPort},
          {"RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(world)},
          {"SB_TEST_HOST_ADDRESS", cluster.address(rank)}};
}

// Runs host_worker over `backend` on each host of a fresh cluster and checks
// what every worker printed.
void run_static_group(const std::string& backend, int hosts) {
  NetnsCluster cluster({.hosts = hosts});
  std::vector<Subprocess> workers;
  for (int r = 0; r < hosts; ++r) {
    workers.push_back(spawn_child_in(cluster, r, "host_worker", {backend},
                                     worker_env(cluster, r, hosts, cluster.address(0))));
  }
  for (int r = 0; r < hosts; ++r) {
    INFO(backend << ": worker " << r);
    const std::string out = workers[r].read_all();
    INFO("it printed:\n" << out);
    CHECK(workers[r].wait() == 0);
    for (int peer = 0; peer < hosts; ++peer) {
      CHECK_THAT(out, Catch::Contains(
                          fmt::format("w{} runs on {}\n", peer, cluster.address(peer))));
    }
    CHECK_THAT(out, Catch::Contains(fmt::format("allreduce {}\n", hosts * (hosts + 1) / 2)));
    CHECK_THAT(out, Catch::EndsWith("ok\n"));
    // Every listener of the worker is on its host's address: none on
    // loopback (peers could not reach it) or on every address. PIPE keeps
    // one open; Gloo's (PROCESS_GROUP, the named group) may be closed once
    // its mesh is connected.
    std::istringstream listeners(listening_line(out).substr(10));
    int count = 0;
    for (std::string socket; listeners >> socket; ++count) {
      CHECK(socket.substr(0, socket.find(':')) == cluster.address(r));
    }
    if (backend == "PIPE" || r == 0) CHECK(count >= 1);
  }
}

}  // namespace

TEST_CASE("a static PIPE group on three hosts calls across them and allreduces, with no "
          "network setting",
          "[multihost]") {
  if (skipped()) return;
  run_static_group("PIPE", 3);
}

TEST_CASE("a static PROCESS_GROUP group on three hosts calls across them and allreduces, "
          "with no network setting",
          "[multihost]") {
  if (skipped()) return;
  run_static_group("PROCESS_GROUP", 3);
}

TEST_CASE("the minimal example runs unchanged on three hosts", "[multihost][examples]") {
  if (skipped()) return;
  NetnsCluster cluster({.hosts = 3});
  const std::string program = sbtest::runfile("examples/rpc_minimal");
  std::vector<Subprocess> workers;
  for (int r = 0; r < 3; ++r) {
    workers.push_back(
        spawn_in(cluster, r, {program}, worker_env(cluster, r, 3, cluster.address(0))));
  }
  for (int r = 0; r < 3; ++r) {
    const std::string out = workers[r].read_all();
    INFO("worker " << r << " printed:\n" << out);
    CHECK(workers[r].wait() == 0);
    CHECK_THAT(out, Catch::Contains(fmt::format("worker{}: add on worker{} gave {}, scale gave "
                                                "2.5",
                                                r, (r + 1) % 3, r + 40)));
  }
}

TEST_CASE("with two networks, SWITCHBOARD_IFNAME picks one and the default picks the one "
          "that reaches the store",
          "[multihost][address]") {
  if (skipped()) return;
  NetnsCluster cluster({.hosts = 2, .second_network = true});
  SECTION("the store on the second network: the default follows it") {
    std::vector<Subprocess> workers;
    for (int r = 0; r < 2; ++r) {
      auto env = worker_env(cluster, r, 2, cluster.address2(0));
      env["SB_TEST_HOST_ADDRESS"] = cluster.address2(r);
      workers.push_back(spawn_child_in(cluster, r, "host_worker", {"PIPE"}, env));
    }
    for (int r = 0; r < 2; ++r) {
      const std::string out = workers[r].read_all();
      INFO("worker " << r << " printed:\n" << out);
      CHECK(workers[r].wait() == 0);
      const std::string listeners = listening_line(out);
      CHECK_THAT(listeners, Catch::Contains(cluster.address2(r) + ":"));
      CHECK_THAT(listeners, !Catch::Contains(cluster.address(r) + ":"));
    }
  }
  SECTION("the store on the first network, SWITCHBOARD_IFNAME=eth1: every listener but "
          "the store's on the second") {
    std::vector<Subprocess> workers;
    for (int r = 0; r < 2; ++r) {
      auto env = worker_env(cluster, r, 2, cluster.address(0));
      env["SWITCHBOARD_IFNAME"] = "eth1";
      env["SB_TEST_HOST_ADDRESS"] = cluster.address2(r);
      workers.push_back(spawn_child_in(cluster, r, "host_worker", {"PIPE"}, env));
    }
    for (int r = 0; r < 2; ++r) {
      const std::string out = workers[r].read_all();
      INFO("worker " << r << " printed:\n" << out);
      CHECK(workers[r].wait() == 0);
      std::string listeners = listening_line(out);
      CHECK_THAT(listeners, Catch::Contains(cluster.address2(r) + ":"));
      // Only rank 0's store server is on the first network (it binds
      // MASTER_ADDR, which the workers were given).
      const std::string store = fmt::format("{}:{}", cluster.address(0), kMasterPort);
      if (r == 0) {
        const size_t s = listeners.find(store);
        REQUIRE(s != std::string::npos);
        listeners.erase(s, store.size());
      }
      CHECK_THAT(listeners, !Catch::Contains(cluster.address(r) + ":"));
    }
  }
}

TEST_CASE("a host cut off mid-run: calls to it fail within the heartbeat timeout, the others "
          "keep calling each other and shut down within the bound",
          "[multihost][partition]") {
  if (skipped()) return;
  NetnsCluster cluster({.hosts = 3});
  const ControlFile control;
  std::vector<Subprocess> workers;
  for (int r = 0; r < 3; ++r) {
    workers.push_back(spawn_child_in(cluster, r, "partition_worker", {control.path()},
                                     worker_env(cluster, r, 3, cluster.address(0))));
  }
  for (int r = 0; r < 3; ++r) REQUIRE(workers[r].read_line() == "ready");
  cluster.cut(2);
  control.set("cut");
  std::vector<std::string> out;
  for (int r = 0; r < 3; ++r) {
    out.push_back(workers[r].read_all());
    CHECK(workers[r].wait() == 0);
  }
  for (int r = 0; r < 3; ++r) {
    INFO("worker " << r << " printed:\n" << out[r]);
    const std::string lost = r == 2 ? "w0" : "w2";
    const size_t at = out[r].find(lost + ": ConnectionError after ");
    REQUIRE(at != std::string::npos);
    const int ms = std::stoi(out[r].substr(at + lost.size() + 24));
    CHECK(ms <= kHeartbeatTimeoutMs + 3000);  // detected by heartbeat, not by the call's 60 s
    const std::string line = out[r].substr(at, out[r].find('\n', at) - at);
    // The error names the worker that is gone.
    CHECK_THAT(line.substr(line.find(" ms: ")), Catch::Contains("\"" + lost + "\""));
  }
  for (int r = 0; r < 2; ++r) {
    INFO("worker " << r << " printed:\n" << out[r]);
    CHECK_THAT(out[r], Catch::Contains(fmt::format("w{} answered 20 of 20", 1 - r)));
    const size_t at = out[r].find("graceful shutdown ");
    REQUIRE(at != std::string::npos);
    const size_t after = out[r].rfind(" after ");
    const int ms = std::stoi(out[r].substr(after + 7));
    CHECK(ms <= kShutdownBoundMs + 3000);
    // Both wait for each other (the one that hosts the store does not leave
    // the other without it), then fail naming the lost worker.
    CHECK_THAT(out[r].substr(at), Catch::StartsWith(fmt::format(
                                      "graceful shutdown failed (join on rpc worker \"w{}\": "
                                      "workers [\"w2\"] are gone without joining",
                                      r)));
  }
  CHECK_THAT(out[2], Catch::Contains("stopped"));
}

TEST_CASE("SWITCHBOARD_PORT_RANGE: PIPE listens on a port of the range, and a range with no "
          "free port is an error naming it",
          "[multihost][ports]") {
  if (skipped()) return;
  NetnsCluster cluster({.hosts = 1});
  auto env = worker_env(cluster, 0, 1, cluster.address(0));
  env["SWITCHBOARD_PORT_RANGE"] = "31000-31001";
  Subprocess free = spawn_child_in(cluster, 0, "range_worker", {"free"}, env);
  std::string out = free.read_all();
  INFO(out);
  CHECK(free.wait() == 0);
  CHECK_THAT(out, Catch::Contains("listening on 31000\n"));
  env["SWITCHBOARD_PORT_RANGE"] = "31000";
  Subprocess taken = spawn_child_in(cluster, 0, "range_worker", {"taken"}, env);
  out = taken.read_all();
  INFO(out);
  CHECK(taken.wait() == 0);
  CHECK_THAT(out, Catch::Contains("error: PIPE agent \"solo\" on 198.18.0.1: no free port in "
                                  "31000-31000 (SWITCHBOARD_PORT_RANGE); the last one tried, "
                                  "31000: "));
}

TEST_CASE("joining a dynamic group while one member is cut off from everyone, the store "
          "included, returns within the join timeout: the joiner drops that member (its link "
          "view stands still), and the group is the reachable member and the joiner",
          "[multihost][dynamic][partition]") {
  if (skipped()) return;
  struct Setting {
    const char* what;
    int join_timeout_ms;  // rpc_timeout
    bool user_defaults;   // else a heartbeat timeout of 1.5 s
    bool known_neighbors;
  };
  // The suite's short timeouts, where the joiner's packets to the cut host
  // fail at ARP ("No route to host"); and a user's settings (rpc_timeout
  // 10 s, the default 5 s heartbeat timeout and 10 s lease) on hosts that
  // know each other's link-layer addresses, so that those packets vanish.
  // There, the join took 19.6 s and 35.6 s and then failed, its token taken
  // over by the member, which had seen it unchanged for a lease: Asio's
  // connect waited for the kernel's two minutes of SYN retries.
  const Setting setting =
      GENERATE(Setting{"short timeouts", kJoinTimeoutMs, false, false},
               Setting{"a user's defaults, packets vanish", 10'000, true, true});
  INFO(setting.what);
  NetnsCluster cluster({.hosts = 4, .known_neighbors = setting.known_neighbors});
  const ControlFile control;
  const std::string& control_path = control.path();
  const std::string store_port = "29700";
  Subprocess store = spawn_store_server_in(cluster, 0, store_port);
  auto env_of = [&](int host) {
    auto env = dynamic_env(cluster, host, store_port);
    if (setting.user_defaults) env["SB_TEST_DEFAULTS"] = std::to_string(setting.join_timeout_ms);
    return env;
  };
  Subprocess ps = spawn_child_in(cluster, 1, "dynamic_member",
                                 {"ps", "0", "member", control_path}, env_of(1));
  REQUIRE(ps.read_line() == "ready");
  Subprocess m = spawn_child_in(cluster, 2, "dynamic_member",
                                {"m", "1", "member", control_path}, env_of(2));
  REQUIRE(m.read_line() == "ready");
  cluster.cut(2);  // m is alive, and reaches nobody, the store included
  Subprocess joiner = spawn_child_in(cluster, 3, "dynamic_member",
                                     {"j", "2", "joiner", control_path}, env_of(3));
  const std::string out = joiner.read_all();
  INFO("the joiner printed:\n" << out);
  CHECK(joiner.wait() == 0);
  const size_t at = out.find("joined after ");
  REQUIRE(at != std::string::npos);
  // One bound for the whole join (each connect is bounded by part of it),
  // not TCP's minutes of retries; a second for the machine.
  CHECK(std::stoi(out.substr(at + 13)) <= setting.join_timeout_ms + 1000);
  // The member it reached kept it: the joiner's heartbeats ran while it
  // waited for the unreachable one.
  CHECK_THAT(out, Catch::Contains("ps answered " + cluster.address(1)));
  CHECK_THAT(out, Catch::Contains("group: j ps\n"));
  control.set("done");
  cluster.restore(2);
  CHECK(ps.wait() == 0);
  CHECK(m.wait() == 0);
  store.kill(SIGTERM);
  store.wait();
}

TEST_CASE("joining while cut off from one member that still reaches the store fails within "
          "the join timeout, naming it, and changes nothing",
          "[multihost][dynamic][partition]") {
  if (skipped()) return;
  NetnsCluster cluster({.hosts = 5});
  const ControlFile control;
  const std::string& control_path = control.path();
  const std::string store_port = "29750";
  Subprocess store = spawn_store_server_in(cluster, 0, store_port);
  auto env_of = [&](int host) { return dynamic_env(cluster, host, store_port); };
  Subprocess ps = spawn_child_in(cluster, 1, "dynamic_member",
                                 {"ps", "0", "member", control_path}, env_of(1));
  REQUIRE(ps.read_line() == "ready");
  Subprocess m = spawn_child_in(cluster, 2, "dynamic_member",
                                {"m", "1", "member", control_path}, env_of(2));
  REQUIRE(m.read_line() == "ready");
  cluster.partition({{2}, {3}});  // m and the joiner's host cannot reach each other
  Subprocess joiner = spawn_child_in(cluster, 3, "dynamic_member",
                                     {"j", "2", "joiner", control_path}, env_of(3));
  const std::string out = joiner.read_all();
  INFO("the joiner printed:\n" << out);
  CHECK(joiner.wait() == 0);
  const size_t at = out.find("init failed after ");
  REQUIRE(at != std::string::npos);
  CHECK(std::stoi(out.substr(at + 18)) <= kJoinTimeoutMs + 3000);
  CHECK_THAT(out, Catch::Contains("\"m\" (rank 1") && Catch::Contains("Nothing was changed"));
  // The group is as it was: a worker that joins next finds ps and m.
  Subprocess next = spawn_child_in(cluster, 4, "dynamic_member",
                                   {"k", "3", "joiner", control_path}, env_of(4));
  const std::string joined = next.read_all();
  INFO("the next joiner printed:\n" << joined);
  CHECK_THAT(joined, Catch::Contains("group: k m ps"));
  CHECK(next.wait() == 0);
  control.set("done");
  cluster.heal();
  CHECK(ps.wait() == 0);
  CHECK(m.wait() == 0);
  store.kill(SIGTERM);
  store.wait();
}

TEST_CASE("init_collective_group with a peer that advertises an address no one can reach "
          "returns within its timeout",
          "[multihost][collective]") {
  if (skipped()) return;
  NetnsCluster cluster({.hosts = 2});
  const std::string store_port = "29800";
  Subprocess store = spawn_store_server_in(cluster, 0, store_port);
  std::vector<Subprocess> ranks;
  for (int r = 0; r < 2; ++r) {
    std::map<std::string, std::string> env = {{"MASTER_ADDR", cluster.address(0)},
                                              {"MASTER_PORT", store_port},
                                              {"RANK", std::to_string(r)}};
    // Rank 1 advertises loopback: rank 0 reaches its own 127.0.0.1 instead.
    if (r == 1) env["SWITCHBOARD_IFNAME"] = "127.0.0.1";
    ranks.push_back(spawn_child_in(cluster, r, "group_rank", {}, env));
  }
  for (int r = 0; r < 2; ++r) {
    const std::string out = ranks[r].read_all();
    INFO("rank " << r << " printed:\n" << out);
    CHECK(ranks[r].wait() == 0);
    const size_t at = out.find("returned after ");
    REQUIRE(at != std::string::npos);
    CHECK(std::stoi(out.substr(at + 15)) <= kGroupTimeoutMs + 3000);
    CHECK_THAT(out, !Catch::Contains(": ok"));
  }
  store.kill(SIGTERM);
  store.wait();
}

TEST_CASE("a host whose store link is cut while it holds the membership token holds the "
          "others up for one lease",
          "[multihost][dynamic][token]") {
  if (skipped()) return;
  NetnsCluster cluster({.hosts = 3});
  const ControlFile control;
  const std::string store_port = "29950";
  Subprocess store = spawn_store_server_in(cluster, 0, store_port);
  auto env_of = [&](int host) { return dynamic_env(cluster, host, store_port); };
  constexpr int kLeaseMs = 2000;
  Subprocess holder =
      spawn_child_in(cluster, 1, "token_holder", {std::to_string(kLeaseMs)}, env_of(1));
  REQUIRE(holder.read_line() == "held");
  cluster.cut(1);
  // A worker joining now waits for the token: one lease after it first
  // sees the holder's last value, it takes the token over and joins.
  Subprocess joiner = spawn_child_in(cluster, 2, "dynamic_member",
                                     {"j", "0", "joiner", control.path()}, env_of(2));
  const std::string out = joiner.read_all();
  INFO("the joiner printed:\n" << out);
  CHECK(joiner.wait() == 0);
  const size_t at = out.find("joined after ");
  REQUIRE(at != std::string::npos);
  const int ms = std::stoi(out.substr(at + 13));
  CHECK(ms >= kLeaseMs);
  CHECK(ms <= kLeaseMs + 3000);
  CHECK_THAT(out, Catch::Contains("group: j\n"));
  // Back on the network, the holder's next renewal finds the token gone.
  cluster.restore(1);
  const std::string lost = holder.read_line();
  CHECK_THAT(lost, Catch::StartsWith("lost: "));
  CHECK_THAT(lost, Catch::Contains("\"holder\" lost it"));
  CHECK(holder.wait() == 0);
  store.kill(SIGTERM);
  store.wait();
}

