// Ranks that disagree on a collective (PyTorch's and Ray's own cases: sizes
// 10 against 5, float32 against float64, a broadcast against an allreduce,
// different roots): before the fix Gloo threw on its I/O thread and the
// process ended. Every rank now fails the op with an error naming the op,
// the group and both sides, at once, and the process lives (the group is
// then unusable, as after a timeout); ranks that agree are unaffected.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collective/gloo_process_group.h"
#include "common/error.h"
#include "core/tensor.h"
#include "store/hash_store.h"
#include "tests/collective/pg_harness.h"

using namespace switchboard;
using namespace switchboard::collective;
using namespace std::chrono_literals;

namespace {

constexpr std::chrono::milliseconds kTimeout = 30s;

// Runs an allreduce the ranks agree on, then op(rank, group), on `n`
// ranks of a fresh group; returns what each rank's wait() of op threw (""
// when it succeeded). The group's timeout is long: an error that came from
// it would not come in time for the guard.
std::vector<std::string> run_ranks(int n,
                                   const std::function<Work(int, GlooProcessGroup&)>& op,
                                   std::chrono::milliseconds timeout = kTimeout) {
  sbtest::Groups groups =
      sbtest::make_groups(n, sbtest::unique_group_name("mismatch"), timeout);
  std::vector<std::string> errors(n);
  std::vector<float> before(n, 0.0f);
  sbtest::run_threads(
      n,
      [&](int rank) {
        Tensor ones = Tensor::from_vector(std::vector<float>(4, 1.0f));
        groups[rank]->allreduce(ones).wait();
        before[rank] = ones.data_as<float>()[0];
        try {
          op(rank, *groups[rank]).wait();
        } catch (const Error& e) {
          errors[rank] = fmt::format("Error({}): {}", error_code_name(e.code()), e.what());
        }
      },
      sbtest::watchdog_for(timeout));
  CHECK(before == std::vector<float>(n, static_cast<float>(n)));
  return errors;
}

std::vector<std::string> run_pair(const std::function<Work(int, GlooProcessGroup&)>& op) {
  return run_ranks(2, op);
}

Tensor floats(int64_t n) { return Tensor::zeros({n}, DType::kFloat32); }

}  // namespace

TEST_CASE("allreduce with 10 elements on one rank and 5 on the other fails on both, naming "
          "both; the process and the group live",
          "[gloo][mismatch]") {
  const auto errors = run_pair([](int rank, GlooProcessGroup& g) {
    Tensor t = floats(rank == 0 ? 10 : 5);
    return g.allreduce(t);
  });
  for (const std::string& error : errors) {
    INFO(error);
    CHECK_THAT(error, Catch::StartsWith("Error(FailedPrecondition)"));
    CHECK_THAT(error, Catch::Contains("allreduce in group \"mismatch-"));
    CHECK_THAT(error, Catch::Contains("the ranks disagree"));
    CHECK_THAT(error, Catch::Contains("rank 0: allreduce(SUM) of float32[10]"));
    CHECK_THAT(error, Catch::Contains("rank 1: allreduce(SUM) of float32[5]"));
  }
}

TEST_CASE("float32 against float64 of the same length fails on both", "[gloo][mismatch]") {
  const auto errors = run_pair([](int rank, GlooProcessGroup& g) {
    Tensor t = Tensor::zeros({4}, rank == 0 ? DType::kFloat32 : DType::kFloat64);
    return g.allreduce(t);
  });
  for (const std::string& error : errors) {
    INFO(error);
    CHECK_THAT(error, Catch::Contains("float32[4]") && Catch::Contains("float64[4]"));
  }
}

TEST_CASE("broadcasts of different sizes, or from different roots, fail on both",
          "[gloo][mismatch]") {
  auto errors = run_pair([](int rank, GlooProcessGroup& g) {
    Tensor t = floats(rank == 0 ? 10 : 5);
    return g.broadcast(t, 0);
  });
  for (const std::string& error : errors) CHECK_THAT(error, Catch::Contains("broadcast"));
  errors = run_pair([](int rank, GlooProcessGroup& g) {
    Tensor t = floats(3);
    return g.broadcast(t, rank);  // each names itself the root
  });
  for (const std::string& error : errors) {
    INFO(error);
    CHECK_THAT(error, Catch::Contains("at root 0") && Catch::Contains("at root 1"));
  }
}

