// GlooProcessGroup under failure: a peer that never arrives (at rendezvous
// or at a collective), a wait shorter than the op, a peer that goes away
// mid-op in-process or is killed with SIGKILL; and real processes running
// collectives over a TcpStoreServer on loopback.
//
// Every failure must surface as a typed error naming what was waited for,
// in bounded time; nothing here sleeps hoping for an order: an idle rank is
// simply one that issues nothing (or blocks on a promise).
#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <fstream>
#include <future>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "collective/gloo_process_group.h"
#include "core/tensor.h"
#include "common/error.h"
#include "rpc/future.h"
#include "store/hash_store.h"
#include "store/tcp_store.h"
#include "store/tcp_store_server.h"
#include "tests/collective/pg_harness.h"
#include "tests/util/subprocess.h"

using namespace switchboard;
using namespace switchboard::collective;
namespace rpc = switchboard::rpc;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::chrono::milliseconds kShortTimeout{1500};

std::chrono::milliseconds since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
}

using sbtest::Outcome;
using sbtest::wait_for_failure;

Tensor ones(int64_t n) { return Tensor::from_vector(std::vector<float>(n, 1.0f)); }

GlooOptions options_for(const std::string& group, std::chrono::milliseconds timeout) {
  return sbtest::loopback_options(group, timeout);
}

}  // namespace

TEST_CASE(
    "a collective one rank never joins times out naming the op, group, rank and timeout",
    "[collective][gloo][timeout]") {
  // Rank 1 is constructed but never issues anything.
  const std::string op =
      GENERATE(as<std::string>{}, "allreduce", "barrier", "broadcast", "recv");
  const std::string group = sbtest::unique_group_name("never-joins-" + op);
  auto groups = sbtest::make_groups(2, group, kShortTimeout);
  ProcessGroup& pg = *groups[0];
  Tensor t = ones(8);
  std::optional<Work> work;
  if (op == "allreduce") work = pg.allreduce(t);
  if (op == "barrier") work = pg.barrier();
  if (op == "broadcast") work = pg.broadcast(t, 1);
  if (op == "recv") work = pg.recv(t, 1);
  // A collective issued after it (it would run beside a recv: see below).
  Tensor behind = ones(3);
  std::optional<Work> queued;
  if (op != "recv") queued = pg.allreduce(behind);
  Outcome outcome = wait_for_failure(*work);
  INFO(op << ": " << outcome.kind << " after " << outcome.elapsed.count()
          << " ms: " << outcome.message);
  CHECK(outcome.kind == "TimeoutError");
  CHECK_THAT(outcome.message, Catch::Contains(op));
  CHECK_THAT(outcome.message, Catch::Contains(group));
  CHECK_THAT(outcome.message, Catch::Contains("rank 0"));
  CHECK_THAT(outcome.message, Catch::Contains("1500"));
  CHECK(outcome.elapsed >= 1000ms);  // it did wait, about the group timeout
  CHECK(outcome.elapsed < 30s);      // and no longer than a loaded machine explains
  // What was queued behind it fails too (or its wait times out): no hang.
  if (queued) {
    Outcome next = wait_for_failure(*queued);
    INFO("the allreduce issued after it: " << next.kind << ": " << next.message);
    CHECK(next.kind != "none");
    CHECK(next.elapsed < 30s);
  }
}

TEST_CASE("a recv failed by another op's timeout reports a timeout, not a lost peer",
          "[collective][gloo][timeout][p2p]") {
  // Rank 1 stays silent. Rank 0's allreduce times out; Gloo then closes the
  // pairs, which fails the pending recv too. Nobody closed a connection: the
  // peer stayed silent, which the contract reports as TimeoutError.
  const std::string group = sbtest::unique_group_name("recv-beside-timeout");
  auto groups = sbtest::make_groups(2, group, kShortTimeout);
  ProcessGroup& pg = *groups[0];
  Tensor got = ones(4);
  Work received = pg.recv(got, 1, 9);
  Tensor t = ones(4);
  Outcome collective = wait_for_failure(pg.allreduce(t));
  INFO("allreduce: " << collective.kind << ": " << collective.message);
  CHECK(collective.kind == "TimeoutError");
  Outcome outcome = wait_for_failure(received);
  INFO("recv: " << outcome.kind << " after " << outcome.elapsed.count()
                << " ms: " << outcome.message);
  CHECK(outcome.kind == "TimeoutError");
  CHECK_THAT(outcome.message, Catch::Contains("recv"));
  CHECK_THAT(outcome.message, Catch::Contains(group));
  CHECK(outcome.elapsed < 30s);
}

