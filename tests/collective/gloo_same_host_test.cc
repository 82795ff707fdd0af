// GlooProcessGroup's same-host collectives (collective/gloo_same_host.h):
// ranks of one host move allreduce, reduce, reduce_scatter, broadcast,
// allgather and barrier through shared memory, exactly over many chunks;
// every rank must agree to it; and its failures are named as Gloo's are:
// ops that disagree, a rank that never comes, a peer process that dies, a
// rank that gave up.
//
// The other collective suites run both ways (their *_tcp_test twins set
// SWITCHBOARD_GLOO_SHM=0); this one is about the shared memory itself.
// Nothing here sleeps hoping for an order: a rank that is late simply
// issues nothing (or blocks on a promise).

#include <fmt/format.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <future>
#include <optional>
#include <string>
#include <vector>

#include "collective/gloo_process_group.h"
#include "common/error.h"
#include "core/tensor.h"
#include "store/hash_store.h"
#include "store/tcp_store.h"
#include "store/tcp_store_server.h"
#include "tests/collective/pg_harness.h"
#include "tests/util/subprocess.h"

using namespace switchboard;
using namespace switchboard::collective;
using namespace std::chrono_literals;

namespace {

// Waits for the op's own end (Work::wait's default bound is the group
// timeout, which would race the op's).
sbtest::Outcome outcome_of(const Work& work) {
  return sbtest::wait_for_failure(work, std::chrono::hours(1));
}

GlooOptions options_for(const std::string& group, std::chrono::milliseconds timeout) {
  return sbtest::loopback_options(group, timeout);
}

// Rank r's value at element i: distinct per rank and element, exact in
// int64 and float64 sums.
double input_value(int r, int64_t i) {
  return static_cast<double>((i % 1009) + 1000 * r);
}

}  // namespace

TEST_CASE("ranks of one host share memory unless any rank turns it off",
          "[collective][gloo][same_host]") {
  {
    auto groups = sbtest::make_groups(3, sbtest::unique_group_name("shm-on"));
    for (auto& g : groups) CHECK(g->same_host_memory());
  }
  // One rank without it: the whole group stays on TCP, and still works.
  HashStore store;
  const std::string group = sbtest::unique_group_name("shm-off");
  sbtest::Groups groups(2);
  sbtest::run_threads(
      2,
      [&](int rank) {
        GlooOptions options = options_for(group, 30s);
        options.same_host_memory = rank != 1;
        groups[rank] = std::make_unique<GlooProcessGroup>(store, rank, 2, options);
      },
      sbtest::watchdog_for(30s));
  sbtest::report(sbtest::run_on(groups, [](ProcessGroup& pg, sbtest::RankLog& log) {
    auto& gloo = dynamic_cast<GlooProcessGroup&>(pg);
    log.expect(!gloo.same_host_memory(), "same_host_memory() is false on every rank");
    Tensor t = Tensor::from_vector(std::vector<float>{1.0f, 2.0f});
    pg.allreduce(t).wait();
    log.expect_values(t, {2.0, 4.0}, "allreduce over TCP");
  }));
}

