// ProcessGroup argument checks: every op refuses bad arguments on the
// calling rank before any communication (split from the conformance suite).
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "collective/gloo_process_group.h"
#include "core/tensor.h"
#include "store/hash_store.h"
#include "tests/collective/pg_harness.h"
#include "tests/collective/pg_values.h"

using namespace switchboard;
using namespace switchboard::collective;
using Shape = Tensor::Shape;
using namespace pgtest;

// ---------------------------------------------------------------------------
// Argument checks: each call below must throw std::invalid_argument from the
// op itself (not from wait()), naming the op, the group and the rank, before
// any communication. Rank 0 is driven from the main thread while rank 1
// stays idle; afterwards both ranks run ops to prove nothing was sent.

namespace {

// The message of the std::invalid_argument `call` throws, or what happened
// instead.
template <typename Call>
std::string rejection(Call&& call) {
  try {
    call();
  } catch (const std::invalid_argument& e) {
    return e.what();
  } catch (const std::exception& e) {
    return fmt::format("<not std::invalid_argument: {}>", e.what());
  }
  return "<no exception: the op was accepted>";
}

#define CHECK_REJECTED(pg, op, call, ...)                                            \
  do {                                                                               \
    const std::string message = rejection([&] { (void)(call); });                    \
    INFO(#call << "\n  -> " << message);                                             \
    CHECK_THAT(message, Catch::Contains(op) &&                                       \
                            Catch::Contains("\"" + (pg).name() + "\"") &&            \
                            Catch::Contains("rank " + std::to_string((pg).rank()))); \
    for (const std::string& fragment : std::vector<std::string>{__VA_ARGS__}) {      \
      CHECK_THAT(message, Catch::Contains(fragment));                                \
    }                                                                                \
  } while (0)

// Short enough that an op wrongly accepted while rank 1 idles fails the
// test in seconds, long enough for a loaded machine.
constexpr std::chrono::milliseconds kCheckTimeout{10'000};

// Both ranks run an allreduce, a gather and a scatter; the non-root rank
// passes lists that would be wrong on the root (they are ignored there).
void check_still_in_step(sbtest::Groups& groups) {
  const int n = static_cast<int>(groups.size());
  sbtest::report(sbtest::run_on(groups, [n](ProcessGroup& pg, sbtest::RankLog& log) {
    const int r = pg.rank();
    Tensor t = seeded(DType::kFloat32, {4}, r);
    pg.allreduce(t).wait();
    log.expect_values(
        t, reduced(DType::kFloat32, ReduceOp::kSum, n, 0, 4, by_rank(DType::kFloat32)),
        "allreduce after the rejected calls");
    std::vector<Tensor> outs;
    if (r == 0) {
      outs = sentinels(DType::kFloat32, {4}, n);
    } else {
      outs = {Tensor(), sentinel(DType::kInt8, {9})};  // not the root: ignored
    }
    Tensor in = seeded(DType::kFloat32, {4}, r);
    pg.gather(outs, in, 0).wait();
    if (r == 0) {
      for (int q = 0; q < n; ++q) {
        log.expect_values(outs[q], expected_of(DType::kFloat32, {4}, q),
                          fmt::format("gather output {}", q));
      }
    }
    std::vector<Tensor> ins;
    if (r == 0) {
      for (int q = 0; q < n; ++q) ins.push_back(seeded(DType::kFloat32, {4}, 30 + q));
    } else {
      ins = {Tensor()};  // not the source: ignored
    }
    Tensor out = sentinel(DType::kFloat32, {4});
    pg.scatter(out, ins, 0).wait();
    log.expect_values(out, expected_of(DType::kFloat32, {4}, 30 + r),
                      "scatter after the rejected calls");
  }));
}

// Host bytes labelled as CUDA memory: the checks must refuse them without
// ever dereferencing them.
Tensor fake_cuda(const Shape& shape) {
  auto bytes = std::make_shared<std::vector<double>>(Tensor::numel_of(shape) + 1);
  return Tensor::from_blob(bytes->data(), shape, DType::kFloat32, Device::cuda(0), bytes);
}

// A transposed 2x3 view of CPU memory (strides {1, 2}).
Tensor transposed() {
  auto bytes = std::make_shared<std::vector<float>>(6);
  return Tensor::from_blob(bytes->data(), {2, 3}, DType::kFloat32, Device::cpu(), bytes,
                           {1, 2});
}

}  // namespace

TEST_CASE("ops refuse undefined, CUDA and non-contiguous tensors before communicating",
          "[collective][gloo][checks]") {
  auto groups =
      sbtest::make_groups(2, sbtest::unique_group_name("checks-tensors"), kCheckTimeout);
  ProcessGroup& pg = *groups[0];
  Tensor undefined;
  Tensor cuda = fake_cuda({4});
  Tensor strided = transposed();
  Tensor f = seeded(DType::kFloat32, {4}, 0);
  std::vector<Tensor> two = sentinels(DType::kFloat32, {4}, 2);
  std::vector<Tensor> two_cuda = {fake_cuda({4}), fake_cuda({4})};
  std::vector<Tensor> two_strided = {transposed(), transposed()};
  Tensor out6 = sentinel(DType::kFloat32, {2, 3});

  CHECK_REJECTED(pg, "allreduce", pg.allreduce(undefined), "undefined");
  CHECK_REJECTED(pg, "allreduce", pg.allreduce(cuda), "cuda");
  CHECK_REJECTED(pg, "allreduce", pg.allreduce(strided), "contiguous");
  CHECK_REJECTED(pg, "broadcast", pg.broadcast(undefined, 0), "undefined");
  CHECK_REJECTED(pg, "broadcast", pg.broadcast(cuda, 0), "cuda");
  CHECK_REJECTED(pg, "broadcast", pg.broadcast(strided, 1), "contiguous");
  CHECK_REJECTED(pg, "reduce", pg.reduce(cuda, 0), "cuda");
  CHECK_REJECTED(pg, "reduce", pg.reduce(strided, 1), "contiguous");
  CHECK_REJECTED(pg, "allgather", pg.allgather(two, undefined), "undefined");
  CHECK_REJECTED(pg, "allgather", pg.allgather(two, cuda), "cuda");
  CHECK_REJECTED(pg, "allgather", pg.allgather(two_cuda, f), "cuda");
  CHECK_REJECTED(pg, "gather", pg.gather(two, cuda, 0), "cuda");
  CHECK_REJECTED(pg, "gather", pg.gather(two, strided, 1), "contiguous");
  CHECK_REJECTED(pg, "scatter", pg.scatter(cuda, two, 0), "cuda");
  CHECK_REJECTED(pg, "scatter", pg.scatter(f, two_cuda, 0), "cuda");
  CHECK_REJECTED(pg, "reduce_scatter", pg.reduce_scatter(cuda, two_cuda), "cuda");
  CHECK_REJECTED(pg, "reduce_scatter", pg.reduce_scatter(f, two_cuda), "cuda");
  CHECK_REJECTED(pg, "alltoall", pg.alltoall(two, two_cuda), "cuda");
  CHECK_REJECTED(pg, "alltoall", pg.alltoall(two_strided, two_strided), "contiguous");
  CHECK_REJECTED(pg, "alltoall_single", pg.alltoall_single(out6, strided), "contiguous");
  CHECK_REJECTED(pg, "alltoall_single", pg.alltoall_single(undefined, f), "undefined");
  CHECK_REJECTED(pg, "send", pg.send(undefined, 1), "undefined");
  CHECK_REJECTED(pg, "send", pg.send(cuda, 1), "cuda");
  CHECK_REJECTED(pg, "recv", pg.recv(strided, 1), "contiguous");
  CHECK_REJECTED(pg, "recv", pg.recv(cuda, 1), "cuda");
  check_still_in_step(groups);
}

TEST_CASE("ops refuse source and destination ranks outside the group",
          "[collective][gloo][checks]") {
  auto groups =
      sbtest::make_groups(2, sbtest::unique_group_name("checks-ranks"), kCheckTimeout);
  ProcessGroup& pg = *groups[0];
  Tensor f = seeded(DType::kFloat32, {4}, 0);
  std::vector<Tensor> two = sentinels(DType::kFloat32, {4}, 2);
  for (int bad : {-1, 2, 1000}) {
    const std::string shown = std::to_string(bad);
    CHECK_REJECTED(pg, "broadcast", pg.broadcast(f, bad), shown);
    CHECK_REJECTED(pg, "reduce", pg.reduce(f, bad), shown);
    CHECK_REJECTED(pg, "gather", pg.gather(two, f, bad), shown);
    CHECK_REJECTED(pg, "scatter", pg.scatter(f, two, bad), shown);
    CHECK_REJECTED(pg, "send", pg.send(f, bad), shown);
    CHECK_REJECTED(pg, "recv", pg.recv(f, bad), shown);
  }
  check_still_in_step(groups);

  auto single = sbtest::make_groups(1, sbtest::unique_group_name("checks-ranks-one"),
                                    kCheckTimeout);
  ProcessGroup& alone = *single[0];
  CHECK_REJECTED(alone, "broadcast", alone.broadcast(f, 1), "1");
  CHECK_REJECTED(alone, "reduce", alone.reduce(f, -1), "-1");
  std::vector<Tensor> one = sentinels(DType::kFloat32, {4}, 1);
  CHECK_REJECTED(alone, "gather", alone.gather(one, f, 1), "1");
  CHECK_REJECTED(alone, "scatter", alone.scatter(f, one, -1), "-1");
}

TEST_CASE("list ops refuse wrong lengths, dtypes and shapes before communicating",
          "[collective][gloo][checks]") {
  auto groups =
      sbtest::make_groups(2, sbtest::unique_group_name("checks-lists"), kCheckTimeout);
  ProcessGroup& pg = *groups[0];
  Tensor f = seeded(DType::kFloat32, {4}, 0);
  Tensor i32 = seeded(DType::kInt32, {4}, 0);
  Tensor f5 = seeded(DType::kFloat32, {5}, 0);
  std::vector<Tensor> one = sentinels(DType::kFloat32, {4}, 1);
  std::vector<Tensor> two = sentinels(DType::kFloat32, {4}, 2);
  std::vector<Tensor> three = sentinels(DType::kFloat32, {4}, 3);
  std::vector<Tensor> none;
  std::vector<Tensor> two_f64 = sentinels(DType::kFloat64, {4}, 2);
  std::vector<Tensor> mixed_dtype = {sentinel(DType::kFloat32, {4}),
                                     sentinel(DType::kFloat64, {4})};
  std::vector<Tensor> mixed_shape = {sentinel(DType::kFloat32, {4}),
                                     sentinel(DType::kFloat32, {5})};
  std::vector<Tensor> reshaped = {sentinel(DType::kFloat32, {4}),
                                  sentinel(DType::kFloat32, {2, 2})};
  std::vector<Tensor> with_undefined = {sentinel(DType::kFloat32, {4}), Tensor()};

  CHECK_REJECTED(pg, "allgather", pg.allgather(one, f), "1");
  CHECK_REJECTED(pg, "allgather", pg.allgather(three, f), "3");
  CHECK_REJECTED(pg, "allgather", pg.allgather(none, f), "0");
  CHECK_REJECTED(pg, "allgather", pg.allgather(mixed_dtype, f), "float64");
  CHECK_REJECTED(pg, "allgather", pg.allgather(mixed_shape, f), "[5]");
  CHECK_REJECTED(pg, "allgather", pg.allgather(reshaped, f), "[2, 2]");
  CHECK_REJECTED(pg, "allgather", pg.allgather(with_undefined, f), "undefined");
  CHECK_REJECTED(pg, "allgather", pg.allgather(two, i32), "int32");
  CHECK_REJECTED(pg, "gather", pg.gather(one, f, 0), "1");
  CHECK_REJECTED(pg, "gather", pg.gather(mixed_shape, f, 0), "[5]");
  CHECK_REJECTED(pg, "gather", pg.gather(two_f64, f, 0), "float64");
  CHECK_REJECTED(pg, "scatter", pg.scatter(f, three, 0), "3");
  CHECK_REJECTED(pg, "scatter", pg.scatter(f, mixed_dtype, 0), "float64");
  CHECK_REJECTED(pg, "scatter", pg.scatter(i32, two, 0), "int32");
  CHECK_REJECTED(pg, "scatter", pg.scatter(f5, two, 0), "[5]");
  CHECK_REJECTED(pg, "reduce_scatter", pg.reduce_scatter(f, one), "1");
  CHECK_REJECTED(pg, "reduce_scatter", pg.reduce_scatter(f, mixed_shape), "[5]");
  CHECK_REJECTED(pg, "reduce_scatter", pg.reduce_scatter(f5, two), "[5]");
  CHECK_REJECTED(pg, "reduce_scatter", pg.reduce_scatter(i32, two), "int32");
  CHECK_REJECTED(pg, "alltoall", pg.alltoall(one, two), "1");
  CHECK_REJECTED(pg, "alltoall", pg.alltoall(two, three), "3");
  CHECK_REJECTED(pg, "alltoall", pg.alltoall(two, mixed_dtype), "float64");
  CHECK_REJECTED(pg, "alltoall", pg.alltoall(two_f64, two), "float64");
  CHECK_REJECTED(pg, "alltoall", pg.alltoall(mixed_shape, two), "[5]");

  Tensor three_rows = seeded(DType::kFloat32, {3, 2}, 0);
  Tensor three_rows_out = sentinel(DType::kFloat32, {3, 2});
  Tensor f6 = sentinel(DType::kFloat32, {6});
  Tensor scalar = seeded(DType::kFloat32, {}, 0);
  Tensor scalar_out = sentinel(DType::kFloat32, {});
  CHECK_REJECTED(pg, "alltoall_single", pg.alltoall_single(three_rows_out, three_rows),
                 "3");
  CHECK_REJECTED(pg, "alltoall_single", pg.alltoall_single(i32, f), "int32");
  CHECK_REJECTED(pg, "alltoall_single", pg.alltoall_single(f6, f), "6");
  CHECK_REJECTED(pg, "alltoall_single", pg.alltoall_single(scalar_out, scalar));
  check_still_in_step(groups);
}

TEST_CASE("AVG on integer and bool tensors is refused before communicating",
          "[collective][gloo][checks]") {
  auto groups =
      sbtest::make_groups(2, sbtest::unique_group_name("checks-avg"), kCheckTimeout);
  ProcessGroup& pg = *groups[0];
  for (DType dtype : kAllDTypes) {
    if (is_floating(dtype)) continue;
    const std::string name(dtype_name(dtype));
    Tensor t = seeded(dtype, {4}, 0);
    std::vector<Tensor> two = sentinels(dtype, {4}, 2);
    CHECK_REJECTED(pg, "allreduce", pg.allreduce(t, ReduceOp::kAvg), "AVG", name);
    CHECK_REJECTED(pg, "reduce", pg.reduce(t, 0, ReduceOp::kAvg), "AVG", name);
    CHECK_REJECTED(pg, "reduce", pg.reduce(t, 1, ReduceOp::kAvg), "AVG", name);
    CHECK_REJECTED(pg, "reduce_scatter", pg.reduce_scatter(t, two, ReduceOp::kAvg), "AVG",
                   name);
  }
  check_still_in_step(groups);
}

TEST_CASE("the multi-GPU variants are refused on GLOO, naming the backend",
          "[collective][gloo][checks]") {
  auto groups =
      sbtest::make_groups(1, sbtest::unique_group_name("checks-multigpu"), kCheckTimeout);
  ProcessGroup& pg = *groups[0];
  CHECK(pg.backend_name() == "GLOO");
  Tensor f = seeded(DType::kFloat32, {4}, 0);
  std::vector<Tensor> one = {f};
  std::vector<std::vector<Tensor>> nested = {{sentinel(DType::kFloat32, {4})}};
  CHECK_REJECTED(pg, "allreduce_multigpu", pg.allreduce_multigpu(one), "GLOO");
  CHECK_REJECTED(pg, "broadcast_multigpu", pg.broadcast_multigpu(one, 0), "GLOO");
  CHECK_REJECTED(pg, "reduce_multigpu", pg.reduce_multigpu(one, 0), "GLOO");
  CHECK_REJECTED(pg, "allgather_multigpu", pg.allgather_multigpu(nested, one), "GLOO");
  CHECK_REJECTED(pg, "reduce_scatter_multigpu", pg.reduce_scatter_multigpu(one, nested),
                 "GLOO");
  CHECK_REJECTED(pg, "send_multigpu", pg.send_multigpu(f, 0, 0), "GLOO");
  CHECK_REJECTED(pg, "recv_multigpu", pg.recv_multigpu(f, 0, 0), "GLOO");
}
