// PIPE dynamic groups: workers join and leave while the others run.
//
// Workers are RpcContexts on threads of this process over one HashStore,
// on 127.0.0.1. Membership events are awaited through on_join/on_leave
// callbacks (bounded by kGuard), never by sleeping. The only durations are
// timeouts and, in the dead-holder case, the lease of a token value written
// as a killed joiner would have left it.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "agents/builtin_backends.h"
#include "agents/pipe/announcement.h"
#include "common/error.h"
#include "common/logging.h"
#include "core/tensor.h"
#include "rendezvous/membership_token.h"
#include "rpc/backend_registry.h"
#include "rpc/rpc.h"
#include "store/hash_store.h"
#include "store/prefix_store.h"
#include "store/tcp_store.h"
#include "store/tcp_store_server.h"
#include "tests/util/scoped_env.h"
#include "tests/util/subprocess.h"
#include "tests/util/threads.h"

using namespace switchboard;
using namespace std::chrono_literals;
using rpc::RpcContext;
using rpc::WorkerInfo;
using rpc::with_timeout;
using testing::Gate;
using testing::on_threads;
using testing::rethrow_first;
using sbtest::Subprocess;

namespace {

constexpr std::chrono::milliseconds kGuard = 60s;

std::shared_ptr<rpc::RpcBackendOptions> options(std::chrono::milliseconds timeout = 30s,
                                                const rpc::Extras& more = {}) {
  rpc::Extras extras{{"listen_address", "127.0.0.1"}, {"num_worker_threads", "4"}};
  for (const auto& [key, value] : more) extras[key] = value;
  return rpc::construct_rpc_backend_options(rpc::backend_type("PIPE"), timeout, "env://",
                                            extras);
}

// Names the worker sets of membership events, and waits for them.
class Events {
 public:
  void attach(RpcContext& ctx) {
    ctx.on_join([this](const WorkerInfo& w) { add(joined_, w.name); });
    ctx.on_leave([this](const WorkerInfo& w) { add(left_, w.name); });
  }
  bool wait_joined(const std::set<std::string>& names) { return wait(joined_, names); }
  bool wait_left(const std::set<std::string>& names) { return wait(left_, names); }
  std::set<std::string> joined() {
    std::lock_guard lock(mu_);
    return joined_;
  }

 private:
  void add(std::set<std::string>& to, const std::string& name) {
    std::lock_guard lock(mu_);
    to.insert(name);
    cv_.notify_all();
  }
  bool wait(std::set<std::string>& in, const std::set<std::string>& names) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, kGuard, [&] {
      return std::includes(in.begin(), in.end(), names.begin(), names.end());
    });
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<std::string> joined_;
  std::set<std::string> left_;
};

// A dynamic worker serving "whoami" (its name) and "add".
struct Worker {
  Worker(const std::string& name, int rank, std::shared_ptr<Store> store,
         std::shared_ptr<rpc::RpcBackendOptions> opts = options())
      : name(name) {
    ctx.register_function("whoami", [name] { return name; });
    ctx.register_function("add", [](int64_t a, int64_t b) { return a + b; });
    events.attach(ctx);
    ctx.init_rpc(name, "PIPE", rank, std::nullopt, std::move(opts), std::move(store));
  }
  ~Worker() { ctx.shutdown(false); }

  std::set<std::string> members() {
    std::set<std::string> out;
    for (const WorkerInfo& w : ctx.get_worker_infos()) out.insert(w.name);
    return out;
  }

  std::string name;
  RpcContext ctx;
  Events events;
};

// What a call threw: "ConnectionError: ..." and so on.
std::string failure_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const ConnectionError& e) {
    return std::string("ConnectionError: ") + e.what();
  } catch (const TimeoutError& e) {
    return std::string("TimeoutError: ") + e.what();
  } catch (const NotFoundError& e) {
    return std::string("NotFoundError: ") + e.what();
  } catch (const std::invalid_argument& e) {
    return std::string("invalid_argument: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("other: ") + e.what();
  }
  return "none";
}

}  // namespace

TEST_CASE("workers join one at a time, see each other, and the members learn of them",
          "[pipe][dynamic]") {
  auto store = std::make_shared<HashStore>();
  Worker ps("ps", 0, store);
  CHECK(ps.members() == std::set<std::string>{"ps"});
  Worker t1("trainer-1", 1, store);
  Worker t2("trainer-2", 2, store);
  const std::set<std::string> all{"ps", "trainer-1", "trainer-2"};
  REQUIRE(ps.events.wait_joined({"trainer-1", "trainer-2"}));
  REQUIRE(t1.events.wait_joined({"trainer-2"}));
  CHECK(t2.events.joined().empty());  // the members present at init are not events
  CHECK(ps.members() == all);
  CHECK(t1.members() == all);
  CHECK(t2.members() == all);
  for (Worker* from : {&ps, &t1, &t2}) {
    for (const char* to : {"ps", "trainer-1", "trainer-2"}) {
      CHECK(from->ctx.rpc_sync<std::string>(to, "whoami") == to);
    }
  }
  CHECK(t2.ctx.get_worker_info("ps").id == 0);
  CHECK(ps.ctx.rpc_sync<int64_t>(2, "add", int64_t{40}, int64_t{2}) == 42);
}