TEST_CASE(
    "wait() with a shorter timeout throws naming the op, and the op still completes",
    "[collective][gloo][timeout]") {
  const std::string group = sbtest::unique_group_name("short-wait");
  auto groups = sbtest::make_groups(2, group, 60s);
  Tensor a = ones(5);
  Tensor b = ones(5);
  Work early = groups[0]->allreduce(a);
  Outcome outcome = wait_for_failure(early, 200ms);
  INFO(outcome.kind << " after " << outcome.elapsed.count()
                    << " ms: " << outcome.message);
  CHECK(outcome.kind == "TimeoutError");
  CHECK_THAT(outcome.message, Catch::Contains("allreduce"));
  CHECK_THAT(outcome.message, Catch::Contains(group));
  CHECK_THAT(outcome.message, Catch::Contains("200"));
  CHECK(outcome.elapsed < 30s);
  CHECK_FALSE(early.is_completed());

  // The late rank joins: the op was not cancelled by the expired wait.
  Work late = groups[1]->allreduce(b);
  late.wait();
  early.wait();
  CHECK(a.to_vector<float>() == std::vector<float>(5, 2.0f));
  CHECK(b.to_vector<float>() == std::vector<float>(5, 2.0f));
}

TEST_CASE("a recv whose wait() expired completes once the send is posted",
          "[collective][gloo][timeout][p2p]") {
  const std::string group = sbtest::unique_group_name("short-recv");
  auto groups = sbtest::make_groups(2, group, 60s);
  Tensor got = Tensor::zeros({3}, DType::kInt64);
  Work received = groups[1]->recv(got, 0, 4);
  Outcome outcome = wait_for_failure(received, 100ms);
  INFO(outcome.kind << ": " << outcome.message);
  CHECK(outcome.kind == "TimeoutError");
  CHECK_THAT(outcome.message, Catch::Contains("recv"));
  CHECK_THAT(outcome.message, Catch::Contains("rank 1"));
  Tensor sent = Tensor::from_vector(std::vector<int64_t>{7, 8, 9});
  Outcome send_after;
  std::optional<Work> sending;
  try {
    sending = groups[0]->send(sent, 1, 4);
    send_after = wait_for_failure(*sending);
  } catch (const std::exception& e) {
    send_after = {"thrown by send() itself", e.what()};
  }
  Outcome recv_after = wait_for_failure(received);
  INFO("recv then: " << recv_after.kind << ": " << recv_after.message);
  INFO("send then: " << send_after.kind << ": " << send_after.message);
  CHECK(recv_after.kind == "none");
  CHECK(send_after.kind == "none");
  CHECK(got.to_vector<int64_t>() == std::vector<int64_t>{7, 8, 9});
}

TEST_CASE("construction times out naming the group and the rank that never came",
          "[collective][gloo][timeout][rendezvous]") {
  // Ranks 0 and 2 of 3 arrive; rank 1 never does.
  const std::string group = sbtest::unique_group_name("no-show");
  HashStore store;
  std::vector<Outcome> outcomes(3);
  const auto start = Clock::now();
  sbtest::run_threads(
      3,
      [&](int rank) {
        if (rank == 1) return;
        try {
          GlooProcessGroup pg(store, rank, 3, options_for(group, kShortTimeout));
          outcomes[rank].kind = "none";
        } catch (const TimeoutError& e) {
          outcomes[rank] = {"TimeoutError", e.what()};
        } catch (const std::exception& e) {
          outcomes[rank] = {"other", e.what()};
        }
        outcomes[rank].elapsed = since(start);
      },
      sbtest::watchdog_for(kShortTimeout));
  for (int rank : {0, 2}) {
    const Outcome& outcome = outcomes[rank];
    INFO("rank " << rank << ": " << outcome.kind << " after " << outcome.elapsed.count()
                 << " ms: " << outcome.message);
    CHECK(outcome.kind == "TimeoutError");
    CHECK_THAT(outcome.message, Catch::Contains(group));
    CHECK_THAT(outcome.message, Catch::Contains(std::to_string(rank)));
    CHECK_THAT(outcome.message,
               Catch::Matches(R"(.*ranks?\W*1\b.*)", Catch::CaseSensitive::No));
    CHECK(outcome.elapsed >= 1000ms);
    CHECK(outcome.elapsed < 30s);
  }
}

