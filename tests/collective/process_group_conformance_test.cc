// ProcessGroup conformance: every op of process_group.h against values
// computed here, for world sizes 1-4, every dtype, non-power-of-two and
// zero-element tensors, 2-D shapes and offset views; then the argument
// checks every op makes before any communication.
//
// Ranks are threads over one HashStore (tests/collective/pg_harness.h). Each
// TEST_CASE builds one group per world size and runs all its ops through it.
//
// Test values are small integers, exact in float16 and bfloat16 and without
// overflow in int8/uint8 for every op and world size, so results compare
// exactly. Inputs are value(dtype, seed, i) with a seed per rank (and per
// list entry); expected results fold the same function over the ranks.
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

using namespace switchboard;
using namespace switchboard::collective;
using Shape = Tensor::Shape;

#include "tests/collective/pg_values.h"

using namespace pgtest;

TEST_CASE("allreduce leaves every op's reduction on every rank, for every dtype",
          "[collective][gloo][allreduce]") {
  const int n = GENERATE(1, 2, 3, 4);
  auto groups = sbtest::make_groups(n, sbtest::unique_group_name("allreduce"));
  sbtest::report(sbtest::run_on(groups, [n](ProcessGroup& pg, sbtest::RankLog& log) {
    const int r = pg.rank();
    for (DType dtype : kAllDTypes) {
      for (ReduceOp op : ops_for(dtype)) {
        const Input in = input_for(dtype, op, n);
        for (const Shape& shape : kShapes) {
          Tensor t = sbtest::filled(dtype, shape, [&](int64_t i) { return in(r, 0, i); });
          pg.allreduce(t, op).wait();
          log.expect_values(
              t, reduced(dtype, op, n, 0, t.numel(), in),
              describe(fmt::format("allreduce {}", reduce_op_name(op)), dtype, shape, n));
        }
      }
      if (!is_floating(dtype)) {
        Tensor t = seeded(dtype, {4}, r);
        log.expect_throws<std::invalid_argument>([&] { pg.allreduce(t, ReduceOp::kAvg); },
                                                 describe("allreduce AVG", dtype, {4}, n),
                                                 {"allreduce", "AVG", pg.name()});
      }
    }
  }));
}

TEST_CASE("allreduce of a row view changes only those rows",
          "[collective][gloo][allreduce]") {
  const int n = GENERATE(2, 3);
  auto groups = sbtest::make_groups(n, sbtest::unique_group_name("allreduce-view"));
  sbtest::report(sbtest::run_on(groups, [n](ProcessGroup& pg, sbtest::RankLog& log) {
    for (DType dtype : {DType::kFloat32, DType::kInt64, DType::kFloat16}) {
      Tensor base = seeded(dtype, {4, 5}, pg.rank());
      Tensor rows = base.narrow0(1, 2);
      pg.allreduce(rows, ReduceOp::kSum).wait();
      std::vector<double> want = expected_of(dtype, {4, 5}, pg.rank());
      for (int64_t i = 5; i < 15; ++i) {
        want[i] = 0;
        for (int q = 0; q < n; ++q) want[i] += value(dtype, q, i);
      }
      log.expect_values(base, want, describe("allreduce of rows 1-2", dtype, {4, 5}, n));
    }
  }));
}