TEST_CASE("a worker that leaves is reported, and calls to it fail at once naming it",
          "[pipe][dynamic]") {
  auto store = std::make_shared<HashStore>();
  Worker w0("w0", 0, store);
  Worker w1("w1", 1, store);
  Worker w2("w2", 2, store);
  w1.ctx.shutdown(true, kGuard);  // leave
  REQUIRE(w0.events.wait_left({"w1"}));
  REQUIRE(w2.events.wait_left({"w1"}));
  CHECK(w0.members() == std::set<std::string>{"w0", "w2"});
  // No timeout at all: the call can only end by failing at once.
  const std::string failure = failure_of(
      [&] { w0.ctx.rpc_sync<std::string>("w1", "whoami", with_timeout(0ms)); });
  CHECK_THAT(failure, Catch::StartsWith("ConnectionError"));
  CHECK_THAT(failure, Catch::Contains("\"w1\" left the group"));
  CHECK(w0.ctx.rpc_sync<std::string>("w2", "whoami") == "w2");
  CHECK(w2.ctx.rpc_sync<std::string>("w0", "whoami") == "w0");
}

TEST_CASE("rank 0 may leave; the others keep working and new workers still join",
          "[pipe][dynamic]") {
  auto store = std::make_shared<HashStore>();
  auto w0 = std::make_unique<Worker>("w0", 0, store);
  Worker w1("w1", 1, store);
  Worker w2("w2", 2, store);
  w0->ctx.shutdown(true, kGuard);
  REQUIRE(w1.events.wait_left({"w0"}));
  REQUIRE(w2.events.wait_left({"w0"}));
  w0.reset();
  Worker w3("w3", 3, store);
  REQUIRE(w1.events.wait_joined({"w3"}));
  CHECK(w3.members() == std::set<std::string>{"w1", "w2", "w3"});
  CHECK(w3.ctx.rpc_sync<std::string>("w1", "whoami") == "w1");
  CHECK(w2.ctx.rpc_sync<std::string>("w3", "whoami") == "w3");
}

TEST_CASE("several workers joining and leaving at once all succeed", "[pipe][dynamic]") {
  auto store = std::make_shared<HashStore>();
  Worker anchor("anchor", 0, store);
  std::vector<std::unique_ptr<Worker>> leavers;
  for (int i = 1; i <= 2; ++i) {
    leavers.push_back(std::make_unique<Worker>(fmt::format("leaver-{}", i), i, store));
  }
  std::vector<std::unique_ptr<Worker>> joiners(4);
  rethrow_first(on_threads(6, [&](int i) {
    if (i < 4) {
      joiners[i] = std::make_unique<Worker>(fmt::format("joiner-{}", i), 10 + i, store);
    } else {
      leavers[i - 4]->ctx.shutdown(true, kGuard);
    }
  }));
  REQUIRE(anchor.events.wait_joined({"joiner-0", "joiner-1", "joiner-2", "joiner-3"}));
  REQUIRE(anchor.events.wait_left({"leaver-1", "leaver-2"}));
  const std::set<std::string> expected{"anchor", "joiner-0", "joiner-1", "joiner-2",
                                       "joiner-3"};
  CHECK(anchor.members() == expected);
  for (auto& j : joiners) {
    for (const std::string& to : expected) {
      CHECK(j->ctx.rpc_sync<std::string>(to, "whoami") == to);
    }
  }
}

TEST_CASE("a joiner with an invalid device map is refused and the group is unaffected",
          "[pipe][dynamic][device_map]") {
  auto store = std::make_shared<HashStore>();
  Worker w0("w0", 0, store, options(30s, {{"device_count", "1"}}));
  Worker w1("w1", 1, store, options(30s, {{"device_count", "1"}}));
  auto bad = options(30s, {{"device_count", "1"}});
  dynamic_cast<agents::PipeRpcBackendOptions&>(*bad).set_device_map("w1",
                                                                    {{"cuda:0", "cuda:5"}});
  const std::string failure = failure_of([&] { Worker w2("w2", 2, store, bad); });
  CHECK_THAT(failure, Catch::StartsWith("invalid_argument"));
  CHECK_THAT(failure, Catch::Contains("cuda:5"));
  CHECK_THAT(failure, Catch::Contains("\"w2\""));
  CHECK(w0.members() == std::set<std::string>{"w0", "w1"});
  CHECK(w0.ctx.rpc_sync<std::string>("w1", "whoami") == "w1");
  // The refused joiner released the token and never took its rank.
  Worker w2("w2", 2, store, options(30s, {{"device_count", "1"}}));
  CHECK(w2.members() == std::set<std::string>{"w0", "w1", "w2"});
}

