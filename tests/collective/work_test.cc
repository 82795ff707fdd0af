// Work handles and the shared reduction kernels, without any network.
#include "collective/work.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <future>
#include <stdexcept>
#include <thread>

#include "collective/process_group.h"
#include "common/error.h"

namespace sb = switchboard;
using Catch::Matchers::Contains;
using sb::collective::ReduceOp;
using sb::collective::Work;
using namespace std::chrono_literals;

namespace {
Work::Info info(std::string op = "allreduce") {
  return Work::Info{std::move(op), "trainers", 2, 50ms};
}
}  // namespace

TEST_CASE("A completed Work returns from wait at once", "[work]") {
  Work work = Work::done(info());
  CHECK(work.is_completed());
  work.wait();
  work.wait(Work::kNoTimeout);
  CHECK(work.exception() == nullptr);
}

TEST_CASE(
    "A Work that never completes times out naming op, group, rank "
    "and timeout",
    "[work][timeout]") {
  Work work(info("broadcast"));
  REQUIRE_THROWS_MATCHES(
      work.wait(), sb::TimeoutError,
      Catch::Matchers::Message(
          "broadcast in group \"trainers\" (rank 2): timed out after 50 ms"));
  REQUIRE_THROWS_WITH(work.wait(5ms), Contains("timed out after 5 ms"));
  CHECK_FALSE(work.is_completed());
}

TEST_CASE("A failed Work rethrows its error to every waiter", "[work]") {
  Work work(info());
  Work copy = work;
  std::promise<void> started;
  auto waiter = std::async(std::launch::async, [&] {
    started.set_value();
    copy.wait(Work::kNoTimeout);
  });
  started.get_future().wait();
  work.fail(std::make_exception_ptr(sb::ConnectionError("peer 1 closed")));
  REQUIRE_THROWS_AS(waiter.get(), sb::ConnectionError);
  REQUIRE_THROWS_WITH(work.wait(), "peer 1 closed");
  // Only the first completion counts.
  work.complete();
  REQUIRE_THROWS_AS(work.wait(), sb::ConnectionError);
}

TEST_CASE(
    "A driven Work is finished by its driver and reports its "
    "timeout",
    "[work]") {
  std::atomic<int> calls{0};
  bool ready = false;
  Work work(info("send"), [&](Work::Timeout) {
    ++calls;
    return ready;
  });
  REQUIRE_THROWS_WITH(work.wait(20ms),
                      Contains("send in group \"trainers\" (rank 2): timed "
                               "out after 20 ms"));
  CHECK_FALSE(work.is_completed());
  ready = true;
  work.wait();
  CHECK(work.is_completed());
  work.wait();  // done: the driver is not called again
  CHECK(calls == 2);
}

TEST_CASE("A driver's error becomes the Work's error", "[work]") {
  Work work(info("recv"), [](Work::Timeout) -> bool {
    throw sb::ConnectionError("recv from rank 0: connection reset");
  });
  REQUIRE_THROWS_AS(work.wait(), sb::ConnectionError);
  CHECK(work.is_completed());
  REQUIRE_THROWS_WITH(work.wait(), Contains("connection reset"));
}

TEST_CASE("Reduction kernels handle every dtype", "[work][reduce]") {
  using sb::collective::reduce_elements;
  SECTION("int32 sum, product, min, max") {
    int32_t a[3] = {1, -2, 7}, b[3] = {4, 5, -1}, out[3];
    reduce_elements(ReduceOp::kSum, sb::DType::kInt32, out, a, b, 3);
    CHECK(out[0] == 5);
    CHECK(out[1] == 3);
    CHECK(out[2] == 6);
    reduce_elements(ReduceOp::kProduct, sb::DType::kInt32, out, a, b, 3);
    CHECK(out[1] == -10);
    reduce_elements(ReduceOp::kMin, sb::DType::kInt32, out, a, b, 3);
    CHECK(out[2] == -1);
    reduce_elements(ReduceOp::kMax, sb::DType::kInt32, out, a, b, 3);
    CHECK(out[0] == 4);
  }
  SECTION("bool: SUM and MAX are OR, PRODUCT and MIN are AND") {
    uint8_t a[4] = {0, 0, 1, 1}, b[4] = {0, 1, 0, 1}, out[4];
    reduce_elements(ReduceOp::kSum, sb::DType::kBool, out, a, b, 4);
    CHECK((out[0] == 0 && out[1] == 1 && out[2] == 1 && out[3] == 1));
    reduce_elements(ReduceOp::kMin, sb::DType::kBool, out, a, b, 4);
    CHECK((out[0] == 0 && out[1] == 0 && out[2] == 0 && out[3] == 1));
  }
  SECTION("float16 and bfloat16 compute through float") {
    uint16_t a = sb::float_to_half(1.5f), b = sb::float_to_half(2.25f), out;
    reduce_elements(ReduceOp::kSum, sb::DType::kFloat16, &out, &a, &b, 1);
    CHECK(sb::half_to_float(out) == 3.75f);
    uint16_t c = sb::float_to_bfloat16(3.0f), d = sb::float_to_bfloat16(-2.0f);
    reduce_elements(ReduceOp::kProduct, sb::DType::kBFloat16, &out, &c, &d, 1);
    CHECK(sb::bfloat16_to_float(out) == -6.0f);
  }
  SECTION("AVG divides floating dtypes only") {
    double v[2] = {3.0, 9.0};
    sb::collective::divide_elements(sb::DType::kFloat64, v, 2, 3);
    CHECK(v[0] == 1.0);
    CHECK(v[1] == 3.0);
    CHECK_THROWS_AS(sb::collective::divide_elements(sb::DType::kInt32, v, 1, 2),
                    sb::Error);
  }
}

TEST_CASE("Argument checks name the op, the group and the values", "[work][checks]") {
  namespace checks = sb::collective::checks;
  const std::string at = "allgather in group \"g\" (rank 0 of 2)";
  auto t = sb::Tensor::zeros({2, 3}, sb::DType::kFloat32);
  std::vector<sb::Tensor> list = {t, sb::Tensor::zeros({3}, sb::DType::kFloat32)};
  REQUIRE_THROWS_WITH(checks::list(at, list, 2, t, "outputs", sb::Device::Type::kCpu),
                      at + ": outputs[1] has shape [3], expected [2, 3]");
  REQUIRE_THROWS_WITH(checks::list(at, list, 3, t, "outputs", sb::Device::Type::kCpu),
                      Contains("outputs holds 2 tensors, expected 3"));
  REQUIRE_THROWS_WITH(checks::rank(at, 2, 2, "src_rank"),
                      at + ": src_rank 2 is outside [0, 2)");
  REQUIRE_THROWS_WITH(checks::reduce_op(at, ReduceOp::kAvg, sb::DType::kInt64),
                      Contains("AVG needs a floating dtype, the tensor is int64"));
  REQUIRE_THROWS_AS(checks::tensor(at, sb::Tensor(), sb::Device::Type::kCpu),
                    std::invalid_argument);
}