TEST_CASE("broadcast copies the source's tensor to every rank, from every source",
          "[collective][gloo][broadcast]") {
  const int n = GENERATE(1, 2, 3, 4);
  auto groups = sbtest::make_groups(n, sbtest::unique_group_name("broadcast"));
  sbtest::report(sbtest::run_on(groups, [n](ProcessGroup& pg, sbtest::RankLog& log) {
    for (DType dtype : kAllDTypes) {
      for (int src = 0; src < n; ++src) {
        for (const Shape& shape : kShapes) {
          Tensor t = seeded(dtype, shape, pg.rank() + 1);
          pg.broadcast(t, src).wait();
          log.expect_values(
              t, expected_of(dtype, shape, src + 1),
              describe(fmt::format("broadcast from {}", src), dtype, shape, n));
        }
      }
      // Into a row view: the other rows keep their values.
      Tensor base = seeded(dtype, {3, 4}, pg.rank() + 1);
      Tensor row = base.narrow0(2, 1);
      pg.broadcast(row, 0).wait();
      std::vector<double> want = expected_of(dtype, {3, 4}, pg.rank() + 1);
      for (int64_t i = 8; i < 12; ++i) want[i] = value(dtype, 1, i);
      log.expect_values(base, want, describe("broadcast into row 2", dtype, {3, 4}, n));
    }
  }));
}

TEST_CASE("reduce leaves every op's reduction on every destination",
          "[collective][gloo][reduce]") {
  const int n = GENERATE(1, 2, 3, 4);
  auto groups = sbtest::make_groups(n, sbtest::unique_group_name("reduce"));
  sbtest::report(sbtest::run_on(groups, [n](ProcessGroup& pg, sbtest::RankLog& log) {
    const int r = pg.rank();
    for (DType dtype : kAllDTypes) {
      for (ReduceOp op : ops_for(dtype)) {
        const Input in = input_for(dtype, op, n);
        for (int dst = 0; dst < n; ++dst) {
          for (const Shape& shape : kShapes) {
            if (shape.size() == 2 && dst != n - 1) continue;  // 2-D once per op
            Tensor t =
                sbtest::filled(dtype, shape, [&](int64_t i) { return in(r, 0, i); });
            pg.reduce(t, dst, op).wait();
            if (r != dst) continue;  // other ranks' tensors are unspecified
            log.expect_values(
                t, reduced(dtype, op, n, 0, t.numel(), in),
                describe(fmt::format("reduce {} to {}", reduce_op_name(op), dst), dtype,
                         shape, n));
          }
        }
      }
    }
  }));
}

TEST_CASE("allgather and gather collect every rank's tensor in rank order",
          "[collective][gloo][allgather][gather]") {
  const int n = GENERATE(1, 2, 3, 4);
  auto groups = sbtest::make_groups(n, sbtest::unique_group_name("gather"));
  sbtest::report(sbtest::run_on(groups, [n](ProcessGroup& pg, sbtest::RankLog& log) {
    const int r = pg.rank();
    for (DType dtype : kAllDTypes) {
      for (const Shape& shape : kShapes) {
        Tensor in = seeded(dtype, shape, r);
        std::vector<Tensor> outs = sentinels(dtype, shape, n);
        pg.allgather(outs, in).wait();
        for (int q = 0; q < n; ++q) {
          log.expect_values(
              outs[q], expected_of(dtype, shape, q),
              describe(fmt::format("allgather output {}", q), dtype, shape, n));
        }
        log.expect_values(in, expected_of(dtype, shape, r),
                          describe("allgather input", dtype, shape, n));
        for (int dst = 0; dst < n; ++dst) {
          std::vector<Tensor> gathered;  // ignored on other ranks: pass none
          if (r == dst) gathered = sentinels(dtype, shape, n);
          pg.gather(gathered, in, dst).wait();
          if (r != dst) continue;
          for (int q = 0; q < n; ++q) {
            log.expect_values(gathered[q], expected_of(dtype, shape, q),
                              describe(fmt::format("gather to {}, output {}", dst, q),
                                       dtype, shape, n));
          }
        }
      }
    }
  }));
}