TEST_CASE(
    "a peer that destroys its group mid-op fails the other rank's op instead of hanging",
    "[collective][gloo][failure]") {
  const std::string group = sbtest::unique_group_name("peer-gone");
  auto groups = sbtest::make_groups(2, group, 20s);
  // Both ranks finish one allreduce, so the connections are known good.
  sbtest::report(sbtest::run_on(groups, [](ProcessGroup& pg, sbtest::RankLog& log) {
    Tensor t = ones(4);
    pg.allreduce(t).wait();
    log.expect(t.to_vector<float>() == std::vector<float>(4, 2.0f), "warm-up allreduce");
  }));
  Tensor t = ones(1000);
  Work work = groups[0]->allreduce(t);
  groups[1].reset();
  Outcome outcome = wait_for_failure(work);
  INFO(outcome.kind << " after " << outcome.elapsed.count()
                    << " ms: " << outcome.message);
  CHECK((outcome.kind == "ConnectionError" || outcome.kind == "TimeoutError"));
  CHECK_THAT(outcome.message, Catch::Contains("allreduce"));
  CHECK_THAT(outcome.message, Catch::Contains(group));
  CHECK(outcome.elapsed < 60s);
  // The broken group is still safe to use: a later op fails too.
  Tensor later = ones(4);
  Outcome again = wait_for_failure(groups[0]->allreduce(later));
  INFO("later op: " << again.kind << ": " << again.message);
  CHECK(again.kind != "none");
}

// ---------------------------------------------------------------------------
// Real processes over a TcpStoreServer.

namespace {

std::unique_ptr<TcpStore> connect(const std::string& port) {
  return sbtest::connect_store(port);
}

template <typename T>
std::string line(std::string_view name, const std::vector<T>& values) {
  return fmt::format("{} {}", name, fmt::join(values, " "));
}

// What rank r of n prints; the child computes it through the group, the
// parent from these formulas.
std::vector<float> allreduce_input(int r) {
  return {float(r + 1), float(2 * r), 0.5f, float(-r)};
}
std::vector<int32_t> alltoall_input(int r, int n) {
  std::vector<int32_t> out;
  for (int k = 0; k < n; ++k) {
    for (int j = 0; j < 2; ++j) out.push_back(100 * r + 10 * k + j);
  }
  return out;
}

}  // namespace

// args: port, rank, size, group. Runs allreduce, allgather, alltoall_single
// and a ring send/recv, printing one line per op, then "done".
SB_CHILD_MAIN(pg_rank) {
  auto store = connect(args.at(0));
  const int rank = std::stoi(args.at(1));
  const int size = std::stoi(args.at(2));
  GlooProcessGroup pg(*store, rank, size, options_for(args.at(3), 60s));

  Tensor summed = Tensor::from_vector(allreduce_input(rank));
  pg.allreduce(summed).wait();
  fmt::print("{}\n", line("allreduce", summed.to_vector<float>()));

  Tensor mine = Tensor::from_vector(std::vector<int64_t>{rank * 10, rank * 10 + 1});
  std::vector<Tensor> gathered;
  for (int q = 0; q < size; ++q) gathered.push_back(Tensor::zeros({2}, DType::kInt64));
  pg.allgather(gathered, mine).wait();
  std::vector<int64_t> all;
  for (auto& t : gathered) {
    for (int64_t v : t.to_vector<int64_t>()) all.push_back(v);
  }
  fmt::print("{}\n", line("allgather", all));

  Tensor in = Tensor::from_vector(alltoall_input(rank, size), {2 * size});
  Tensor out = Tensor::zeros({2 * size}, DType::kInt32);
  pg.alltoall_single(out, in).wait();
  fmt::print("{}\n", line("alltoall_single", out.to_vector<int32_t>()));

  Tensor note = Tensor::from_vector(std::vector<int32_t>{rank});
  Tensor heard = Tensor::zeros({1}, DType::kInt32);
  Work sent = pg.send(note, (rank + 1) % size);
  pg.recv(heard, (rank + size - 1) % size).wait();
  sent.wait();
  fmt::print("{}\n", line("recv", heard.to_vector<int32_t>()));

  pg.barrier().wait();
  fmt::print("done\n");
  std::fflush(stdout);
  return 0;
}