TEST_CASE("a joiner killed while holding the token holds the group up for one lease only",
          "[pipe][dynamic][token]") {
  auto store = std::make_shared<HashStore>();
  Worker w0("w0", 0, store);
  // What a joiner killed mid-join leaves in the store: its token, with a
  // 2 s lease, which the others count from when they first see it
  // (docs/wire_formats.md).
  const std::string ghost = "ghost\n9223372036854775807\n2000\n1";
  store->set("pipe/dyn/token", Bytes(ghost.begin(), ghost.end()));
  // Inside the lease: a joiner that will not wait is refused, naming it.
  const std::string failure = failure_of([&] { Worker hasty("hasty", 1, store, options(50ms)); });
  CHECK_THAT(failure, Catch::StartsWith("TimeoutError"));
  CHECK_THAT(failure, Catch::Contains("held by \"ghost\""));
  // One that waits gets in once the lease is over.
  Worker w2("w2", 2, store);
  CHECK(w2.members() == std::set<std::string>{"w0", "w2"});
  CHECK(w2.ctx.rpc_sync<std::string>("w0", "whoami") == "w0");
}

TEST_CASE("ranks are never reused; a name may come back after its worker left",
          "[pipe][dynamic]") {
  auto store = std::make_shared<HashStore>();
  Worker w0("w0", 0, store);
  {
    Worker w1("w1", 1, store);
    w1.ctx.shutdown(true, kGuard);
  }
  REQUIRE(w0.events.wait_left({"w1"}));
  const std::string reused = failure_of([&] { Worker again("w1-again", 1, store); });
  CHECK_THAT(reused, Catch::StartsWith("invalid_argument"));
  CHECK_THAT(reused, Catch::Contains("rank 1 was taken by worker \"w1\""));
  const std::string duplicate = failure_of([&] { Worker twin("w0", 7, store); });
  CHECK_THAT(duplicate, Catch::Contains("\"w0\" is used by rank 0"));
  Worker back("w1", 5, store);
  CHECK(w0.ctx.rpc_sync<std::string>("w1", "whoami") == "w1");
  CHECK(w0.ctx.get_worker_info("w1").id == 5);
}

TEST_CASE("a leaving worker finishes the calls it is serving before it goes",
          "[pipe][dynamic][join]") {
  auto store = std::make_shared<HashStore>();
  auto gate = std::make_shared<Gate>(kGuard);
  Worker w0("w0", 0, store);
  RpcContext w1;
  w1.register_function("gated", [gate](int64_t v) {
    gate->pass();
    return v + 1;
  });
  w1.init_rpc("w1", "PIPE", 1, std::nullopt, options(), store);
  auto call = w0.ctx.rpc_async<int64_t>("w1", "gated", int64_t{41});
  REQUIRE(gate->wait_arrived(1));
  std::exception_ptr leave_error;
  std::thread leaver([&] {
    try {
      w1.shutdown(true, kGuard);
    } catch (...) {
      leave_error = std::current_exception();
    }
  });
  // New calls fail once w0 has the goodbye; the one in flight completes.
  REQUIRE(w0.events.wait_left({"w1"}));
  CHECK_THAT(failure_of([&] { w0.ctx.rpc_sync<int64_t>("w1", "gated", int64_t{0}); }),
             Catch::Contains("left the group"));
  gate->open();
  CHECK(call.value() == 42);
  leaver.join();
  CHECK(leave_error == nullptr);
}

TEST_CASE("static and dynamic workers cannot form one group", "[pipe][dynamic]") {
  SECTION("a dynamic worker meets a static group") {
    auto store = std::make_shared<HashStore>();
    std::vector<std::unique_ptr<RpcContext>> group(2);
    rethrow_first(on_threads(2, [&](int rank) {
      group[rank] = std::make_unique<RpcContext>();
      group[rank]->init_rpc(fmt::format("s{}", rank), "PIPE", rank, 2, options(), store);
    }));
    RpcContext joiner;
    const std::string failure = failure_of(
        [&] { joiner.init_rpc("d0", "PIPE", 5, std::nullopt, options(), store); });
    CHECK_THAT(failure, Catch::StartsWith("invalid_argument"));
    CHECK_THAT(failure, Catch::Contains("would join a dynamic group"));
    CHECK_THAT(failure, Catch::Contains("holds a static group"));
    on_threads(2, [&](int rank) { group[rank]->shutdown(true, kGuard); });
  }
  SECTION("a static worker meets a dynamic group") {
    auto store = std::make_shared<HashStore>();
    Worker d0("d0", 0, store);
    RpcContext s0;
    const std::string failure =
        failure_of([&] { s0.init_rpc("s0", "PIPE", 0, 1, options(), store); });
    CHECK_THAT(failure, Catch::Contains("would join a static group (world_size 1)"));
    CHECK_THAT(failure, Catch::Contains("holds a dynamic group"));
    CHECK(d0.members() == std::set<std::string>{"d0"});
  }
}