TEST_CASE("scatter gives each rank its entry of the source's list, from every source",
          "[collective][gloo][scatter]") {
  const int n = GENERATE(1, 2, 3, 4);
  auto groups = sbtest::make_groups(n, sbtest::unique_group_name("scatter"));
  sbtest::report(sbtest::run_on(groups, [n](ProcessGroup& pg, sbtest::RankLog& log) {
    const int r = pg.rank();
    for (DType dtype : kAllDTypes) {
      for (int src = 0; src < n; ++src) {
        for (const Shape& shape : kShapes) {
          std::vector<Tensor> ins;  // ignored on other ranks: pass none
          if (r == src) {
            for (int k = 0; k < n; ++k)
              ins.push_back(seeded(dtype, shape, 10 + 4 * src + k));
          }
          Tensor out = sentinel(dtype, shape);
          pg.scatter(out, ins, src).wait();
          log.expect_values(
              out, expected_of(dtype, shape, 10 + 4 * src + r),
              describe(fmt::format("scatter from {}", src), dtype, shape, n));
        }
      }
    }
  }));
}

TEST_CASE("reduce_scatter gives each rank the reduction of its entry, for every op",
          "[collective][gloo][reduce_scatter]") {
  const int n = GENERATE(1, 2, 3, 4);
  auto groups = sbtest::make_groups(n, sbtest::unique_group_name("reduce-scatter"));
  sbtest::report(sbtest::run_on(groups, [n](ProcessGroup& pg, sbtest::RankLog& log) {
    const int r = pg.rank();
    for (DType dtype : kAllDTypes) {
      for (ReduceOp op : ops_for(dtype)) {
        const Input in = input_for(dtype, op, n);
        for (const Shape& shape : kShapes) {
          std::vector<Tensor> ins;
          for (int k = 0; k < n; ++k) {
            ins.push_back(
                sbtest::filled(dtype, shape, [&](int64_t i) { return in(r, k, i); }));
          }
          Tensor out = sentinel(dtype, shape);
          pg.reduce_scatter(out, ins, op).wait();
          log.expect_values(out, reduced(dtype, op, n, r, out.numel(), in),
                            describe(fmt::format("reduce_scatter {}", reduce_op_name(op)),
                                     dtype, shape, n));
        }
      }
    }
  }));
}

TEST_CASE("alltoall and alltoall_single exchange one entry between every pair of ranks",
          "[collective][gloo][alltoall]") {
  const int n = GENERATE(1, 2, 3, 4);
  auto groups = sbtest::make_groups(n, sbtest::unique_group_name("alltoall"));
  sbtest::report(sbtest::run_on(groups, [n](ProcessGroup& pg, sbtest::RankLog& log) {
    const int r = pg.rank();
    for (DType dtype : kAllDTypes) {
      // List form: rank r's entry k has seed r * n + k and lands on rank k.
      for (const Shape& shape : kShapes) {
        std::vector<Tensor> ins;
        for (int k = 0; k < n; ++k) ins.push_back(seeded(dtype, shape, r * n + k));
        std::vector<Tensor> outs = sentinels(dtype, shape, n);
        pg.alltoall(outs, ins).wait();
        for (int q = 0; q < n; ++q) {
          log.expect_values(
              outs[q], expected_of(dtype, shape, q * n + r),
              describe(fmt::format("alltoall output {}", q), dtype, shape, n));
        }
      }
      // Single tensor: chunk k of dim 0 goes to rank k.
      const std::vector<Shape> singles = {{3 * n}, {2 * n, 3}, {0}, {0, 4}};
      for (const Shape& shape : singles) {
        const int64_t chunk = Tensor::numel_of(shape) / n;
        Tensor in = sbtest::filled(dtype, shape, [&](int64_t i) {
          return value(dtype, r * n + int(i / chunk), i % chunk);
        });
        Tensor out = sentinel(dtype, shape);
        pg.alltoall_single(out, in).wait();
        std::vector<double> want(static_cast<size_t>(out.numel()));
        for (int64_t i = 0; i < out.numel(); ++i)
          want[i] = value(dtype, int(i / chunk) * n + r, i % chunk);
        log.expect_values(out, want, describe("alltoall_single", dtype, shape, n));
      }
    }
  }));
}