TEST_CASE("one rank's allreduce against the other's broadcast, or barrier, fails on both",
          "[gloo][mismatch]") {
  auto errors = run_pair([](int rank, GlooProcessGroup& g) {
    Tensor t = floats(4);
    return rank == 0 ? g.allreduce(t) : g.broadcast(t, 0);
  });
  for (const std::string& error : errors) {
    INFO(error);
    CHECK_THAT(error, Catch::Contains("the ranks disagree"));
  }
  errors = run_pair([](int rank, GlooProcessGroup& g) {
    Tensor t = floats(4);
    return rank == 0 ? g.allreduce(t) : g.barrier();
  });
  for (const std::string& error : errors) CHECK_THAT(error, Catch::Contains("the ranks disagree"));
}

TEST_CASE("allgather, reduce_scatter and alltoall of different sizes fail on both",
          "[gloo][mismatch]") {
  auto errors = run_pair([](int rank, GlooProcessGroup& g) {
    Tensor in = floats(rank == 0 ? 6 : 3);
    std::vector<Tensor> out{floats(in.numel()), floats(in.numel())};
    return g.allgather(out, in);
  });
  for (const std::string& error : errors) CHECK_THAT(error, Catch::Contains("allgather"));
  errors = run_pair([](int rank, GlooProcessGroup& g) {
    const int64_t n = rank == 0 ? 6 : 3;
    Tensor out = floats(n);
    return g.reduce_scatter(out, {floats(n), floats(n)});
  });
  for (const std::string& error : errors) CHECK_THAT(error, Catch::Contains("reduce_scatter"));
  errors = run_pair([](int rank, GlooProcessGroup& g) {
    const int64_t n = rank == 0 ? 6 : 3;
    std::vector<Tensor> out{floats(n), floats(n)};
    return g.alltoall(out, {floats(n), floats(n)});
  });
  for (const std::string& error : errors) CHECK_THAT(error, Catch::Contains("alltoall"));
}

TEST_CASE("an empty tensor on one rank against elements on the other fails on both, "
          "instead of one rank waiting alone",
          "[gloo][mismatch]") {
  const auto errors = run_pair([](int rank, GlooProcessGroup& g) {
    Tensor t = floats(rank == 0 ? 0 : 4);
    return g.allreduce(t);
  });
  for (const std::string& error : errors) CHECK_THAT(error, Catch::Contains("float32[0]"));
}

TEST_CASE("in a group of four, one rank that disagrees fails the op on every rank",
          "[gloo][mismatch]") {
  // With a group timeout of an hour, nothing here may wait for it: a rank
  // whose first peer closed before it did once kept its other connections
  // open, and two ranks waited for the timeout (the test's own limit ends
  // such a run).
  const auto errors = run_ranks(
      4,
      [](int rank, GlooProcessGroup& g) {
        Tensor t = floats(rank == 2 ? 3 : 8);
        return g.allreduce(t);
      },
      std::chrono::hours(1));
  for (int rank = 0; rank < 4; ++rank) {
    INFO("rank " << rank << ": " << errors[rank]);
    // Every rank hears of it: from rank 2 itself, or from the close that
    // follows a disagreement some rank saw.
    CHECK_FALSE(errors[rank].empty());
  }
  CHECK_THAT(errors[2], Catch::Contains("rank 2: allreduce(SUM) of float32[3]"));
}

TEST_CASE("ranks that agree pay no extra round: a thousand small allreduces all succeed",
          "[gloo][mismatch]") {
  const auto errors = run_pair([](int, GlooProcessGroup& g) {
    Work last = Work::done(Work::Info{});
    for (int i = 0; i < 1000; ++i) {
      Tensor t = floats(1 + i % 7);
      last = g.allreduce(t);
    }
    return last;
  });
  CHECK(errors == std::vector<std::string>{"", ""});
}