// ---- a joiner SIGKILLed while it holds the token ---------------------------

namespace {

TcpStoreOptions client_options() {
  TcpStoreOptions options;
  options.timeout = kGuard;
  return options;
}

void say(const std::string& line) {
  fmt::print("{}\n", line);
  std::fflush(stdout);
}

}  // namespace

// args: store port, name, rank, membership_lease_ms. Joins the dynamic
// group, says "joined", serves "add", and stays until the store key
// "release" is set (or it is killed).
SB_CHILD_MAIN(dynamic_worker) {
  // Logs to stderr, as in every Switchboard binary: stdout carries the
  // lines the test reads.
  switchboard::init_logging("dynamic_worker");
  const auto port = static_cast<uint16_t>(std::stoi(args.at(0)));
  auto store = std::make_shared<TcpStore>("127.0.0.1", port, client_options());
  RpcContext ctx;
  ctx.register_function("add", [](int64_t a, int64_t b) { return a + b; });
  ctx.init_rpc(args.at(1), "PIPE", std::stoi(args.at(2)), std::nullopt,
               options(kGuard, {{"membership_lease_ms", args.at(3)}}), store);
  say("joined");
  TcpStore waiter("127.0.0.1", port, client_options());
  waiter.wait({"release"}, kGuard);
  ctx.shutdown(false);
  return 0;
}

// The member is stopped (SIGSTOP), so a joiner that connects to it waits
// for its answer while holding the token; killing that joiner then leaves
// the token behind, as a crash mid-join does.
TEST_CASE("a joiner killed mid-join, holding the token, holds the group up for one lease",
          "[pipe][dynamic][token][multiprocess]") {
  TcpStoreServer server;
  const std::string port = std::to_string(server.port());
  Subprocess member = sbtest::spawn_child("dynamic_worker", {port, "m0", "0", "10000"});
  REQUIRE(member.read_line(std::chrono::seconds(60)) == "joined");
  member.kill(SIGSTOP);
  // The token is free (m0 released it); delete the key so that the victim's
  // compare_set creates it, and wait for that: the victim then holds the
  // token and is inside its join, waiting for the stopped member.
  TcpStore store("127.0.0.1", server.port(), client_options());
  REQUIRE(store.check({"pipe/dyn/token"}));
  store.delete_key("pipe/dyn/token");
  Subprocess victim = sbtest::spawn_child("dynamic_worker", {port, "victim", "1", "1000"});
  store.wait({"pipe/dyn/token"}, kGuard);
  const Bytes value = store.get("pipe/dyn/token");
  const std::string holder =
      rendezvous::MembershipToken::holder_of(std::string(value.begin(), value.end()));
  REQUIRE(holder == "victim");
  victim.kill(SIGKILL);
  CHECK(victim.wait() == 128 + SIGKILL);
  member.kill(SIGCONT);
  // A new joiner waits out the victim's 1 s lease, takes the token over and
  // joins the member; the victim never made it into the group.
  auto client = std::make_shared<TcpStore>("127.0.0.1", server.port(), client_options());
  Worker survivor("survivor", 2, client);
  CHECK(survivor.members() == std::set<std::string>{"m0", "survivor"});
  CHECK(survivor.ctx.rpc_sync<int64_t>("m0", "add", int64_t{2}, int64_t{3}) == 5);
  CHECK(failure_of([&] { survivor.ctx.rpc_sync<int64_t>("victim", "add", int64_t{1},
                                                        int64_t{1}); }) != "none");
  store.set("release", Bytes{1});
  CHECK(member.wait() == 0);
}

// ---- one view of the group: the member list in the store -------------------

namespace {

// What the membership watcher of the group's members poll: every
// heartbeat_timeout / 4 (250 ms here).
std::shared_ptr<rpc::RpcBackendOptions> watched_options() {
  return options(30s, {{"heartbeat_timeout_ms", "1000"}});
}

// Takes rank `rank` off the member list of the dynamic group in `store`,
// under the token, with `why` as the record of its eviction: what a member
// that lost it does.
void evict_in_store(const std::shared_ptr<Store>& store, int rank, const std::string& why) {
  auto pipe = std::make_shared<PrefixStore>("pipe", store);
  rendezvous::MembershipToken token(pipe, "dyn/token", "the test");
  token.acquire(kGuard);
  std::vector<agents::pipe::Member> members =
      agents::pipe::decode_members(pipe->get("dyn/members"));
  std::erase_if(members, [&](const agents::pipe::Member& m) { return m.rank == rank; });
  pipe->set(fmt::format("dyn/evicted/{}", rank), Bytes(why.begin(), why.end()));
  pipe->set("dyn/members", agents::pipe::encode_members(members));
  token.release();
}

std::set<std::string> names_in_store(Store& store) {
  std::set<std::string> out;
  for (const agents::pipe::Member& m :
       agents::pipe::decode_members(store.get("pipe/dyn/members"))) {
    out.insert(m.announcement.name);
  }
  return out;
}

}  // namespace