TEST_CASE("list ops read and write row views of one tensor, in any order",
          "[collective][gloo][alltoall][allgather][reduce_scatter]") {
  const int n = GENERATE(2, 3);
  auto groups = sbtest::make_groups(n, sbtest::unique_group_name("views"));
  sbtest::report(sbtest::run_on(groups, [n](ProcessGroup& pg, sbtest::RankLog& log) {
    const int r = pg.rank();
    // Rows of one [n, 4] tensor; outputs in reverse row order, so entries
    // that are adjacent in memory are not adjacent in the list.
    auto rows = [n](const Tensor& base, bool reversed) {
      std::vector<Tensor> out;
      for (int k = 0; k < n; ++k)
        out.push_back(base.narrow0(reversed ? n - 1 - k : k, 1));
      return out;
    };
    for (DType dtype : {DType::kFloat32, DType::kUInt8, DType::kBFloat16}) {
      const Shape row{1, 4};
      Tensor in_base = sbtest::filled(dtype, {n, 4}, [&](int64_t i) {
        return value(dtype, r * n + int(i / 4), i % 4);
      });
      Tensor out_base = sentinel(dtype, {n, 4});
      std::vector<Tensor> ins = rows(in_base, false);
      std::vector<Tensor> outs = rows(out_base, true);
      pg.alltoall(outs, ins).wait();
      for (int q = 0; q < n; ++q) {
        log.expect_values(outs[q], expected_of(dtype, row, q * n + r),
                          describe(fmt::format("alltoall into reversed row view {}", q),
                                   dtype, row, n));
      }
      Tensor gathered_base = sentinel(dtype, {n, 4});
      std::vector<Tensor> gathered = rows(gathered_base, true);
      Tensor mine = seeded(dtype, row, r);
      pg.allgather(gathered, mine).wait();
      for (int q = 0; q < n; ++q) {
        log.expect_values(gathered[q], expected_of(dtype, row, q),
                          describe(fmt::format("allgather into reversed row view {}", q),
                                   dtype, row, n));
      }
      Tensor out_row = sentinel(dtype, {2, 4}).narrow0(1, 1);
      pg.reduce_scatter(out_row, ins, ReduceOp::kMax).wait();
      log.expect_values(
          out_row,
          reduced(dtype, ReduceOp::kMax, n, r, 4,
                  [&](int q, int k, int64_t i) { return value(dtype, q * n + k, i); }),
          describe("reduce_scatter from row views", dtype, row, n));
    }
  }));
}

TEST_CASE("large odd-sized tensors reduce, gather and exchange exactly",
          "[collective][gloo][large]") {
  const int n = GENERATE(2, 3);
  auto groups = sbtest::make_groups(n, sbtest::unique_group_name("large"));
  sbtest::report(sbtest::run_on(groups, [n](ProcessGroup& pg, sbtest::RankLog& log) {
    const int r = pg.rank();
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt8}) {
      const Shape big{131'075};
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin}) {
        Tensor t = seeded(dtype, big, r);
        pg.allreduce(t, op).wait();
        log.expect_values(
            t, reduced(dtype, op, n, 0, t.numel(), by_rank(dtype)),
            describe(fmt::format("allreduce {}", reduce_op_name(op)), dtype, big, n));
      }
      Tensor b = seeded(dtype, big, r + 1);
      pg.broadcast(b, n - 1).wait();
      log.expect_values(b, expected_of(dtype, big, n),
                        describe("broadcast", dtype, big, n));

      const Shape mid{30'011};
      std::vector<Tensor> outs = sentinels(dtype, mid, n);
      Tensor mine = seeded(dtype, mid, r);
      pg.allgather(outs, mine).wait();
      for (int q = 0; q < n; ++q) {
        log.expect_values(outs[q], expected_of(dtype, mid, q),
                          describe(fmt::format("allgather output {}", q), dtype, mid, n));
      }
      std::vector<Tensor> ins;
      for (int k = 0; k < n; ++k) ins.push_back(seeded(dtype, mid, r * n + k));
      Tensor out = sentinel(dtype, mid);
      pg.reduce_scatter(out, ins, ReduceOp::kSum).wait();
      log.expect_values(
          out,
          reduced(dtype, ReduceOp::kSum, n, r, out.numel(),
                  [&](int q, int k, int64_t i) { return value(dtype, q * n + k, i); }),
          describe("reduce_scatter", dtype, mid, n));
      const Shape rows{n * 5'003, 3};
      const int64_t chunk = 5'003 * 3;
      Tensor in = sbtest::filled(dtype, rows, [&](int64_t i) {
        return value(dtype, r * n + int(i / chunk), i % chunk);
      });
      Tensor exchanged = sentinel(dtype, rows);
      pg.alltoall_single(exchanged, in).wait();
      std::vector<double> want(static_cast<size_t>(exchanged.numel()));
      for (int64_t i = 0; i < exchanged.numel(); ++i)
        want[i] = value(dtype, int(i / chunk) * n + r, i % chunk);
      log.expect_values(exchanged, want, describe("alltoall_single", dtype, rows, n));
    }
  }));
}