// args: port, rank, size, group. Joins the group, says so, then blocks
// forever (the parent kills it).
SB_CHILD_MAIN(pg_idle) {
  auto store = connect(args.at(0));
  GlooProcessGroup pg(*store, std::stoi(args.at(1)), std::stoi(args.at(2)),
                      options_for(args.at(3), 60s));
  fmt::print("joined\n");
  std::fflush(stdout);
  std::promise<void> never;
  never.get_future().wait();
  return 1;
}

TEST_CASE(
    "three processes on loopback agree on allreduce, allgather, alltoall_single and a "
    "ring",
    "[collective][gloo][multiprocess]") {
  constexpr int n = 3;
  TcpStoreServer server;
  const std::string group = sbtest::unique_group_name("processes");
  std::vector<sbtest::Subprocess> children;
  for (int r = 0; r < n; ++r) {
    children.push_back(sbtest::spawn_child(
        "pg_rank",
        {std::to_string(server.port()), std::to_string(r), std::to_string(n), group}));
  }
  std::vector<float> sum(4, 0.0f);
  for (int q = 0; q < n; ++q) {
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += allreduce_input(q)[i];
  }
  for (int r = 0; r < n; ++r) {
    std::vector<int32_t> exchanged;
    for (int k = 0; k < n; ++k) {
      for (int j = 0; j < 2; ++j) exchanged.push_back(alltoall_input(k, n)[2 * r + j]);
    }
    const std::string expected =
        fmt::format("{}\n{}\n{}\n{}\ndone\n", line("allreduce", sum),
                    line("allgather", std::vector<int64_t>{0, 1, 10, 11, 20, 21}),
                    line("alltoall_single", exchanged),
                    line("recv", std::vector<int32_t>{(r + n - 1) % n}));
    INFO("rank " << r);
    CHECK(children[r].read_all() == expected);
    CHECK(children[r].wait() == 0);
  }
}

TEST_CASE("a peer process killed with SIGKILL mid-op fails the op instead of hanging",
          "[collective][gloo][multiprocess][failure]") {
  TcpStoreServer server;
  const std::string group = sbtest::unique_group_name("killed");
  auto peer =
      sbtest::spawn_child("pg_idle", {std::to_string(server.port()), "1", "2", group});
  auto store = connect(std::to_string(server.port()));
  GlooProcessGroup pg(*store, 0, 2, options_for(group, 20s));
  REQUIRE(peer.read_line() == "joined");
  Tensor t = ones(1000);
  Work work = pg.allreduce(t);
  peer.kill(SIGKILL);
  CHECK(peer.wait() == 128 + SIGKILL);
  Outcome outcome = wait_for_failure(work);
  INFO(outcome.kind << " after " << outcome.elapsed.count()
                    << " ms: " << outcome.message);
  CHECK((outcome.kind == "ConnectionError" || outcome.kind == "TimeoutError"));
  CHECK_THAT(outcome.message, Catch::Contains("allreduce"));
  CHECK_THAT(outcome.message, Catch::Contains(group));
  CHECK_THAT(outcome.message, Catch::Contains("rank 0"));
  CHECK(outcome.elapsed < 60s);
}