TEST_CASE("a worker taken off the store's member list is dropped by every member, and "
          "learns that it was evicted",
          "[pipe][dynamic][membership]") {
  auto store = std::make_shared<HashStore>();
  Worker a("a", 0, store, watched_options());
  Worker b("b", 1, store, watched_options());
  Worker c("c", 2, store, watched_options());
  REQUIRE(a.events.wait_joined({"b", "c"}));
  REQUIRE(b.events.wait_joined({"c"}));

  evict_in_store(store, 2, "by \"the test\": to see what follows");
  // The members read the list and drop c; c finds itself off it and
  // reports every member, itself included, as gone.
  REQUIRE(a.events.wait_left({"c"}));
  REQUIRE(b.events.wait_left({"c"}));
  REQUIRE(c.events.wait_left({"a", "b", "c"}));

  // Whether a saw the list or c's closed connection first, the call fails
  // at once naming c.
  const std::string to_c =
      failure_of([&] { a.ctx.rpc_sync<std::string>("c", "whoami", with_timeout(0ms)); });
  CHECK_THAT(to_c, Catch::StartsWith("ConnectionError"));
  CHECK_THAT(to_c, Catch::Contains("worker \"c\" "));
  const std::string from_c =
      failure_of([&] { c.ctx.rpc_sync<std::string>("a", "whoami", with_timeout(0ms)); });
  CHECK_THAT(from_c, Catch::StartsWith("ConnectionError"));
  CHECK_THAT(from_c, Catch::Contains("this worker \"c\" was evicted from the dynamic group"));
  CHECK_THAT(from_c, Catch::Contains("to see what follows"));

  // The others go on as one group, and a joiner sees the same group.
  CHECK(a.ctx.rpc_sync<std::string>("b", "whoami") == "b");
  Worker d("d", 3, store, watched_options());
  CHECK(d.members() == std::set<std::string>{"a", "b", "d"});
  REQUIRE(a.events.wait_joined({"d"}));
  CHECK(a.members() == std::set<std::string>{"a", "b", "d"});
  CHECK(d.ctx.rpc_sync<std::string>("a", "whoami") == "a");
  // An evicted worker leaves without touching the list.
  c.ctx.shutdown(true, kGuard);
  CHECK(names_in_store(*store) == std::set<std::string>{"a", "b", "d"});
}

TEST_CASE("a member that shuts down without leaving is taken off the member list by the "
          "others",
          "[pipe][dynamic][membership]") {
  auto store = std::make_shared<HashStore>();
  Worker a("a", 0, store, watched_options());
  Worker b("b", 1, store, watched_options());
  {
    Worker c("c", 2, store, watched_options());
    REQUIRE(a.events.wait_joined({"c"}));
    c.ctx.shutdown(false);  // a goodbye, but the list still names it
  }
  REQUIRE(a.events.wait_left({"c"}));
  // A member takes it off; wait for the list to say so (no timing).
  store->wait({"pipe/dyn/evicted/2"}, kGuard);
  CHECK(names_in_store(*store) == std::set<std::string>{"a", "b"});
  const Bytes why = store->get("pipe/dyn/evicted/2");
  CHECK_THAT(std::string(why.begin(), why.end()), Catch::Contains("shut down without leaving"));
}

// args: store port, name, rank. Joins with a 1 s heartbeat timeout, says
// "joined", then waits until it is told that it left the group itself
// (evicted), says "evicted", and what a call to "a" fails with.
SB_CHILD_MAIN(evictable_worker) {
  switchboard::init_logging("evictable_worker");
  const auto port = static_cast<uint16_t>(std::stoi(args.at(0)));
  auto store = std::make_shared<TcpStore>("127.0.0.1", port, client_options());
  Worker me(args.at(1), std::stoi(args.at(2)), store, watched_options());
  say("joined");
  if (!me.events.wait_left({args.at(1)})) {
    say("never learned that it was evicted");
    return 1;
  }
  say("evicted");
  say(failure_of([&] { me.ctx.rpc_sync<std::string>("a", "whoami", with_timeout(0ms)); }));
  return 0;
}