// A mismatched send and recv never match: each side fails when its own
// timeout passes, and Gloo then closes that side's connections, so the
// other side may fail first with the connection gone. Which side's timeout
// passes first is therefore made certain: one side waits 2 s and the other
// 60 s, each way round. The short side's error must be the timeout naming
// what it expected; the long side's is either that or the lost connection.
TEST_CASE(
    "a recv into 5 floats from a send of 10, or of another dtype, fails with a "
    "timeout naming what that side expected; the other side fails too; the "
    "process lives",
    "[gloo][mismatch][p2p]") {
  constexpr std::chrono::milliseconds kShort = 2s;
  constexpr std::chrono::milliseconds kLong = 60s;
  for (const bool other_dtype : {false, true}) {
    for (const int short_rank : {0, 1}) {
      INFO((other_dtype ? "float64 against float32" : "10 floats against 5")
           << "; rank " << short_rank << " times out first");
      HashStore store;
      const std::string name = sbtest::unique_group_name("p2p");
      sbtest::Groups groups(2);
      sbtest::run_threads(
          2,
          [&](int rank) {
            GlooOptions options;
            options.group_name = name;
            options.hostname = "127.0.0.1";
            options.timeout = rank == short_rank ? kShort : kLong;
            groups[rank] = std::make_unique<GlooProcessGroup>(store, rank, 2, options);
          },
          sbtest::watchdog_for(kLong));
      std::vector<std::string> errors(2);
      sbtest::run_threads(
          2,
          [&](int rank) {
            try {
              if (rank == 1) {
                Tensor t = other_dtype ? Tensor::zeros({5}, DType::kFloat64) : floats(10);
                groups[1]->send(t, 0, 3).wait();
              } else {
                Tensor t = floats(other_dtype ? 10 : 5);
                groups[0]->recv(t, 1, 3).wait();
              }
            } catch (const TimeoutError& e) {
              errors[rank] = fmt::format("TimeoutError: {}", e.what());
            } catch (const ConnectionError& e) {
              errors[rank] = fmt::format("ConnectionError: {}", e.what());
            }
          },
          sbtest::watchdog_for(kLong));
      INFO(errors[0]);
      INFO(errors[1]);
      const std::string& short_error = errors[short_rank];
      CHECK_THAT(short_error, Catch::StartsWith("TimeoutError: "));
      if (short_rank == 0) {
        CHECK_THAT(
            short_error,
            Catch::Contains(other_dtype ? "a recv into float32[10] on cpu (40 bytes)"
                                        : "a recv into float32[5] on cpu (20 bytes)"));
        CHECK_THAT(short_error, Catch::Contains("from rank 1 with tag 3"));
      } else {
        CHECK_THAT(short_error, Catch::Contains("to rank 0 with tag 3"));
        CHECK_THAT(short_error,
                   Catch::Contains("match only when their tag, dtype and byte count"));
      }
      // The other side failed too (its connection went with the short
      // side's timeout), naming the peer.
      const std::string& long_error = errors[1 - short_rank];
      CHECK_FALSE(long_error.empty());
      CHECK_THAT(long_error, Catch::Contains(fmt::format("rank {}", short_rank)));
    }
  }
}

TEST_CASE("ranks that view the same elements in other shapes agree, as in PyTorch",
          "[gloo][mismatch]") {
  const auto errors = run_pair([](int rank, GlooProcessGroup& g) {
    Tensor t = rank == 0 ? Tensor::zeros({2, 3}, DType::kFloat32) : floats(6);
    return g.allreduce(t);
  });
  CHECK(errors == std::vector<std::string>{"", ""});
}

TEST_CASE("a root mismatch among three ranks, where one rank finishes, fails the other two "
          "naming it, well before the timeout; the rank that finished fails its next op",
          "[gloo][mismatch]") {
  // Ranks 0 and 1 broadcast from root 0, rank 2 from root 1: rank 1 gets
  // rank 0's bytes and is done; ranks 0 and 2 are stuck on each other.
  sbtest::Groups groups =
      sbtest::make_groups(3, sbtest::unique_group_name("mismatch-root"), kTimeout);
  std::vector<std::string> errors(3);
  std::vector<std::string> next(3);
  std::vector<std::chrono::milliseconds> took(3);
  sbtest::run_threads(
      3,
      [&](int rank) {
        const auto start = std::chrono::steady_clock::now();
        Tensor t = floats(3);
        try {
          groups[rank]->broadcast(t, rank == 2 ? 1 : 0).wait();
        } catch (const Error& e) {
          errors[rank] = e.what();
        }
        if (rank == 1) {
          try {
            Tensor u = floats(3);
            groups[rank]->allreduce(u).wait();
          } catch (const Error& e) {
            next[rank] = e.what();
          }
        }
        took[rank] = std::chrono::duration_cast<std::chrono::milliseconds>(
            std::chrono::steady_clock::now() - start);
      },
      sbtest::watchdog_for(kTimeout));
  for (int rank : {0, 2}) {
    INFO("rank " << rank << " after " << took[rank].count() << " ms: " << errors[rank]);
    CHECK_THAT(errors[rank], Catch::Contains("disagree") && Catch::Contains("at root 0") &&
                                 Catch::Contains("at root 1"));
    CHECK(took[rank] < kTimeout / 2);
  }
  INFO("rank 1 after " << took[1].count() << " ms: " << errors[1] << " / " << next[1]);
  CHECK_FALSE(next[1].empty());
  CHECK(took[1] < kTimeout / 2);
}