TEST_CASE(
    "a rank killed while idle between ops fails the survivors' next allreduce with "
    "ConnectionError and ends no process",
    "[collective][gloo][multiprocess][failure]") {
  // Ranks 0, 2 and 3 here, rank 1 a child killed between two ops. In the
  // ring, ranks 0 and 2 meet the dead connection at once; rank 3 waits on
  // live ranks only, past the signature watcher's suspicion (1 s), whose
  // exchange then meets the dead rank on the watcher's own thread.
  TcpStoreServer server;
  const std::string group = sbtest::unique_group_name("killed-idle");
  auto peer =
      sbtest::spawn_child("pg_idle", {std::to_string(server.port()), "1", "4", group});
  const std::vector<int> ranks = {0, 2, 3};
  std::vector<std::unique_ptr<TcpStore>> stores;
  for (size_t i = 0; i < ranks.size(); ++i) stores.push_back(connect(std::to_string(server.port())));
  std::vector<std::unique_ptr<GlooProcessGroup>> pgs(ranks.size());
  sbtest::run_threads(
      static_cast<int>(ranks.size()),
      [&](int i) {
        pgs[i] = std::make_unique<GlooProcessGroup>(*stores[i], ranks[i], 4,
                                                    options_for(group, 20s));
      },
      sbtest::watchdog_for(20s));
  REQUIRE(peer.read_line() == "joined");
  peer.kill(SIGKILL);
  CHECK(peer.wait() == 128 + SIGKILL);
  std::vector<Tensor> inputs;
  std::vector<Work> works;
  for (size_t i = 0; i < ranks.size(); ++i) {
    inputs.push_back(ones(1000));
    works.push_back(pgs[i]->allreduce(inputs.back()));
  }
  for (size_t i = 0; i < ranks.size(); ++i) {
    Outcome outcome = wait_for_failure(works[i]);
    INFO("rank " << ranks[i] << ": " << outcome.kind << " after " << outcome.elapsed.count()
                 << " ms: " << outcome.message);
    CHECK(outcome.kind == "ConnectionError");
    CHECK_THAT(outcome.message, Catch::Contains("allreduce"));
    CHECK_THAT(outcome.message, Catch::Contains(group));
    CHECK(outcome.elapsed < 15s);  // well before the group's timeout (20 s)
  }
  // The survivors' process is alive and its groups can be destroyed.
  pgs.clear();
}

// ---- SIGPIPE policy (in children: the disposition is process-wide) -------

namespace {

void report_sigpipe(const char* when) {
  struct sigaction current {};
  ::sigaction(SIGPIPE, nullptr, &current);
  const char* what = current.sa_handler == SIG_DFL   ? "default"
                     : current.sa_handler == SIG_IGN ? "ignored"
                                                     : "handler";
  fmt::print("{} {}\n", when, what);
  std::fflush(stdout);
}

void make_one_rank_group() {
  HashStore store;
  GlooProcessGroup group(store, 0, 1, options_for("sigpipe", 10s));
}

void count_sigpipe(int) {}

}  // namespace

SB_CHILD_MAIN(sigpipe_default) {
  ::signal(SIGPIPE, SIG_DFL);  // the test runner may have passed SIG_IGN down
  report_sigpipe("before");
  make_one_rank_group();
  report_sigpipe("after");
  return 0;
}

SB_CHILD_MAIN(sigpipe_handler) {
  ::signal(SIGPIPE, count_sigpipe);
  make_one_rank_group();
  report_sigpipe("after");
  return 0;
}

TEST_CASE("a Gloo group makes SIGPIPE harmless unless the program handles it",
          "[gloo][failure]") {
  // Gloo writes without MSG_NOSIGNAL; a write to a peer that exited would
  // otherwise kill the process instead of failing the op.
  sbtest::Subprocess child = sbtest::spawn_child("sigpipe_default");
  CHECK(child.read_all() == "before default\nafter ignored\n");
  CHECK(child.wait() == 0);
  sbtest::Subprocess handled = sbtest::spawn_child("sigpipe_handler");
  CHECK(handled.read_all() == "after handler\n");
  CHECK(handled.wait() == 0);
}

namespace {

// The TCP ports listening on 127.0.0.1 in this network namespace
// (/proc/net/tcp; IPv4).
std::set<int> loopback_listeners() {
  std::ifstream in("/proc/net/tcp");
  std::string line;
  std::getline(in, line);  // header
  std::set<int> out;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state;
    fields >> slot >> local >> remote >> state;
    if (state != "0A" || local.substr(0, 8) != "0100007F") continue;
    out.insert(static_cast<int>(std::stoul(local.substr(9), nullptr, 16)));
  }
  return out;
}

