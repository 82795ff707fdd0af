// tools/launch across hosts (network namespaces): one launcher per node with
// --nnodes/--node-rank/--master-addr/--master-port, as a user runs it. The
// job runs as one (global ranks, torchrun's variables), fails as one (a
// worker failing on one node stops every node, each launcher naming the
// node and rank that failed first), waits for late nodes no longer than
// --join-timeout (naming the missing ones), and stops everywhere on SIGINT
// to one launcher. With --max-restarts, a worker failing on one node
// restarts the workers of every node as the next attempt, while a lost node
// still ends the job. Afterwards no process is left in any host.
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <climits>
#include <cstdlib>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "common/auth.h"
#include "tests/util/netns_spawn.h"
#include "tests/util/subprocess.h"

namespace {

using sbtest::spawn_in;
using sbtest::spawn_store_server_in;
using sbtest::Subprocess;
using switchboard::netns::NetnsCluster;

constexpr const char* kMasterPort = "29400";  // each cluster is a network of its own

std::string self_exe() {
  char path[PATH_MAX] = {};
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  REQUIRE(n > 0);
  return std::string(path, static_cast<size_t>(n));
}

// A launched worker: prints its variables, then per args[0]:
//   "exit": exits 0;  "fail-rank R": exits 3 if RANK == R, else waits for a
//   signal;  "wait": waits for a signal (the launcher's SIGTERM ends it);
//   "wait-rank R": waits for a signal if RANK == R, else exits 0.
SB_CHILD_MAIN(launched) {
  const auto var = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v ? v : "-");
  };
  fmt::print("rank={} local_rank={} world={} local_world={} group_rank={} node_rank={} "
             "master={}:{} store={}\n",
             var("RANK"), var("LOCAL_RANK"), var("WORLD_SIZE"), var("LOCAL_WORLD_SIZE"),
             var("GROUP_RANK"), var("NODE_RANK"), var("MASTER_ADDR"), var("MASTER_PORT"),
             var("SWITCHBOARD_STORE"));
  std::fflush(stdout);
  const std::string mode = args.at(0);
  if (mode == "exit") return 0;
  if (mode == "fail-rank" && var("RANK") == args.at(1)) return 3;
  if (mode == "wait-rank" && var("RANK") != args.at(1)) return 0;
  for (;;) ::pause();  // until the launcher's SIGTERM
}

// A copy of the launch binary alone in a directory of its own (no runfiles,
// no store_server beside it), made once.
std::string lonely_launch() {
  static const std::string path = [] {
    const char* tmp = std::getenv("TEST_TMPDIR");  // bazel removes it
    std::string dir = fmt::format("{}/sb-lonely-launch-XXXXXX", tmp ? tmp : "/tmp");
    REQUIRE(::mkdtemp(dir.data()) != nullptr);
    const std::string copy = dir + "/launch";
    Subprocess cp({"/bin/cp", sbtest::runfile("tools/launch/launch"), copy});
    cp.read_all();
    REQUIRE(cp.wait() == 0);
    return copy;
  }();
  return path;
}

// A job secret file (0600) with `fill` bytes, made once per fill: what every
// node of a job is given (--secret-file), as a shared file system would.
std::string secret_file(char fill = 's') {
  static std::map<char, std::string> made;
  auto it = made.find(fill);
  if (it != made.end()) return it->second;
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = fmt::format("{}/sb-secret-XXXXXX", tmp ? tmp : "/tmp");
  REQUIRE(::mkdtemp(dir.data()) != nullptr);
  const std::string path = dir + "/secret";
  switchboard::Secret(std::vector<uint8_t>(32, static_cast<uint8_t>(fill))).write_file(path);
  return made[fill] = path;
}