// Holds c's process stopped while the list changes: the members learn it
// from the list, not from c (which cannot close anything) nor from a
// heartbeat (30 s, far beyond the guard of each wait).
TEST_CASE("members drop a worker the list no longer names, even while its connection is up",
          "[pipe][dynamic][membership][multiprocess]") {
  TcpStoreServer server;
  const std::string port = std::to_string(server.port());
  auto client = [&] { return std::make_shared<TcpStore>("127.0.0.1", server.port(),
                                                        client_options()); };
  auto patient = options(30s, {{"heartbeat_timeout_ms", "30000"}});
  Worker a("a", 0, client(), patient);
  Worker b("b", 1, client(), patient);
  Subprocess c = sbtest::spawn_child("evictable_worker", {port, "c", "2"});
  REQUIRE(c.read_line(std::chrono::seconds(60)) == "joined");
  REQUIRE(a.events.wait_joined({"c"}));
  REQUIRE(b.events.wait_joined({"c"}));

  c.kill(SIGSTOP);
  evict_in_store(client(), 2, "by \"the test\": the list decides");
  REQUIRE(a.events.wait_left({"c"}));
  REQUIRE(b.events.wait_left({"c"}));
  for (Worker* w : {&a, &b}) {
    const std::string failure =
        failure_of([&] { w->ctx.rpc_sync<std::string>("c", "whoami", with_timeout(0ms)); });
    CHECK_THAT(failure, Catch::StartsWith("ConnectionError"));
    CHECK_THAT(failure, Catch::Contains("worker \"c\" is no longer in the dynamic group: it "
                                        "was taken off the member list by \"the test\": the "
                                        "list decides"));
  }
  c.kill(SIGCONT);
  CHECK(c.read_line(std::chrono::seconds(60)) == "evicted");
  const std::string failure = c.read_line(std::chrono::seconds(60));
  CHECK_THAT(failure, Catch::Contains("this worker \"c\" was evicted from the dynamic group "
                                      "(by \"the test\": the list decides)"));
  CHECK(c.wait() == 0);
}

TEST_CASE("a member stopped past the heartbeat timeout is evicted by all the others, and "
          "learns it when it resumes",
          "[pipe][dynamic][membership][multiprocess]") {
  TcpStoreServer server;
  const std::string port = std::to_string(server.port());
  auto client = [&] { return std::make_shared<TcpStore>("127.0.0.1", server.port(),
                                                        client_options()); };
  Worker a("a", 0, client(), watched_options());
  Worker b("b", 1, client(), watched_options());
  Subprocess c = sbtest::spawn_child("evictable_worker", {port, "c", "2"});
  REQUIRE(c.read_line(std::chrono::seconds(60)) == "joined");
  REQUIRE(a.events.wait_joined({"c"}));
  REQUIRE(b.events.wait_joined({"c"}));

  c.kill(SIGSTOP);
  // Both members lose it by heartbeat, and one of them takes it off the
  // list: the two agree, and so does the store.
  REQUIRE(a.events.wait_left({"c"}));
  REQUIRE(b.events.wait_left({"c"}));
  TcpStore store("127.0.0.1", server.port(), client_options());
  store.wait({"pipe/dyn/evicted/2"}, kGuard);
  CHECK(names_in_store(store) == std::set<std::string>{"a", "b"});
  CHECK(a.members() == std::set<std::string>{"a", "b"});
  CHECK(b.members() == std::set<std::string>{"a", "b"});

  c.kill(SIGCONT);
  // Resumed, c does not evict the others (it finds itself off the list).
  CHECK(c.read_line(std::chrono::seconds(60)) == "evicted");
  const std::string failure = c.read_line(std::chrono::seconds(60));
  CHECK_THAT(failure, Catch::StartsWith("ConnectionError"));
  CHECK_THAT(failure, Catch::Contains("this worker \"c\" was evicted from the dynamic group"));
  CHECK(c.wait() == 0);
  CHECK(names_in_store(store) == std::set<std::string>{"a", "b"});
  CHECK(a.ctx.rpc_sync<std::string>("b", "whoami") == "b");
}

namespace {

// Members "a" and "b" of a dynamic group over a store server that the test
// restarts empty, on the same port.
struct RestartedStore {
  RestartedStore()
      : server(std::make_unique<TcpStoreServer>()),
        port(server->port()),
        a("a", 0, client(), watched_options()),
        b("b", 1, client(), watched_options()) {
    REQUIRE(a.events.wait_joined({"b"}));
    group = client()->get("pipe/dyn/group");
  }
  std::shared_ptr<TcpStore> client() const {
    return std::make_shared<TcpStore>("127.0.0.1", port, client_options());
  }
  // The server goes, and an empty one takes its port.
  void restart() {
    server.reset();
    TcpStoreServerOptions same_port;
    same_port.port = port;
    server = std::make_unique<TcpStoreServer>(same_port);
  }

  std::unique_ptr<TcpStoreServer> server;
  const uint16_t port;
  Worker a;
  Worker b;
  Bytes group;  // the group's id before the restart
};

}  // namespace

TEST_CASE("a store restarted empty under a running group gets the group back from its "
          "members, and a joiner joins that group",
          "[pipe][dynamic][membership]") {
  RestartedStore g;
  auto client = [&] { return g.client(); };
  Worker& a = g.a;
  Worker& b = g.b;
  const Bytes group = g.group;
  g.restart();
  TcpStore store("127.0.0.1", g.port, client_options());
  // A member notices the lost keys and writes them back (no timing: wait
  // for the key).
  store.wait({"pipe/dyn/members"}, kGuard);
  CHECK(store.get("pipe/dyn/group") == group);
  CHECK(names_in_store(store) == std::set<std::string>{"a", "b"});

  Worker c("c", 2, client(), watched_options());
  CHECK(c.members() == std::set<std::string>{"a", "b", "c"});
  REQUIRE(a.events.wait_joined({"c"}));
  CHECK(c.ctx.rpc_sync<std::string>("a", "whoami") == "a");
  CHECK(b.ctx.rpc_sync<std::string>("c", "whoami") == "c");
}