// Allreduces of up to 1 MiB use Gloo's BCUBE algorithm, larger ones its
// RING (gloo_process_group.cc): both sides of the bound, on a group whose
// size is a power of two and on one whose size is not.
TEST_CASE("allreduce and reduce_scatter are exact on both sides of the 1 MiB algorithm bound",
          "[collective][gloo][allreduce]") {
  const int n = GENERATE(3, 4);
  auto groups = sbtest::make_groups(n, sbtest::unique_group_name("bound"));
  sbtest::report(sbtest::run_on(groups, [n](ProcessGroup& pg, sbtest::RankLog& log) {
    const int r = pg.rank();
    for (DType dtype : {DType::kFloat32, DType::kInt8}) {
      const int64_t at_bound = (1 << 20) / static_cast<int64_t>(dtype_size(dtype));
      for (int64_t count : {at_bound, at_bound + 1}) {
        const Shape shape{count};
        Tensor t = seeded(dtype, shape, r);
        pg.allreduce(t, ReduceOp::kSum).wait();
        log.expect_values(t, reduced(dtype, ReduceOp::kSum, n, 0, count, by_rank(dtype)),
                          describe("allreduce SUM", dtype, shape, n));
      }
      // reduce_scatter allreduces the n entries together: n * chunk elements.
      for (int64_t chunk : {at_bound / n, at_bound / n + 1}) {
        const Shape shape{chunk};
        std::vector<Tensor> ins;
        for (int k = 0; k < n; ++k) ins.push_back(seeded(dtype, shape, r * n + k));
        Tensor out = sentinel(dtype, shape);
        pg.reduce_scatter(out, ins, ReduceOp::kSum).wait();
        log.expect_values(
            out,
            reduced(dtype, ReduceOp::kSum, n, r, chunk,
                    [&](int q, int k, int64_t i) { return value(dtype, q * n + k, i); }),
            describe("reduce_scatter", dtype, shape, n));
      }
    }
  }));
}

TEST_CASE("barrier returns on a rank only after every rank entered it",
          "[collective][gloo][barrier]") {
  const int n = GENERATE(1, 2, 3, 4);
  auto groups = sbtest::make_groups(n, sbtest::unique_group_name("barrier"));
  std::atomic<int> entered{0};
  sbtest::report(
      sbtest::run_on(groups, [n, &entered](ProcessGroup& pg, sbtest::RankLog& log) {
        for (int round = 1; round <= 8; ++round) {
          entered.fetch_add(1);
          pg.barrier().wait();
          const int seen = entered.load();
          log.expect(seen >= n * round,
                     fmt::format("barrier round {} returned with {} of {} entries", round,
                                 seen, n * round));
        }
      }));
}

