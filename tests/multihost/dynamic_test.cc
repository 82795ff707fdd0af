// Dynamic groups across hosts (network namespaces, tests/util/netns_spawn.h):
// one view of the group when a member is cut off or stopped, a store server
// restarted under the group, and an outsider that does not have the job
// secret. Every worker is a process in its host; the test waits on their
// output lines and on keys it sets in a shared control file.
//
// Where namespaces cannot be made (not root, no iproute2), every case
// prints "skipped: <reason>".
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "agents/pipe/agent.h"
#include "agents/pipe/announcement.h"
#include "common/auth.h"
#include "common/error.h"
#include "common/logging.h"
#include "rpc/backend_registry.h"
#include "rpc/rpc.h"
#include "store/file_store.h"
#include "store/hash_store.h"
#include "store/tcp_store.h"
#include "tests/multihost/multihost_util.h"
#include "tests/util/netns_spawn.h"
#include "tests/util/subprocess.h"

namespace {

namespace rpc = switchboard::rpc;
using sbtest::spawn_child_in;
using sbtest::spawn_store_server_in;
using sbtest::Subprocess;
using switchboard::netns::NetnsCluster;
using namespace sbtest::multihost;

bool skipped() { return NetnsCluster::skipped(); }

// The workers that left the group, as on_leave reports them, to wait for.
class Departures {
 public:
  Departures() {
    rpc::on_leave([this](const rpc::WorkerInfo& w) {
      std::lock_guard lock(mu_);
      names_.insert(w.name);
      changed_.notify_all();
    });
  }
  bool wait_for(const std::string& name,
                std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    std::unique_lock lock(mu_);
    return changed_.wait_for(lock, timeout, [&] { return names_.count(name); });
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::set<std::string> names_;
};

std::string group_now() {
  std::vector<std::string> names;
  for (const auto& w : rpc::get_worker_infos()) names.push_back(w.name);
  std::sort(names.begin(), names.end());
  return fmt::format("{}", fmt::join(names, " "));
}

// Waits (a minute at most) for on_leave of this worker, `name` (the group
// evicted it), says "evicted" and what a call to "a" fails with, and stops.
// Returns the child's exit status.
int report_eviction(Departures& departures, const std::string& name) {
  if (!departures.wait_for(name)) {
    fmt::print("never learned that it was evicted; group: {}\n", group_now());
    return 1;
  }
  fmt::print("evicted\n");
  try {
    rpc::rpc_sync<std::string>("a", "where");
    fmt::print("a answered after the eviction\n");
  } catch (const std::exception& e) {
    fmt::print("calling a: {}\n", e.what());
  }
  std::fflush(stdout);
  rpc::shutdown(false);
  return 0;
}

// A member of a dynamic PIPE group for the dynamic partition case (heartbeat
// timeout 1.5 s), args: name, rank, role, control FileStore path.
//   "member"  says "ready"; once the control key "cut" is set, waits for
//             on_leave("c") and says how long after "cut" it came and the
//             group then; once "joined" is set, calls "d"; leaves the
//             group gracefully once "done" is set.
//   "cutoff"  says "ready", waits for on_leave of itself (the group evicted
//             it), says "evicted" and what a call to "a" fails with.
//   "joiner"  says the group it joined and what "a" (or args[4]) answered;
//             stops once "done" is set.
//   "steady"  says "ready"; leaves the group gracefully once "done" is set.
//   "founder" (heartbeat timeout args[4] ms) says the group it joined, then
//             waits for on_leave of itself and says "evicted" and what a
//             call to "a" fails with.
constexpr int kDynamicHeartbeatMs = 1500;

SB_CHILD_MAIN(view_member) {
  using Clock = std::chrono::steady_clock;
  using std::chrono::milliseconds;
  switchboard::init_logging("view_member");
  const std::string name = args.at(0);
  const std::string role = args.at(2);
  switchboard::FileStore control(args.at(3));
  const std::string here = std::getenv("SB_TEST_HOST_ADDRESS");
  rpc::register_function("where", [here]() { return here; });
  Departures departures;
  auto options = rpc::construct_rpc_backend_options(
      rpc::backend_type("PIPE"), std::chrono::seconds(10), "env://",
      {{"heartbeat_timeout_ms",
        role == "founder" ? args.at(4) : std::to_string(kDynamicHeartbeatMs)}});
  rpc::init_rpc(name, "PIPE", std::stoi(args.at(1)), rpc::kDynamicGroup, options);
  if (role == "founder") {
    fmt::print("group: {}\n", group_now());
    std::fflush(stdout);
    return report_eviction(departures, name);
  }
  if (role == "joiner") {
    fmt::print("group: {}\n", group_now());
    const std::string callee = args.size() > 4 ? args.at(4) : "a";
    fmt::print("{} answered {}\n", callee, rpc::rpc_sync<std::string>(callee, "where"));
    std::fflush(stdout);
    control.wait({"done"}, milliseconds(120'000));
    rpc::shutdown(false);
    return 0;
  }
  fmt::print("ready\n");
  std::fflush(stdout);
  if (role == "steady") {
    control.wait({"done"}, milliseconds(120'000));
    rpc::shutdown(true, milliseconds(10'000));
    fmt::print("left\n");
    return 0;
  }
  if (role == "cutoff") return report_eviction(departures, name);
  control.wait({"cut"}, milliseconds(120'000));
  const auto cut = Clock::now();
  if (!departures.wait_for("c")) {
    fmt::print("c never left\n");
    return 1;
  }
  fmt::print("c left after {} ms; group: {}\n",
             std::chrono::duration_cast<milliseconds>(Clock::now() - cut).count(), group_now());
  std::fflush(stdout);
  control.wait({"joined"}, milliseconds(120'000));
  fmt::print("d answered {}\n", rpc::rpc_sync<std::string>("d", "where"));
  std::fflush(stdout);
  control.wait({"done"}, milliseconds(120'000));
  rpc::shutdown(true, milliseconds(10'000));
  fmt::print("left\n");
  return 0;
}

// A member of a dynamic PIPE group for the partition cases (heartbeat
// timeout 1.5 s), args: name, rank, control FileStore path, the group the
// larger side should end with. Says "ready"; once "split" is set, says
// "evicted" when the group evicts it, or "group: <names>" once its view is
// the larger side's (a minute at most); stops once "done" is set.
SB_CHILD_MAIN(split_member) {
  using std::chrono::milliseconds;
  switchboard::init_logging("split_member");
  const std::string name = args.at(0);
  const std::string expected = args.at(3);
  switchboard::FileStore control(args.at(2));
  Departures departures;
  auto options = rpc::construct_rpc_backend_options(
      rpc::backend_type("PIPE"), std::chrono::seconds(10), "env://",
      {{"heartbeat_timeout_ms", std::to_string(kDynamicHeartbeatMs)}});
  rpc::init_rpc(name, "PIPE", std::stoi(args.at(1)), rpc::kDynamicGroup, options);
  fmt::print("ready\n");
  std::fflush(stdout);
  control.wait({"split"}, milliseconds(120'000));
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::string said = "neither evicted nor in the larger side's group: " + group_now();
  while (std::chrono::steady_clock::now() < until) {
    if (departures.wait_for(name, milliseconds(50))) {
      said = "evicted";
      break;
    }
    if (group_now() == expected) {
      said = "group: " + expected;
      break;
    }
  }
  fmt::print("{}\n", said);
  std::fflush(stdout);
  control.wait({"done"}, milliseconds(120'000));
  rpc::shutdown(false);
  return 0;
}

// Waits (a minute at most) until the store at MASTER_ADDR:MASTER_PORT has
// the keys in args, then says "ok".
SB_CHILD_MAIN(store_wait) {
  switchboard::TcpStoreOptions options;
  options.timeout = std::chrono::seconds(60);
  switchboard::TcpStore store(std::getenv("MASTER_ADDR"),
                              static_cast<uint16_t>(std::atoi(std::getenv("MASTER_PORT"))),
                              options);
  store.wait(args, std::chrono::seconds(60));
  fmt::print("ok\n");
  return 0;
}

// A member of a dynamic PIPE group whose store and workers require the job
// secret (SWITCHBOARD_SECRET_FILE, from the test). args: name, rank,
// control FileStore path. Says the sockets it listens on and "ready";
// serves "where" (saying so on stdout); stops once "done" is set.
SB_CHILD_MAIN(secret_member) {
  switchboard::init_logging("secret_member");
  const std::string here = std::getenv("SB_TEST_HOST_ADDRESS");
  rpc::register_function("where", [here]() {
    fmt::print("served where\n");
    std::fflush(stdout);
    return here;
  });
  rpc::init_rpc(args.at(0), "PIPE", std::stoi(args.at(1)), rpc::kDynamicGroup);
  fmt::print("listening {}\n", fmt::join(listening_sockets(), " "));
  fmt::print("ready\n");
  std::fflush(stdout);
  switchboard::FileStore control(args.at(2));
  control.wait({"done"}, std::chrono::milliseconds(120'000));
  rpc::shutdown(false);
  return 0;
}

// An outsider on the network, args: a member's "address:port", and the
// secret it has ("none", or a secret file's path). Tries to read the
// group's member list from the store at MASTER_ADDR:MASTER_PORT, then to
// join the group at the member's address (which it learned some other way)
// with our own PIPE agent, and says how each ended.
SB_CHILD_MAIN(outsider) {
  switchboard::init_logging("outsider");
  const std::string at = args.at(0);
  std::shared_ptr<const switchboard::Secret> secret;
  if (args.at(1) != "none") {
    secret = std::make_shared<const switchboard::Secret>(switchboard::Secret::from_file(args.at(1)));
  }
  auto outcome = [](const std::function<void()>& run) -> std::string {
    try {
      run();
      return "ok";
    } catch (const switchboard::AuthenticationError& e) {
      return fmt::format("AuthenticationError: {}", e.what());
    } catch (const switchboard::ConnectionError& e) {
      return fmt::format("ConnectionError: {}", e.what());
    } catch (const std::exception& e) {
      return fmt::format("refused: {}", e.what());
    }
  };
  fmt::print("store: {}\n", outcome([&] {
    switchboard::TcpStoreOptions options;
    options.timeout = std::chrono::seconds(10);
    options.secret = secret;
    switchboard::TcpStore store(std::getenv("MASTER_ADDR"),
                                static_cast<uint16_t>(std::atoi(std::getenv("MASTER_PORT"))),
                                options);
    store.get("pipe/dyn/members");
  }));
  std::fflush(stdout);
  fmt::print("join: {}\n", outcome([&] {
    auto local = std::make_shared<switchboard::HashStore>();
    switchboard::agents::pipe::WorkerAnnouncement member;
    member.name = "m0";
    member.address = at.substr(0, at.find(':'));
    member.port = std::stoi(at.substr(at.find(':') + 1));
    local->set("pipe/dyn/members",
               switchboard::agents::pipe::encode_members({{0, member}}));
    switchboard::agents::pipe::PipeAgentOptions options;
    options.rpc_timeout = std::chrono::seconds(10);
    options.secret = secret;
    switchboard::agents::pipe::PipeAgent agent(local, "intruder", 7, std::nullopt,
                                               options);
  }));
  std::fflush(stdout);
  return 0;
}

// Members "a" and "b" ("steady" view_members) of a dynamic group on hosts 1
// and 2, over the store_server on host 0 at `store_port`, each ready.
std::vector<Subprocess> steady_members(NetnsCluster& cluster, const ControlFile& control,
                                       const std::string& store_port) {
  std::vector<Subprocess> members;
  const std::vector<std::string> names = {"a", "b"};
  for (int i = 0; i < 2; ++i) {
    members.push_back(
        spawn_child_in(cluster, i + 1, "view_member",
                       {names[i], std::to_string(i), "steady", control.path()},
                       dynamic_env(cluster, i + 1, store_port)));
    REQUIRE(members.back().read_line() == "ready");
  }
  return members;
}

// A worker "d" of rank `rank` joins from host `host`, sees the group "a b d"
// and calls a; then the steady `members` leave gracefully, and d stops.
void join_then_leave(NetnsCluster& cluster, const ControlFile& control,
                     std::vector<Subprocess>& members, const std::string& store_port, int host,
                     int rank) {
  Subprocess d = spawn_child_in(cluster, host, "view_member",
                                {"d", std::to_string(rank), "joiner", control.path()},
                                dynamic_env(cluster, host, store_port));
  CHECK(d.read_line() == "group: a b d");
  CHECK(d.read_line() == "a answered " + cluster.address(1));
  control.set("done");
  for (auto& m : members) {
    CHECK(m.read_line() == "left");
    CHECK(m.wait() == 0);
  }
  CHECK(d.wait() == 0);
}

}  // namespace

TEST_CASE("a dynamic group across hosts drops a member cut off or stopped mid-run, takes new "
          "joiners, and the lost worker learns that it was evicted when it is back",
          "[multihost][dynamic][partition]") {
  if (skipped()) return;
  // Host 3's link cut and restored, or c's process stopped and continued.
  const bool stop = GENERATE(false, true);
  INFO((stop ? "c stopped (SIGSTOP)" : "host 3's link cut"));
  NetnsCluster cluster({.hosts = 5});
  const ControlFile control;
  const std::string store_port = "29900";
  Subprocess store = spawn_store_server_in(cluster, 0, store_port);
  auto env_of = [&](int host) { return dynamic_env(cluster, host, store_port); };
  std::vector<Subprocess> members;
  const std::vector<std::string> names = {"a", "b", "c"};
  for (int i = 0; i < 3; ++i) {
    members.push_back(spawn_child_in(
        cluster, i + 1, "view_member",
        {names[i], std::to_string(i), i == 2 ? "cutoff" : "member", control.path()},
        env_of(i + 1)));
    REQUIRE(members.back().read_line() == "ready");
  }
  if (stop) {
    members[2].kill(SIGSTOP);
  } else {
    cluster.cut(3);  // c's host
  }
  control.set("cut");
  for (int i = 0; i < 2; ++i) {
    const std::string line = members[i].read_line();
    INFO(names[i] << " said: " << line);
    REQUIRE_THAT(line, Catch::StartsWith("c left after "));
    // The heartbeat timeout, then at most a poll of the member list.
    CHECK(std::stoi(line.substr(13)) <= kDynamicHeartbeatMs + 3000);
    CHECK_THAT(line, Catch::EndsWith("group: a b"));
  }
  Subprocess d = spawn_child_in(cluster, 4, "view_member",
                                {"d", "3", "joiner", control.path()}, env_of(4));
  CHECK(d.read_line() == "group: a b d");
  CHECK(d.read_line() == "a answered " + cluster.address(1));
  control.set("joined");
  for (int i = 0; i < 2; ++i) CHECK(members[i].read_line() == "d answered " + cluster.address(4));

  if (stop) {
    members[2].kill(SIGCONT);
  } else {
    cluster.restore(3);
  }
  // Back, c finds itself off the member list (it evicts no one).
  CHECK(members[2].read_line() == "evicted");
  const std::string call = members[2].read_line();
  CHECK_THAT(call, Catch::Contains("this worker \"c\" was evicted from the dynamic group"));
  CHECK(members[2].wait() == 0);

  control.set("done");
  for (int i = 0; i < 2; ++i) {
    CHECK(members[i].read_line() == "left");
    CHECK(members[i].wait() == 0);
  }
  CHECK(d.wait() == 0);
  store.kill(SIGTERM);
  store.wait();
}

TEST_CASE("a partition with both sides still reaching the store: the larger side keeps the "
          "group and evicts the smaller, a tie goes to the side holding rank 0, and every "
          "member ends with that one view",
          "[multihost][dynamic][partition]") {
  if (skipped()) return;
  struct Case {
    std::vector<std::vector<int>> sides;  // ranks
    std::set<int> keeps;
  };
  // Five members split 2 / 3; four split 2 / 2 (rank 0 with rank 3).
  const Case c = GENERATE(Case{{{0, 1}, {2, 3, 4}}, {2, 3, 4}}, Case{{{0, 3}, {1, 2}}, {0, 3}});
  int n = 0;
  for (const auto& side : c.sides) n += static_cast<int>(side.size());
  const std::vector<std::string> names = {"a", "b", "c", "d", "e"};
  std::vector<std::string> kept;
  for (int r : c.keeps) kept.push_back(names[r]);
  const std::string expected = fmt::format("{}", fmt::join(kept, " "));
  INFO(n << " members; the side that keeps the group: " << expected);
  NetnsCluster cluster({.hosts = n + 1});
  const ControlFile control;
  const std::string store_port = "29950";
  Subprocess store = spawn_store_server_in(cluster, 0, store_port);
  std::vector<Subprocess> members;
  for (int r = 0; r < n; ++r) {
    members.push_back(
        spawn_child_in(cluster, r + 1, "split_member",
                       {names[r], std::to_string(r), control.path(), expected},
                       dynamic_env(cluster, r + 1, store_port)));
    REQUIRE(members.back().read_line() == "ready");
  }
  // Member r runs in host r + 1; the store's host 0 is in neither side.
  std::vector<std::vector<int>> hosts;
  for (const auto& side : c.sides) {
    hosts.emplace_back();
    for (int r : side) hosts.back().push_back(r + 1);
  }
  cluster.partition(hosts);
  control.set("split");
  for (int r = 0; r < n; ++r) {
    const std::string line = members[r].read_line();
    INFO(names[r] << " said: " << line);
    CHECK(line == (c.keeps.count(r) ? "group: " + expected : std::string("evicted")));
  }
  cluster.heal();
  control.set("done");
  for (auto& m : members) CHECK(m.wait() == 0);
  store.kill(SIGTERM);
  store.wait();
}

TEST_CASE("a store server restarted empty under a dynamic group across hosts gets the group "
          "back from its members, and a joiner joins that group",
          "[multihost][dynamic][store]") {
  if (skipped()) return;
  NetnsCluster cluster({.hosts = 4});
  const ControlFile control;
  const std::string store_port = "29990";
  auto env_of = [&](int host) { return dynamic_env(cluster, host, store_port); };
  Subprocess store = spawn_store_server_in(cluster, 0, store_port);
  std::vector<Subprocess> members = steady_members(cluster, control, store_port);
  store.kill(SIGTERM);
  store.wait();
  Subprocess again = spawn_store_server_in(cluster, 0, store_port);
  // A member writes the group back; the joiner comes after that.
  Subprocess restored = spawn_child_in(cluster, 0, "store_wait",
                                       {"pipe/dyn/group", "pipe/dyn/members"}, env_of(0));
  REQUIRE(restored.read_line() == "ok");
  CHECK(restored.wait() == 0);
  join_then_leave(cluster, control, members, store_port, 3, 2);
  again.kill(SIGTERM);
  again.wait();
}

TEST_CASE("a store server restarted empty while the members cannot reach it: a worker that "
          "founds a group there is told by error, naming the members' group, once they reach "
          "the store again and take it back; the next joiner joins their group",
          "[multihost][dynamic][store]") {
  if (skipped()) return;
  NetnsCluster cluster({.hosts = 5});
  const ControlFile control;
  const std::string store_port = "29995";
  auto env_of = [&](int host) { return dynamic_env(cluster, host, store_port); };
  Subprocess store = spawn_store_server_in(cluster, 0, store_port);
  std::vector<Subprocess> members = steady_members(cluster, control, store_port);
  // The members lose the store's host (they still reach each other); the
  // store restarts empty; c, on a host that reaches the store, finds no
  // group there and founds one, on probation for its heartbeat timeout
  // (10 s).
  cluster.partition({{1, 2}, {0}});
  store.kill(SIGTERM);
  store.wait();
  Subprocess again = spawn_store_server_in(cluster, 0, store_port);
  Subprocess c =
      spawn_child_in(cluster, 3, "view_member",
                     {"c", "2", "founder", control.path(), "10000"}, env_of(3));
  CHECK(c.read_line() == "group: c");
  // The members reach the store again: they take it back, and c is out,
  // told why.
  cluster.heal();
  CHECK(c.read_line() == "evicted");
  const std::string call = c.read_line();
  CHECK_THAT(call, Catch::Contains("this worker \"c\" was evicted") &&
                       Catch::Contains("the store was restarted empty") &&
                       Catch::Contains("(members \"a\", \"b\")"));
  CHECK(c.wait() == 0);
  join_then_leave(cluster, control, members, store_port, 4, 3);
  again.kill(SIGTERM);
  again.wait();
}

TEST_CASE("with a job secret, an outsider on the network can neither read the group from the "
          "store nor join it, and the group keeps working",
          "[multihost][auth]") {
  if (skipped()) return;
  NetnsCluster cluster({.hosts = 4});
  const ControlFile control;
  const std::string dir = control.path().substr(0, control.path().rfind('/'));
  const std::string secret = dir + "/secret";
  const std::string wrong = dir + "/wrong";
  switchboard::Secret::random().write_file(secret);
  switchboard::Secret::random().write_file(wrong);
  const std::string store_port = "29970";
  Subprocess store =
      spawn_store_server_in(cluster, 0, store_port, {"--secret-file", secret});
  auto env_of = [&](int host) {
    auto env = dynamic_env(cluster, host, store_port);
    env["SWITCHBOARD_SECRET_FILE"] = secret;
    return env;
  };
  Subprocess m0 =
      spawn_child_in(cluster, 1, "secret_member", {"m0", "0", control.path()}, env_of(1));
  const std::string line = m0.read_line();
  REQUIRE_THAT(line, Catch::StartsWith("listening "));
  const std::string at = line.substr(10, line.find(' ', 10) - 10);
  REQUIRE(m0.read_line() == "ready");
  Subprocess m1 =
      spawn_child_in(cluster, 2, "secret_member", {"m1", "1", control.path()}, env_of(2));
  m1.read_line();
  REQUIRE(m1.read_line() == "ready");

  for (const std::string& has : {std::string("none"), wrong}) {
    INFO("the outsider's secret: " << has);
    Subprocess outsider = spawn_child_in(cluster, 3, "outsider", {at, has},
                                         dynamic_env(cluster, 3, store_port));
    const std::string out = outsider.read_all();
    INFO("it printed:\n" << out);
    CHECK(outsider.wait() == 0);
    CHECK_THAT(out, Catch::Contains("store: ") && !Catch::Contains("store: ok"));
    CHECK_THAT(out, Catch::Contains("join: ") && !Catch::Contains("join: ok"));
    if (has == "none") {
      CHECK_THAT(out, Catch::Contains("requires the job secret"));
    } else {
      CHECK_THAT(out, Catch::Contains("store: AuthenticationError"));
      CHECK_THAT(out, Catch::Contains("join: AuthenticationError"));
    }
  }
  // A worker with the secret joins and calls the members; only it was served.
  Subprocess joiner = spawn_child_in(
      cluster, 3, "view_member", {"j", "5", "joiner", control.path(), "m0"}, env_of(3));
  CHECK(joiner.read_line() == "group: j m0 m1");
  CHECK(joiner.read_line() == "m0 answered " + cluster.address(1));
  control.set("done");
  CHECK(joiner.wait() == 0);
  // m0 served the joiner's call, and nothing else.
  const std::string served = m0.read_all();
  CHECK(served == "served where\n");
  CHECK(m0.wait() == 0);
  m1.read_all();
  CHECK(m1.wait() == 0);
  store.kill(SIGTERM);
  store.wait();
}