// Connects to 127.0.0.1:port; -1 when refused.
int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

TEST_CASE("a stranger's bytes sent to a Gloo listener while the group forms crash nothing; "
          "the group's ops end in a typed error or succeed, and a new group works",
          "[collective][gloo][hostile]") {
  const std::string group = sbtest::unique_group_name("stranger");
  const std::set<int> before = loopback_listeners();
  // Rank 0 publishes its address in the store once it listens: at each
  // write the store looks for the new listener, and says when it is there.
  struct TellingStore : HashStore {
    using HashStore::set;
    explicit TellingStore(std::set<int> before) : before(std::move(before)) {}
    const std::set<int> before;
    std::shared_ptr<rpc::Promise<std::set<int>>> listening =
        std::make_shared<rpc::Promise<std::set<int>>>();
    void set(const std::string& key, const Bytes& value) override {
      std::set<int> fresh;
      for (int port : loopback_listeners()) {
        if (!before.count(port)) fresh.insert(port);
      }
      if (!fresh.empty()) listening->set_value(fresh);  // false (ignored) after the first
      HashStore::set(key, value);
    }
  };
  TellingStore store(before);
  std::unique_ptr<ProcessGroup> ranks[2];
  std::string construction[2];
  auto construct = [&](int r) {
    try {
      ranks[r] = std::make_unique<GlooProcessGroup>(store, r, 2, options_for(group, 3s));
    } catch (const Error& e) {
      construction[r] = e.what();
    }
  };
  std::thread first([&] { construct(0); });
  // Rank 0 listens while it waits for rank 1 (which has not started).
  rpc::Future<std::set<int>> listening = store.listening->get_future();
  REQUIRE(listening.wait_for(30s));
  const std::set<int> fresh = listening.value();
  REQUIRE_FALSE(fresh.empty());
  std::vector<int> strangers;
  std::mt19937 rng(7);
  for (int port : fresh) {
    // Garbage, all-ones bytes (a huge length or rank), and a connection
    // that says nothing and stays open.
    for (int kind = 0; kind < 3; ++kind) {
      const int fd = connect_to(port);
      if (fd < 0) continue;
      std::vector<uint8_t> bytes(kind == 0 ? 4096 : 16);
      for (auto& b : bytes) b = static_cast<uint8_t>(rng());
      if (kind == 1) std::fill(bytes.begin(), bytes.end(), 0xff);
      if (kind < 2) (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      strangers.push_back(fd);
    }
  }
  construct(1);
  first.join();
  // Gloo cannot tell a stranger from a peer: the group may be wedged (its
  // ops then time out, as with a lost peer), but the process lives and
  // every error is a typed one, in bounded time.
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << construction[r]);
    CHECK((ranks[r] != nullptr || !construction[r].empty()));
  }
  if (ranks[0] && ranks[1]) {
    Tensor a = ones(4);
    Tensor b = ones(4);
    Work wa = ranks[0]->allreduce(a);
    Work wb = ranks[1]->allreduce(b);
    const Outcome oa = wait_for_failure(wa);
    const Outcome ob = wait_for_failure(wb);
    INFO("rank 0: " << oa.kind << " " << oa.message << "; rank 1: " << ob.kind << " "
                    << ob.message);
    for (const Outcome* o : {&oa, &ob}) {
      CHECK((o->kind == "none" || o->kind == "TimeoutError" || o->kind == "ConnectionError"));
      CHECK(o->elapsed < 30s);
    }
  }
  for (int fd : strangers) ::close(fd);
  // A new group of the same process works.
  auto again = sbtest::make_groups(store, 2, group + "-again", 30s);
  Tensor a = ones(4);
  Tensor b = ones(4);
  Work wa = again[0]->allreduce(a);
  Work wb = again[1]->allreduce(b);
  wa.wait();
  wb.wait();
  CHECK(a.data_as<float>()[0] == 2.0f);
}