TEST_CASE("works of one group complete in the order they were issued",
          "[collective][gloo][work]") {
  const int n = GENERATE(1, 3);
  auto groups = sbtest::make_groups(n, sbtest::unique_group_name("order"));
  sbtest::report(sbtest::run_on(groups, [n](ProcessGroup& pg, sbtest::RankLog& log) {
    std::vector<Tensor> tensors;
    std::vector<Work> works;
    for (int k = 0; k < 12; ++k)
      tensors.push_back(seeded(DType::kInt32, {7}, pg.rank() + k));
    for (auto& t : tensors) works.push_back(pg.allreduce(t, ReduceOp::kMax));
    Tensor scalar = seeded(DType::kFloat64, {1}, pg.rank());
    works.push_back(pg.broadcast(scalar, n - 1));
    works.back().wait();
    for (size_t k = 0; k + 1 < works.size(); ++k) {
      log.expect(works[k].is_completed(),
                 fmt::format("work {} not completed after work {}", k, works.size() - 1));
      log.expect(works[k].exception() == nullptr, fmt::format("work {} failed", k));
    }
    for (int k = 0; k < 12; ++k) {
      works[k].wait();
      std::vector<double> want(7);
      for (int64_t i = 0; i < 7; ++i) {
        want[i] = value(DType::kInt32, k, i);
        for (int q = 1; q < n; ++q)
          want[i] = std::max(want[i], value(DType::kInt32, q + k, i));
      }
      log.expect_values(tensors[k], want,
                        fmt::format("queued allreduce MAX #{} on {} ranks", k, n));
    }
    log.expect_values(scalar, expected_of(DType::kFloat64, {1}, n - 1),
                      "queued broadcast");
  }));
}

TEST_CASE("sends and recvs around a ring complete though every rank sends first",
          "[collective][gloo][p2p]") {
  const int n = GENERATE(2, 3, 4);
  auto groups = sbtest::make_groups(n, sbtest::unique_group_name("ring"));
  sbtest::report(sbtest::run_on(groups, [n](ProcessGroup& pg, sbtest::RankLog& log) {
    const int r = pg.rank();
    const int next = (r + 1) % n;
    const int prev = (r + n - 1) % n;
    for (DType dtype : kAllDTypes) {
      for (const Shape& shape : kShapes) {
        Tensor out = seeded(dtype, shape, r);
        Tensor in = sentinel(dtype, shape);
        Work sent = pg.send(out, next);
        Work received = pg.recv(in, prev);
        received.wait();
        sent.wait();
        log.expect_values(in, expected_of(dtype, shape, prev),
                          describe("ring recv", dtype, shape, n));
      }
    }
  }));
}

TEST_CASE("tags match sends to recvs whatever order the recvs are posted in",
          "[collective][gloo][p2p]") {
  const int n = GENERATE(2, 3);
  auto groups = sbtest::make_groups(n, sbtest::unique_group_name("tags"));
  sbtest::report(sbtest::run_on(groups, [n](ProcessGroup& pg, sbtest::RankLog& log) {
    const int r = pg.rank();
    const int next = (r + 1) % n;
    const int prev = (r + n - 1) % n;
    for (DType dtype : {DType::kFloat32, DType::kInt8, DType::kBFloat16}) {
      Tensor one = seeded(dtype, {6}, 100 + r);
      Tensor two = seeded(dtype, {6}, 200 + r);
      Tensor got_two = sentinel(dtype, {6});
      Tensor got_one = sentinel(dtype, {6});
      Work sent_one = pg.send(one, next, 1);
      Work sent_two = pg.send(two, next, 2);
      Work recv_two = pg.recv(got_two, prev, 2);
      Work recv_one = pg.recv(got_one, prev, 1);
      recv_two.wait();
      recv_one.wait();
      sent_one.wait();
      sent_two.wait();
      log.expect_values(got_one, expected_of(dtype, {6}, 100 + prev),
                        describe("recv tag 1", dtype, {6}, n));
      log.expect_values(got_two, expected_of(dtype, {6}, 200 + prev),
                        describe("recv tag 2", dtype, {6}, n));
    }
    // Every pair at once: all sends posted before any recv.
    std::vector<Tensor> outs;
    std::vector<Tensor> ins;
    std::vector<Work> works;
    for (int q = 0; q < n; ++q) outs.push_back(seeded(DType::kInt64, {5}, r * n + q));
    for (int q = 0; q < n; ++q) ins.push_back(sentinel(DType::kInt64, {5}));
    for (int q = 0; q < n; ++q) {
      if (q != r) works.push_back(pg.send(outs[q], q, 7));
    }
    for (int q = 0; q < n; ++q) {
      if (q != r) works.push_back(pg.recv(ins[q], q, 7));
    }
    for (auto& work : works) work.wait();
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      log.expect_values(ins[q], expected_of(DType::kInt64, {5}, q * n + r),
                        fmt::format("all-pairs recv from {} on {} ranks", q, n));
    }
  }));
}