// Runs `launch` in host `node` with the flags of a job of `nnodes` nodes of
// `nproc` workers each running `command`, and the job's secret; stdout and
// stderr both come back on the pipe.
Subprocess launcher_of(const NetnsCluster& cluster, int node, int nnodes, int nproc,
                       const std::vector<std::string>& command,
                       const std::vector<std::string>& extra = {},
                       const std::string& secret = secret_file()) {
  std::vector<std::string> argv = {
      "/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1", sbtest::runfile("tools/launch/launch"),
      "--nnodes", std::to_string(nnodes), "--node-rank", std::to_string(node),
      "--nproc-per-node", std::to_string(nproc), "--master-addr", cluster.address(0),
      "--master-port", kMasterPort, "--timeout-stop", "5", "--secret-file", secret};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.push_back("--");
  argv.insert(argv.end(), command.begin(), command.end());
  if (node == 0) {
    return spawn_in(cluster, node, argv,
                    {{"SWITCHBOARD_STORE_SERVER",
                      sbtest::runfile("tools/store_server/store_server")}});
  }
  // Only node 0 runs the store server: the others run a copy of launch with
  // no store server anywhere near it.
  argv[3] = lonely_launch();
  argv.insert(argv.begin(), {"/usr/bin/env", "-u", "RUNFILES_DIR", "-u",
                             "RUNFILES_MANIFEST_FILE", "-u", "SWITCHBOARD_STORE_SERVER"});
  return spawn_in(cluster, node, argv);
}

// launcher_of() with this binary's `launched` child as the workers.
Subprocess launcher(const NetnsCluster& cluster, int node, int nnodes, int nproc,
                    const std::vector<std::string>& worker_args,
                    const std::vector<std::string>& extra = {},
                    const std::string& secret = secret_file()) {
  std::vector<std::string> command = {self_exe(), "--sb-child", "launched"};
  command.insert(command.end(), worker_args.begin(), worker_args.end());
  return launcher_of(cluster, node, nnodes, nproc, command, extra, secret);
}

// Reads `launcher`'s output until each of its `nproc` workers has printed
// its variables (so every one of them runs); returns what was read.
std::string read_until_started(Subprocess& launcher, int nproc) {
  std::string out;
  for (int started = 0; started < nproc;) {
    const std::string line = launcher.read_line();
    out += line + "\n";
    if (line.find("] rank=") != std::string::npos) ++started;
  }
  return out;
}

// No process is left in any host of the cluster.
void check_nothing_left(const NetnsCluster& cluster) {
  for (int host = 0; host < cluster.size(); ++host) {
    INFO("host " << host);
    CHECK(cluster.pids(host).empty());
  }
}

}  // namespace

TEST_CASE("three nodes of two workers run as one job with global ranks", "[multihost][launch]") {
  if (NetnsCluster::skipped()) return;
  NetnsCluster cluster({.hosts = 3});
  std::vector<Subprocess> launchers;
  for (int node = 0; node < 3; ++node) launchers.push_back(launcher(cluster, node, 3, 2, {"exit"}));
  for (int node = 0; node < 3; ++node) {
    const std::string out = launchers[node].read_all();
    INFO("node " << node << "'s launcher printed:\n" << out);
    CHECK(launchers[node].wait() == 0);
    for (int local = 0; local < 2; ++local) {
      const int rank = node * 2 + local;
      CHECK_THAT(out, Catch::Contains(fmt::format(
                          "[rank {}] rank={} local_rank={} world=6 local_world=2 "
                          "group_rank={} node_rank={} master={}:{} store=tcp://{}:{}",
                          rank, rank, local, node, node, cluster.address(0), kMasterPort,
                          cluster.address(0), kMasterPort)));
    }
  }
  check_nothing_left(cluster);
}

TEST_CASE("a worker failing on one node stops the workers of every node, and every launcher "
          "names it",
          "[multihost][launch]") {
  if (NetnsCluster::skipped()) return;
  NetnsCluster cluster({.hosts = 3});
  std::vector<Subprocess> launchers;
  // Rank 3 is node 1's second worker.
  for (int node = 0; node < 3; ++node) {
    launchers.push_back(launcher(cluster, node, 3, 2, {"fail-rank", "3"}));
  }
  for (int node = 0; node < 3; ++node) {
    const std::string out = launchers[node].read_all();
    INFO("node " << node << "'s launcher printed:\n" << out);
    CHECK(launchers[node].wait() == 1);
    CHECK_THAT(out, Catch::Contains("first failure: node 1 rank 3 (pid ") &&
                        Catch::Contains("exited with status 3"));
  }
  check_nothing_left(cluster);
}

