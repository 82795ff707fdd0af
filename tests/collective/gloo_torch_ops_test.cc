// What torch users look for in a Gloo group beyond c10d's basics: BAND, BOR
// and BXOR (ReduceOp.BAND/BOR/BXOR; test_c10d_gloo's allreduce cases with
// them) on integer and bool tensors, floats refused naming the op; and a
// recv from any source (torch's recv(src=None)) that says who sent.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

#include "collective/gloo_process_group.h"
#include "core/tensor.h"
#include "common/error.h"
#include "tests/collective/pg_harness.h"

using namespace switchboard;
using namespace switchboard::collective;
using namespace std::chrono_literals;

namespace {

constexpr std::chrono::milliseconds kTimeout = 30s;

// Each rank's value, element-wise: rank r holds {1 << r, 7, r}.
template <typename T>
std::vector<T> values_of(int rank) {
  return {static_cast<T>(1 << rank), static_cast<T>(7), static_cast<T>(rank)};
}

template <typename T>
std::vector<T> allreduce_on_three(DType dtype, ReduceOp op) {
  sbtest::Groups groups = sbtest::make_groups(3, sbtest::unique_group_name("bitwise"), kTimeout);
  std::vector<std::vector<T>> results(3);
  sbtest::run_threads(
      3,
      [&](int rank) {
        Tensor t = Tensor::from_vector(values_of<T>(rank));
        REQUIRE(t.dtype() == dtype);
        groups[rank]->allreduce(t, op).wait();
        results[rank].assign(t.data_as<T>(), t.data_as<T>() + 3);
      },
      sbtest::watchdog_for(kTimeout));
  CHECK(results[1] == results[0]);
  CHECK(results[2] == results[0]);
  return results[0];
}

}  // namespace

TEST_CASE("BAND, BOR and BXOR reduce integer tensors bit by bit", "[gloo][bitwise]") {
  // 1|2|4 = 7, 1&2&4 = 0, 1^2^4 = 7; 7 op 7 op 7; 0 op 1 op 2.
  CHECK(allreduce_on_three<int32_t>(DType::kInt32, ReduceOp::kBor) ==
        std::vector<int32_t>{7, 7, 3});
  CHECK(allreduce_on_three<int32_t>(DType::kInt32, ReduceOp::kBand) ==
        std::vector<int32_t>{0, 7, 0});
  CHECK(allreduce_on_three<int32_t>(DType::kInt32, ReduceOp::kBxor) ==
        std::vector<int32_t>{7, 7, 3});
  CHECK(allreduce_on_three<int64_t>(DType::kInt64, ReduceOp::kBand) ==
        std::vector<int64_t>{0, 7, 0});
  CHECK(allreduce_on_three<uint8_t>(DType::kUInt8, ReduceOp::kBxor) ==
        std::vector<uint8_t>{7, 7, 3});
}

TEST_CASE("BAND, BOR and BXOR on bool tensors are logical", "[gloo][bitwise]") {
  sbtest::Groups groups = sbtest::make_groups(2, sbtest::unique_group_name("bitwise"), kTimeout);
  std::vector<std::vector<uint8_t>> got(3);
  const ReduceOp ops[] = {ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor};
  std::vector<std::vector<std::vector<uint8_t>>> results(2, std::vector<std::vector<uint8_t>>(3));
  sbtest::run_threads(
      2,
      [&](int rank) {
        for (int i = 0; i < 3; ++i) {
          // rank 0: {true, true, false}; rank 1: {true, false, false}
          Tensor t = Tensor::zeros({3}, DType::kBool);
          auto* b = static_cast<uint8_t*>(t.data());
          b[0] = 1;
          b[1] = rank == 0 ? 1 : 0;
          groups[rank]->allreduce(t, ops[i]).wait();
          results[rank][i].assign(b, b + 3);
        }
      },
      sbtest::watchdog_for(kTimeout));
  CHECK(results[0][0] == std::vector<uint8_t>{1, 0, 0});  // AND
  CHECK(results[0][1] == std::vector<uint8_t>{1, 1, 0});  // OR
  CHECK(results[0][2] == std::vector<uint8_t>{0, 1, 0});  // XOR
  CHECK(results[1] == results[0]);
}