TEST_CASE("a recv posted before a collective is matched by a send posted after it",
          "[collective][gloo][p2p]") {
  const int n = GENERATE(2, 3);
  auto groups =
      sbtest::make_groups(n, sbtest::unique_group_name("p2p-around-collective"));
  sbtest::report(sbtest::run_on(groups, [n](ProcessGroup& pg, sbtest::RankLog& log) {
    const int r = pg.rank();
    Tensor got = sentinel(DType::kFloat32, {4});
    Work received = pg.recv(got, (r + n - 1) % n, 3);
    Tensor summed = seeded(DType::kFloat32, {4}, r);
    pg.allreduce(summed).wait();
    Tensor out = seeded(DType::kFloat32, {4}, 50 + r);
    Work sent = pg.send(out, (r + 1) % n, 3);
    received.wait();
    sent.wait();
    log.expect_values(got, expected_of(DType::kFloat32, {4}, 50 + (r + n - 1) % n),
                      "recv around allreduce");
    log.expect_values(
        summed,
        reduced(DType::kFloat32, ReduceOp::kSum, n, 0, 4, by_rank(DType::kFloat32)),
        "allreduce between recv and send");
  }));
}

TEST_CASE("two groups on one store and the same ranks keep their traffic apart",
          "[collective][gloo][groups]") {
  const int n = 3;
  HashStore store;
  auto first = sbtest::make_groups(store, n, sbtest::unique_group_name("first"),
                                   std::chrono::seconds(30));
  auto second = sbtest::make_groups(store, n, sbtest::unique_group_name("second"),
                                    std::chrono::seconds(30));
  std::vector<std::string> failures = sbtest::run_on(first, [&](ProcessGroup& pg,
                                                                sbtest::RankLog& log) {
    const int r = pg.rank();
    ProcessGroup& other = *second[r];
    Tensor a = seeded(DType::kInt32, {9}, r);
    Tensor b = seeded(DType::kInt32, {9}, 20 + r);
    // Issued in the opposite order on odd ranks: the groups are independent.
    std::optional<Work> wa, wb;
    if (r % 2 == 0) {
      wa = pg.allreduce(a, ReduceOp::kMax);
      wb = other.allreduce(b, ReduceOp::kMin);
    } else {
      wb = other.allreduce(b, ReduceOp::kMin);
      wa = pg.allreduce(a, ReduceOp::kMax);
    }
    wa->wait();
    wb->wait();
    log.expect_values(
        a,
        reduced(DType::kInt32, ReduceOp::kMax, n, 0, 9,
                [](int q, int, int64_t i) { return value(DType::kInt32, q, i); }),
        "first group's allreduce");
    log.expect_values(
        b,
        reduced(DType::kInt32, ReduceOp::kMin, n, 0, 9,
                [](int q, int, int64_t i) { return value(DType::kInt32, 20 + q, i); }),
        "second group's allreduce");
  });
  sbtest::report(failures);
}