TEST_CASE("a second group founded in a store restarted empty gives the store back once its "
          "last worker left, and the next joiner joins the first group",
          "[pipe][dynamic][membership]") {
  RestartedStore g;
  auto client = [&] { return g.client(); };
  const Bytes group = g.group;
  g.restart();
  // Before the members are back (they reconnect at their next poll): what
  // a joiner that founded a second group there and then left leaves
  // behind, its id and an empty member list.
  TcpStore store("127.0.0.1", g.port, client_options());
  const std::string other = "second-group";
  store.multi_set({"pipe/dyn/group", "pipe/dyn/members"},
                  {Bytes(other.begin(), other.end()), agents::pipe::encode_members({})});
  // The members take the store back (bounded wait for the key to change).
  CHECK(switchboard::testing::eventually(
      [&] {
        return store.get("pipe/dyn/group") == group &&
               names_in_store(store) == std::set<std::string>{"a", "b"};
      },
      kGuard));
  Worker c("c", 2, client(), watched_options());
  CHECK(c.members() == std::set<std::string>{"a", "b", "c"});
  CHECK(c.ctx.rpc_sync<std::string>("a", "whoami") == "a");
}

namespace {

// A store whose calls wait while the test holds it closed: a member's view
// of the store, paused (as behind a slow or cut link) and resumed at will.
class GatedStore : public Store {
 public:
  explicit GatedStore(std::shared_ptr<Store> store) : store_(std::move(store)) {
    Store::set_timeout(store_->timeout());
  }
  using Store::set;
  using Store::wait;
  static void close() { gate(false); }
  static void open() { gate(true); }

  void set(const std::string& key, const Bytes& value) override {
    pass();
    store_->set(key, value);
  }
  Bytes get(const std::string& key) override {
    pass();
    return store_->get(key);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    pass();
    return store_->add(key, delta);
  }
  Bytes compare_set(const std::string& key, const Bytes& expected,
                    const Bytes& desired) override {
    pass();
    return store_->compare_set(key, expected, desired);
  }
  void wait(const std::vector<std::string>& keys, Timeout timeout) override {
    pass();
    store_->wait(keys, timeout);
  }
  bool check(const std::vector<std::string>& keys) override {
    pass();
    return store_->check(keys);
  }
  bool delete_key(const std::string& key) override {
    pass();
    return store_->delete_key(key);
  }
  int64_t num_keys() override {
    pass();
    return store_->num_keys();
  }
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys) override {
    pass();
    return store_->multi_get(keys);
  }
  void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override {
    pass();
    store_->multi_set(keys, values);
  }
  void set_timeout(Timeout timeout) override {
    Store::set_timeout(timeout);
    store_->set_timeout(timeout);
  }

 private:
  // One gate for every GatedStore of the test (open at first).
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool open = true;
  };
  static Gate& the_gate() {
    static Gate g;
    return g;
  }
  static void gate(bool open) {
    Gate& g = the_gate();
    std::lock_guard lock(g.mu);
    g.open = open;
    g.cv.notify_all();
  }
  static void pass() {
    Gate& g = the_gate();
    std::unique_lock lock(g.mu);
    if (!g.cv.wait_for(lock, kGuard, [&] { return g.open; })) {
      throw TimeoutError("GatedStore: the test never opened the gate");
    }
  }

  std::shared_ptr<Store> store_;
};

}  // namespace

TEST_CASE("a worker that founds a group in a store restarted empty, before the members of the "
          "running group see the store again, is told by error once they take it back, "
          "naming their group; the next joiner joins that group",
          "[pipe][dynamic][membership][store]") {
  auto server = std::make_unique<TcpStoreServer>();
  const uint16_t port = server->port();
  auto client = [&] { return std::make_shared<TcpStore>("127.0.0.1", port, client_options()); };
  Worker a("a", 0, std::make_shared<GatedStore>(client()), watched_options());
  Worker b("b", 1, std::make_shared<GatedStore>(client()), watched_options());
  REQUIRE(a.events.wait_joined({"b"}));
  const Bytes group = client()->get("pipe/dyn/group");
  // The members stop seeing the store; it restarts empty; c finds no group
  // there and founds one (on probation for its heartbeat timeout, 10 s).
  GatedStore::close();
  server.reset();
  TcpStoreServerOptions same_port;
  same_port.port = port;
  server = std::make_unique<TcpStoreServer>(same_port);
  Worker c("c", 2, client(), options(30s, {{"heartbeat_timeout_ms", "10000"}}));
  CHECK(c.members() == std::set<std::string>{"c"});
  // The members see the store again: they take it back, and c is out.
  GatedStore::open();
  REQUIRE(c.events.wait_left({"c"}));
  const std::string failure = failure_of([&] { c.ctx.rpc_sync<std::string>("a", "whoami"); });
  CHECK_THAT(failure, Catch::Contains("this worker \"c\" was evicted") &&
                          Catch::Contains("the store was restarted empty") &&
                          Catch::Contains(fmt::format("dynamic group {} (members \"a\", \"b\")",
                                                      to_string(group))));
  TcpStore store("127.0.0.1", port, client_options());
  CHECK(store.get("pipe/dyn/group") == group);
  CHECK(names_in_store(store) == std::set<std::string>{"a", "b"});
  Worker d("d", 3, client(), watched_options());
  CHECK(d.members() == std::set<std::string>{"a", "b", "d"});
  CHECK(d.ctx.rpc_sync<std::string>("a", "whoami") == "a");
}