TEST_CASE("a node that does not arrive within --join-timeout fails every node, naming it",
          "[multihost][launch]") {
  if (NetnsCluster::skipped()) return;
  NetnsCluster cluster({.hosts = 3});
  std::vector<Subprocess> launchers;
  for (int node = 0; node < 2; ++node) {  // node 2 never starts
    launchers.push_back(launcher(cluster, node, 3, 1, {"exit"}, {"--join-timeout", "1"}));
  }
  for (int node = 0; node < 2; ++node) {
    const std::string out = launchers[node].read_all();
    INFO("node " << node << "'s launcher printed:\n" << out);
    CHECK(launchers[node].wait() == 1);
    CHECK_THAT(out, Catch::Contains("node(s) 2 did not arrive within 1 s"));
    CHECK_THAT(out, !Catch::Contains("rank="));  // no worker started
  }
  check_nothing_left(cluster);
}

TEST_CASE("a node whose launcher has another secret is refused by the job's store, and the "
          "job fails naming it",
          "[multihost][launch][auth]") {
  if (NetnsCluster::skipped()) return;
  NetnsCluster cluster({.hosts = 2});
  Subprocess node0 = launcher(cluster, 0, 2, 1, {"exit"}, {"--join-timeout", "2"});
  Subprocess node1 =
      launcher(cluster, 1, 2, 1, {"exit"}, {"--join-timeout", "2"}, secret_file('x'));
  const std::string out1 = node1.read_all();
  INFO("node 1 printed:\n" << out1);
  CHECK(node1.wait() == 1);
  CHECK_THAT(out1, Catch::Contains("cannot reach the job's store"));
  CHECK_THAT(out1, Catch::Contains("does not match this client's job secret"));
  const std::string out0 = node0.read_all();
  INFO("node 0 printed:\n" << out0);
  CHECK(node0.wait() == 1);
  CHECK_THAT(out0, Catch::Contains("node(s) 1 did not arrive within 2 s"));
  CHECK_THAT(out0 + out1, !Catch::Contains("rank="));  // no worker started
  check_nothing_left(cluster);
}

TEST_CASE("SIGINT to one launcher stops the job on every node", "[multihost][launch]") {
  if (NetnsCluster::skipped()) return;
  NetnsCluster cluster({.hosts = 2});
  std::vector<Subprocess> launchers;
  for (int node = 0; node < 2; ++node) launchers.push_back(launcher(cluster, node, 2, 2, {"wait"}));
  // Every worker is running once each launcher relayed its two lines.
  for (int node = 0; node < 2; ++node) {
    int started = 0;
    while (started < 2) {
      if (launchers[node].read_line().find("] rank=") != std::string::npos) ++started;
    }
  }
  launchers[1].kill(SIGINT);
  std::vector<std::string> out(2);
  for (int node = 0; node < 2; ++node) out[node] = launchers[node].read_all();
  INFO("node 0:\n" << out[0] << "\nnode 1:\n" << out[1]);
  CHECK(launchers[1].wait() == 128 + SIGINT);
  CHECK(launchers[0].wait() == 1);
  CHECK_THAT(out[0], Catch::Contains("first failure: node 1: the launcher got SIGINT"));
  check_nothing_left(cluster);
}

TEST_CASE("the demo on four hosts: the store on one, the ps on another, trainers on the "
          "rest, one launcher per host and no network setting",
          "[multihost][launch][rpc_demo]") {
  if (NetnsCluster::skipped()) return;
  NetnsCluster cluster({.hosts = 4});
  const std::string store_port = "29600";
  Subprocess store =
      spawn_store_server_in(cluster, 0, store_port, {"--secret-file", secret_file()});
  const std::string url = fmt::format("tcp://{}:{}", cluster.address(0), store_port);
  std::vector<Subprocess> launchers;
  // Nodes 0..2 on hosts 1..3: rank 0 (the ps) on host 1, trainer-1 and the
  // late joiner trainer-2 on hosts 2 and 3.
  for (int node = 0; node < 3; ++node) {
    launchers.push_back(spawn_in(cluster, node + 1,
                                 {"/bin/sh",
                                  "-c",
                                  "exec \"$0\" \"$@\" 2>&1",
                                  sbtest::runfile("tools/launch/launch"),
                                  "--nnodes",
                                  "3",
                                  "--node-rank",
                                  std::to_string(node),
                                  "--nproc-per-node",
                                  "1",
                                  "--store",
                                  url,
                                  "--secret-file",
                                  secret_file(),
                                  "--",
                                  sbtest::runfile("examples/rpc_demo/rpc_demo"),
                                  "--quick",
                                  "--late-joiner",
                                  "2",
                                  "--leaver",
                                  "0"}));
  }
  std::vector<std::string> out;
  for (int node = 0; node < 3; ++node) {
    out.push_back(launchers[node].read_all());
    INFO("node " << node << " (host " << node + 1 << ") printed:\n" << out.back());
    CHECK(launchers[node].wait() == 0);
    // Each worker listens on its own host's address, found from the route
    // to the store.
    CHECK_THAT(out.back(),
               Catch::Contains(fmt::format("PIPE listens on {}: the address that routes to "
                                           "the store at {}",
                                           cluster.address(node + 1), cluster.address(0))));
  }
  INFO("ps:\n" << out[0] << "\ntrainer-1:\n" << out[1] << "\ntrainer-2:\n" << out[2]);
  CHECK_THAT(out[0], Catch::Contains("[rank 0] ps: serving 2 trainers"));
  CHECK_THAT(out[0], Catch::Contains("ps: trainer-2 joined the group"));
  CHECK_THAT(out[0], Catch::Contains("[rank 0] ps: loss went down"));
  CHECK_THAT(out[2], Catch::Contains("[rank 2] trainer-2: joined the group mid-run"));
  for (int node = 1; node < 3; ++node) {
    CHECK_THAT(out[node], Catch::Contains(fmt::format(
                              "[rank {}] trainer-{}: trainers agree on the final parameters: "
                              "max |w_i - mean| = 0 over 64 values and 2 trainers",
                              node, node)));
  }
  store.kill(SIGTERM);
  store.wait();
}