TEST_CASE(
    "allreduce, reduce, reduce_scatter, broadcast and allgather over many chunks are "
    "exact",
    "[collective][gloo][same_host]") {
  const int n = GENERATE(2, 3);
  const DType dtype = GENERATE(DType::kInt64, DType::kFloat32);
  // 10 MiB and a bit: more than two chunks (a rank's slot is at most 4
  // MiB), in an odd number of elements, so that chunks, shares and the
  // tail all fall mid-line.
  const size_t element = dtype == DType::kInt64 ? 8 : 4;
  const int64_t numel = static_cast<int64_t>((size_t{10} << 20) / element) | 1;
  auto groups = sbtest::make_groups(n, sbtest::unique_group_name("shm-chunks"));
  sbtest::report(sbtest::run_on(groups, [&](ProcessGroup& pg, sbtest::RankLog& log) {
    const std::string what = fmt::format("{} x {} on {} ranks", numel, element, n);
    Tensor t = Tensor::zeros({numel}, dtype);
    for (int64_t i = 0; i < numel; ++i)
      sbtest::set_element(t, i, input_value(pg.rank(), i));
    pg.allreduce(t).wait();
    std::vector<double> sum(static_cast<size_t>(numel));
    for (int64_t i = 0; i < numel; ++i) {
      for (int r = 0; r < n; ++r) sum[i] += input_value(r, i);
    }
    log.expect_values(t, sum, "allreduce of " + what);

    Tensor b = Tensor::zeros({numel}, dtype);
    for (int64_t i = 0; i < numel; ++i)
      sbtest::set_element(b, i, input_value(pg.rank(), i));
    pg.broadcast(b, n - 1).wait();
    std::vector<double> from_last(static_cast<size_t>(numel));
    for (int64_t i = 0; i < numel; ++i) from_last[i] = input_value(n - 1, i);
    log.expect_values(b, from_last, "broadcast of " + what);

    Tensor mine = Tensor::zeros({numel}, dtype);
    for (int64_t i = 0; i < numel; ++i)
      sbtest::set_element(mine, i, input_value(pg.rank(), i));
    std::vector<Tensor> all;
    for (int r = 0; r < n; ++r) all.push_back(Tensor::zeros({numel}, dtype));
    pg.allgather(all, mine).wait();
    for (int r = 0; r < n; ++r) {
      std::vector<double> theirs(static_cast<size_t>(numel));
      for (int64_t i = 0; i < numel; ++i) theirs[i] = input_value(r, i);
      log.expect_values(all[r], theirs,
                        fmt::format("allgather of {}: rank {}'s", what, r));
    }
    // reduce: the root's tensor only.
    Tensor r = Tensor::zeros({numel}, dtype);
    for (int64_t i = 0; i < numel; ++i)
      sbtest::set_element(r, i, input_value(pg.rank(), i));
    pg.reduce(r, 1).wait();
    std::vector<double> own(static_cast<size_t>(numel));
    for (int64_t i = 0; i < numel; ++i) own[i] = input_value(pg.rank(), i);
    log.expect_values(r, pg.rank() == 1 ? sum : own, "reduce to rank 1 of " + what);

    // reduce_scatter: input q of rank r is input_value(r + q, i); rank q
    // ends with the sum over r. Half the size (every rank sends n inputs),
    // still several chunks (a rank's slot holds a piece for every rank).
    const int64_t half = numel / 2 | 1;
    std::vector<Tensor> inputs;
    for (int q = 0; q < n; ++q) {
      inputs.push_back(Tensor::zeros({half}, dtype));
      for (int64_t i = 0; i < half; ++i) {
        sbtest::set_element(inputs[q], i, input_value(pg.rank() + q, i));
      }
    }
    Tensor scattered = Tensor::zeros({half}, dtype);
    pg.reduce_scatter(scattered, inputs).wait();
    std::vector<double> mine_summed(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i) {
      for (int q = 0; q < n; ++q) mine_summed[i] += input_value(q + pg.rank(), i);
    }
    log.expect_values(scattered, mine_summed, "reduce_scatter of " + what);
    pg.barrier().wait();
  }));
}

TEST_CASE(
    "ranks whose ops disagree fail on every rank naming each side, and the group says "
    "so after",
    "[collective][gloo][same_host][mismatch]") {
  // Sizes that disagree meet at the op's first barrier; an op that is not
  // in shared memory at all (reduce) is found by the group's watch.
  const bool other_op = GENERATE(false, true);
  auto groups = sbtest::make_groups(2, sbtest::unique_group_name("shm-mismatch"));
  std::vector<sbtest::Outcome> outcomes(2);
  sbtest::report(sbtest::run_on(groups, [&](ProcessGroup& pg, sbtest::RankLog& log) {
    Tensor t = Tensor::zeros({pg.rank() == 0 ? 3 : 4}, DType::kFloat32);
    Work work = pg.rank() == 1 && other_op ? pg.reduce(t, 0) : pg.allreduce(t);
    outcomes[pg.rank()] = outcome_of(work);
    Tensor again = Tensor::zeros({2}, DType::kFloat32);
    const sbtest::Outcome next = outcome_of(pg.allreduce(again));
    log.expect(next.kind != "none", "the op after the mismatch fails: " + next.message);
  }));
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank << ": " << outcomes[rank].kind << ": "
                 << outcomes[rank].message);
    CHECK(outcomes[rank].kind == "Error(FailedPrecondition)");
    CHECK_THAT(outcomes[rank].message, Catch::Contains("the ranks disagree"));
    CHECK_THAT(outcomes[rank].message, Catch::Contains("float32[3]"));
    CHECK_THAT(outcomes[rank].message, Catch::Contains("float32[4]"));
    if (other_op)
      CHECK_THAT(outcomes[rank].message, Catch::Contains("reduce(SUM) at root 0"));
  }
}