// A store server in a process of its own, for the test to stop or kill.
// Says the port it listens on, then serves until killed.
SB_CHILD_MAIN(store_server) {
  TcpStoreServer server;
  say(std::to_string(server.port()));
  for (;;) ::pause();
}

TEST_CASE("a graceful leave with the store server gone returns within its timeout plus the "
          "goodbyes' flush, naming the store, and the other member drops the leaver at once",
          "[pipe][dynamic][membership][store]") {
  // Killed: the connection closes and reconnecting is refused. Stopped
  // (SIGSTOP): every request waits for an answer that never comes.
  const int signal = GENERATE(SIGKILL, SIGSTOP);
  INFO("the store server got signal " << signal);
  Subprocess server = sbtest::spawn_child("store_server");
  const uint16_t port = static_cast<uint16_t>(std::stoi(server.read_line()));
  // The store clients wait a minute per call on their own (kGuard); the
  // leave's one deadline is rpc_timeout, 3 s.
  constexpr auto kRpcTimeout = 3s;
  auto client = [&] { return std::make_shared<TcpStore>("127.0.0.1", port, client_options()); };
  auto opts = [&] { return options(kRpcTimeout, {{"heartbeat_timeout_ms", "1000"}}); };
  Worker a("a", 0, client(), opts());
  Worker b("b", 1, client(), opts());
  REQUIRE(a.events.wait_joined({"b"}));
  server.kill(signal);

  const auto began = std::chrono::steady_clock::now();
  const std::string failure = failure_of([&] { a.ctx.shutdown(/*graceful=*/true); });
  const auto took = std::chrono::steady_clock::now() - began;
  INFO("shutdown threw " << failure);
  // The documented bound: the leave's timeout, then at most 1 s flushing
  // the goodbyes; one more second for the machine.
  CHECK(took < kRpcTimeout + 2s);
  CHECK_THAT(failure, Catch::Contains("left the dynamic group without taking itself off the "
                                      "member list") &&
                          Catch::Contains(fmt::format("127.0.0.1:{}", port)));
  // b heard the goodbye: a is gone from its view, and calls to it fail at
  // once, without the store.
  REQUIRE(b.events.wait_left({"a"}));
  CHECK(b.members() == std::set<std::string>{"b"});
  CHECK_THAT(failure_of([&] { b.ctx.rpc_sync<std::string>("a", "whoami"); }),
             Catch::StartsWith("ConnectionError"));
  // b's own graceful leave is bounded the same way.
  const auto b_began = std::chrono::steady_clock::now();
  CHECK_THAT(failure_of([&] { b.ctx.shutdown(/*graceful=*/true); }),
             Catch::Contains("left the dynamic group without taking itself off"));
  CHECK(std::chrono::steady_clock::now() - b_began < kRpcTimeout + 2s);
  server.kill(SIGKILL);
}

TEST_CASE("a dynamic worker's rank is not held to the WORLD_SIZE of its environment",
          "[pipe][dynamic][rendezvous]") {
  // What tools/launch gives every worker, here two; the worker asks for a
  // dynamic group with rank 5 through env://.
  TcpStoreServer server;
  sbtest::ScopedEnv addr("MASTER_ADDR", "127.0.0.1");
  sbtest::ScopedEnv port("MASTER_PORT", std::to_string(server.port()));
  sbtest::ScopedEnv store("SWITCHBOARD_STORE", "tcp://127.0.0.1:" + std::to_string(server.port()));
  sbtest::ScopedEnv world("WORLD_SIZE", "2");
  sbtest::ScopedEnv rank("RANK", "1");
  RpcContext ctx;
  ctx.register_function("whoami", [] { return std::string("d5"); });
  ctx.init_rpc("d5", "PIPE", 5, rpc::kDynamicGroup, options());
  CHECK(ctx.get_worker_info().id == 5);
  CHECK(ctx.rpc_sync<std::string>("d5", "whoami") == "d5");
  ctx.shutdown(true, kGuard);
}