TEST_CASE("BAND, BOR and BXOR refuse floating tensors, naming the op", "[gloo][bitwise]") {
  sbtest::Groups groups = sbtest::make_groups(1, sbtest::unique_group_name("bitwise"), kTimeout);
  Tensor t = Tensor::from_vector(std::vector<float>{1.0f});
  for (ReduceOp op : {ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor}) {
    try {
      (void)groups[0]->allreduce(t, op);
      FAIL("a float allreduce with a bitwise op was taken");
    } catch (const std::invalid_argument& e) {
      CHECK_THAT(e.what(), Catch::Contains(std::string(reduce_op_name(op))) &&
                               Catch::Contains("needs an integer or bool dtype"));
    }
  }
}

TEST_CASE("recv_any takes what any rank sends and names the sender", "[gloo][p2p]") {
  sbtest::Groups groups = sbtest::make_groups(3, sbtest::unique_group_name("any"), kTimeout);
  std::vector<std::pair<int, float>> got;  // (source, value) on rank 0
  sbtest::run_threads(
      3,
      [&](int rank) {
        if (rank != 0) {
          Tensor t = Tensor::from_vector(std::vector<float>{10.0f * rank});
          groups[rank]->send(t, 0, 5).wait();
          return;
        }
        for (int i = 0; i < 2; ++i) {
          Tensor t = Tensor::zeros({1}, DType::kFloat32);
          Work w = groups[0]->recv_any(t, 5);
          w.wait();
          got.emplace_back(w.source_rank(), t.data_as<float>()[0]);
        }
      },
      sbtest::watchdog_for(kTimeout));
  std::sort(got.begin(), got.end());
  CHECK(got == std::vector<std::pair<int, float>>{{1, 10.0f}, {2, 20.0f}});
}

// torch's test_monitored_barrier_gloo cases: the ranks that did not come
// are named on rank 0 and on every rank that came.
TEST_CASE("monitored_barrier passes when every rank comes, and names the ranks that did "
          "not",
          "[gloo][monitored_barrier]") {
  for (const bool wait_all : {true, false}) {
    INFO("wait_all_ranks " << wait_all);
    sbtest::Groups groups =
        sbtest::make_groups(4, sbtest::unique_group_name("monitored"), kTimeout);
    std::vector<std::string> errors(4);
    sbtest::run_threads(
        4,
        [&](int rank) {
          groups[rank]->monitored_barrier(10s, wait_all).wait();  // everyone comes
          if (rank >= 2) return;  // ranks 2 and 3 stay away from the second one
          try {
            groups[rank]->monitored_barrier(300ms, wait_all).wait();
          } catch (const TimeoutError& e) {
            errors[rank] = e.what();
          }
        },
        sbtest::watchdog_for(kTimeout));
    INFO(errors[0]);
    INFO(errors[1]);
    CHECK_THAT(errors[0], Catch::Contains("monitored_barrier in group"));
    CHECK_THAT(errors[0], Catch::Contains(wait_all ? "ranks [2, 3] did not arrive within 300 ms"
                                                   : "ranks [2] did not arrive within 300 ms"));
    CHECK_THAT(errors[1], Catch::Contains("rank 0 reports that ranks [2, 3] did not arrive"));
  }
}

TEST_CASE("monitored_barrier names only the ranks that did not arrive when a lower rank is "
          "absent, and releases the ranks that came",
          "[gloo][monitored_barrier]") {
  // Rank 1 stays away; ranks 2 and 3 come at once, long before the deadline.
  sbtest::Groups groups =
      sbtest::make_groups(4, sbtest::unique_group_name("monitored-low"), kTimeout);
  std::vector<std::string> errors(4);
  sbtest::run_threads(
      4,
      [&](int rank) {
        if (rank == 1) return;
        try {
          groups[rank]->monitored_barrier(2s, /*wait_all_ranks=*/true).wait();
          errors[rank] = "none";
        } catch (const std::exception& e) {
          errors[rank] = e.what();
        }
      },
      sbtest::watchdog_for(kTimeout));
  INFO(errors[0] << "\n" << errors[2] << "\n" << errors[3]);
  CHECK_THAT(errors[0], Catch::Contains("ranks [1] did not arrive within 2000 ms"));
  for (int rank : {2, 3}) {
    CHECK_THAT(errors[rank], Catch::Contains("rank 0 reports that ranks [1] did not arrive"));
  }
}