TEST_CASE("a node whose launcher is killed (SIGKILL) fails the job after --node-timeout "
          "instead of holding node 0 for ever",
          "[multihost][launch]") {
  if (NetnsCluster::skipped()) return;
  NetnsCluster cluster({.hosts = 2});
  // Rank 0 (node 0) finishes at once; rank 1 (node 1) runs until stopped.
  std::vector<Subprocess> launchers;
  for (int node = 0; node < 2; ++node) {
    launchers.push_back(
        launcher(cluster, node, 2, 1, {"wait-rank", "1"}, {"--node-timeout", "2"}));
  }
  while (launchers[1].read_line().find("] rank=1") == std::string::npos) {
  }
  launchers[1].kill(SIGKILL);  // it can record nothing: node 0 must notice
  launchers[1].wait();
  const std::string out = launchers[0].read_all();
  INFO("node 0 printed:\n" << out);
  CHECK(launchers[0].wait() == 1);
  CHECK_THAT(out, Catch::Contains("first failure: node 1 stopped responding (its launcher "
                                  "has not updated the store for 2 s)"));
  // Node 1's worker died with its launcher (the launcher's children get
  // SIGKILL when it dies): nothing is left on either host. Its exit is
  // asynchronous: wait for each process still there to exit (a pidfd
  // becomes readable then), 30 s at most.
  for (int pid : cluster.pids(1)) {
    const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (fd < 0) continue;  // gone already
    pollfd exited{fd, POLLIN, 0};
    ::poll(&exited, 1, 30'000);
    ::close(fd);
  }
  check_nothing_left(cluster);
}

// ---- the restart policy (--max-restarts) ---------------------------------------

TEST_CASE(
    "with --max-restarts 1, a worker SIGKILLed on node 1 restarts the workers of every "
    "node, and attempt 1 completes with the right results",
    "[multihost][launch][restart]") {
  if (NetnsCluster::skipped()) return;
  NetnsCluster cluster({.hosts = 2});
  // elastic_worker: rank 1 (node 1's) kills itself with SIGKILL when rank 0
  // first calls it in attempt 0, before answering, so no worker prints a
  // result of attempt 0; in attempt 1 every rank r calls "add" (r, 40) on
  // the next one and prints the sum.
  std::vector<Subprocess> launchers;
  for (int node = 0; node < 2; ++node) {
    launchers.push_back(launcher_of(cluster, node, 2, 1,
                                    {sbtest::runfile("tests/examples/elastic_worker")},
                                    {"--max-restarts", "1"}));
  }
  std::vector<std::string> first(2);
  for (int node = 0; node < 2; ++node) {
    const std::string out = launchers[node].read_all();
    INFO("node " << node << "'s launcher printed:\n" << out);
    CHECK(launchers[node].wait() == 0);
    std::smatch failed;
    REQUIRE(std::regex_search(
        out, failed,
        std::regex(fmt::format(
            R"(launch: node {}: attempt 0 failed: (node \d rank \d \(pid \d+\) )"
            R"([^;\n]+); restarting \(1 of 1\))",
            node))));
    first[node] = failed[1];
    CHECK_THAT(out, Catch::Contains("launch: attempt 1: started 1 workers"));
    CHECK_THAT(out, Catch::Contains(fmt::format("[rank {}] worker{} attempt 1: {}\n",
                                                node, node, 40 + node)));
    CHECK_THAT(
        out,
        Catch::Contains(fmt::format(
            "launch: node {}: every worker of every node exited 0 in attempt 1", node)));
    CHECK_FALSE(std::regex_search(out, std::regex(R"(\] worker\d attempt 0: )")));
  }
  // One failure is the attempt's first (compare_set): every node names it.
  // Node 1's rank 1 killed itself; node 0's may have failed on losing it,
  // whichever the store heard of first.
  CHECK(first[0] == first[1]);
  CHECK_THAT(first[0], Catch::Contains("node 1 rank 1 (pid ") &&
                               Catch::Contains("killed by signal SIGKILL (9)") ||
                           Catch::Contains("node 0 rank 0 (pid "));
  check_nothing_left(cluster);
}

TEST_CASE(
    "a worker failing in every attempt fails the job on every node after the last "
    "restart, naming the attempt",
    "[multihost][launch][restart]") {
  if (NetnsCluster::skipped()) return;
  NetnsCluster cluster({.hosts = 2});
  // Rank 1 (node 1) exits 3 at once in every attempt; rank 0 waits.
  std::vector<Subprocess> launchers;
  for (int node = 0; node < 2; ++node) {
    launchers.push_back(
        launcher(cluster, node, 2, 1, {"fail-rank", "1"}, {"--max_restarts", "1"}));
  }
  for (int node = 0; node < 2; ++node) {
    const std::string out = launchers[node].read_all();
    INFO("node " << node << "'s launcher printed:\n" << out);
    CHECK(launchers[node].wait() == 1);
    CHECK(std::regex_search(
        out,
        std::regex(R"(attempt 0 failed: node 1 rank 1 \(pid \d+\) exited with status 3; )"
                   R"(restarting \(1 of 1\))")));
    if (node == 1) {  // node 0 may hear of it as the job's failure first
      CHECK(std::regex_search(
          out, std::regex(
                   R"(attempt 1 failed: node 1 rank 1 \(pid \d+\) exited with status 3; )"
                   R"(no restarts left \(--max-restarts 1\))")));
    }
    CHECK(std::regex_search(
        out, std::regex(
                 fmt::format(R"(launch: node {}: the job failed; first failure: attempt )"
                             R"(1: node 1 rank 1 \(pid \d+\) exited with status 3)",
                             node))));
    CHECK_THAT(out, !Catch::Contains("attempt 2"));
  }
  check_nothing_left(cluster);
}

TEST_CASE("a node cut off for good ends the job naming it, even with restarts left",
          "[multihost][launch][restart]") {
  if (NetnsCluster::skipped()) return;
  NetnsCluster cluster({.hosts = 2});
  std::vector<Subprocess> launchers;
  for (int node = 0; node < 2; ++node) {
    launchers.push_back(launcher(cluster, node, 2, 1, {"wait"},
                                 {"--max-restarts", "3", "--node-timeout", "2"}));
  }
  std::vector<std::string> out(2);
  for (int node = 0; node < 2; ++node) out[node] = read_until_started(launchers[node], 1);
  cluster.cut(1);  // node 1 reaches no one, and nobody reaches it
  for (int node = 0; node < 2; ++node) out[node] += launchers[node].read_all();
  INFO("node 0:\n" << out[0] << "\nnode 1:\n" << out[1]);
  // Node 0 stops hearing node 1's launcher; node 1 loses the store.
  CHECK(launchers[0].wait() == 1);
  CHECK_THAT(out[0],
             Catch::Contains("first failure: node 1 stopped responding (its launcher "
                             "has not updated the store for 2 s)"));
  CHECK(launchers[1].wait() == 1);
  CHECK_THAT(out[1],
             Catch::Contains("launch: node 1: the job's store at " + cluster.address(0) +
                             ":" + kMasterPort + " is gone"));
  for (int node = 0; node < 2; ++node) {
    CHECK_THAT(out[node],
               !Catch::Contains("restarting") && !Catch::Contains("attempt 1"));
  }
  check_nothing_left(cluster);
}