TEST_CASE("a rank that never comes times out naming it, and the others then fail at once",
          "[collective][gloo][same_host][timeout]") {
  // Ranks 0 and 1 allreduce; rank 2 issues nothing until they failed.
  auto groups = sbtest::make_groups(3, sbtest::unique_group_name("shm-late"), 1500ms);
  std::vector<sbtest::Outcome> outcomes(3);
  std::promise<void> failed[2];
  sbtest::report(sbtest::run_on(groups, [&](ProcessGroup& pg, sbtest::RankLog& log) {
    Tensor t = Tensor::zeros({16}, DType::kFloat32);
    if (pg.rank() == 2) {
      failed[0].get_future().wait();
      failed[1].get_future().wait();
    }
    outcomes[pg.rank()] = outcome_of(pg.allreduce(t));
    if (pg.rank() < 2) failed[pg.rank()].set_value();
  }));
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank << ": " << outcomes[rank].kind << ": "
                 << outcomes[rank].message);
    // Its own timeout, or the other's (which it then names).
    CHECK((outcomes[rank].kind == "TimeoutError" ||
           outcomes[rank].kind == "ConnectionError"));
    CHECK_THAT(outcomes[rank].message, Catch::Contains("ranks [2]"));
    CHECK_THAT(outcomes[rank].message, Catch::Contains("1500 ms"));
  }
  INFO("rank 2: " << outcomes[2].kind << ": " << outcomes[2].message);
  CHECK(outcomes[2].kind == "ConnectionError");
  CHECK_THAT(outcomes[2].message, Catch::Contains("gave up on the op"));
}

// args: port, rank, size, group. Joins, says whether the group shares
// memory, then blocks until killed.
SB_CHILD_MAIN(shm_idle) {
  auto store = sbtest::connect_store(args.at(0));
  GlooProcessGroup pg(*store, std::stoi(args.at(1)), std::stoi(args.at(2)),
                      options_for(args.at(3), 60s));
  fmt::print("joined {}\n", pg.same_host_memory() ? "shared" : "tcp");
  std::fflush(stdout);
  std::promise<void> never;
  never.get_future().wait();
  return 1;
}

TEST_CASE("a peer process killed mid-op is named with its pid, before any timeout",
          "[collective][gloo][same_host][multiprocess]") {
  TcpStoreServer server;
  const std::string group = sbtest::unique_group_name("shm-killed");
  auto peer =
      sbtest::spawn_child("shm_idle", {std::to_string(server.port()), "1", "2", group});
  auto store = sbtest::connect_store(std::to_string(server.port()));
  // An hour's timeout: only the pid's end can end this wait.
  GlooProcessGroup pg(*store, 0, 2, options_for(group, std::chrono::hours(1)));
  REQUIRE(peer.read_line() == "joined shared");
  REQUIRE(pg.same_host_memory());
  Tensor t = Tensor::zeros({1000}, DType::kFloat32);
  Work work = pg.allreduce(t);
  const pid_t pid = peer.pid();
  peer.kill(SIGKILL);
  CHECK(peer.wait() == 128 + SIGKILL);
  const sbtest::Outcome outcome = outcome_of(work);
  INFO(outcome.kind << ": " << outcome.message);
  CHECK(outcome.kind == "ConnectionError");
  CHECK_THAT(outcome.message, Catch::Contains("allreduce"));
  CHECK_THAT(outcome.message, Catch::Contains(group));
  CHECK_THAT(outcome.message,
             Catch::Contains(fmt::format("rank 1 (pid {}) exited", pid)));
  // The next op says the group failed, naming the first failure.
  const sbtest::Outcome next = outcome_of(pg.broadcast(t, 0));
  CHECK(next.kind == "ConnectionError");
  CHECK_THAT(next.message, Catch::Contains("first failure"));
}
