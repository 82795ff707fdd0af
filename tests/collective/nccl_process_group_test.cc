// NcclProcessGroup on GPUs: ranks as threads over one HashStore, one GPU
// per rank (NCCL refuses two ranks of a communicator on one GPU), with world
// size min(visible GPUs, 4); without enough GPUs every case prints
// "skipped: <reason>" and returns (Catch2 v2 has no SKIP). The cases that
// need no GPU (registry hook, argument checks, names, allocator) are in
// nccl_checks_test.cc.
#include "collective/nccl_process_group.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "collective/process_group.h"
#include "common/error.h"
#include "core/cuda_allocator.h"
#include "core/tensor.h"
#include "store/hash_store.h"

namespace sb = switchboard;
using sb::Device;
using sb::DType;
using sb::Tensor;
using sb::collective::NcclOptions;
using sb::collective::NcclProcessGroup;
using sb::collective::ReduceOp;
using sb::collective::Work;
using namespace std::chrono_literals;

namespace {

// ---------------------------------------------------------------------------
// Skipping

// True (after printing why) when fewer than `needed` GPUs are visible.
bool skip_unless_gpus(int needed) {
  const int count = sb::cuda_device_count();
  if (count >= needed) return false;
  const std::string reason =
      count == 0 ? sb::cuda_unavailable_reason()
                 : fmt::format("needs {} CUDA devices, {} visible", needed, count);
  WARN("skipped: " << reason);
  fmt::print("skipped: {}\n", reason);
  return true;
}

int world() { return std::min(sb::cuda_device_count(), 4); }

// The world sizes the op tests run at: 1, and as many ranks as GPUs (at
// most 4) when more than one is visible.
std::vector<int> world_sizes() {
  std::vector<int> sizes{1};
  if (world() > 1) sizes.push_back(world());
  return sizes;
}

// ---------------------------------------------------------------------------
// Tensor values (small integers, exact in every dtype)

double get(const Tensor& t, int64_t i) {
  const char* p = static_cast<const char*>(t.data()) + i * t.element_size();
  auto load = [p](auto zero) {
    std::memcpy(&zero, p, sizeof(zero));
    return zero;
  };
  switch (t.dtype()) {
    case DType::kFloat16:
      return sb::half_to_float(load(uint16_t{}));
    case DType::kBFloat16:
      return sb::bfloat16_to_float(load(uint16_t{}));
    case DType::kFloat32:
      return load(float{});
    case DType::kFloat64:
      return load(double{});
    case DType::kInt8:
      return load(int8_t{});
    case DType::kUInt8:
      return load(uint8_t{});
    case DType::kInt32:
      return load(int32_t{});
    case DType::kInt64:
      return static_cast<double>(load(int64_t{}));
    case DType::kBool:
      return load(uint8_t{});
  }
  return 0;
}

void put(const Tensor& t, int64_t i, double v) {
  char* p = static_cast<char*>(t.data()) + i * t.element_size();
  auto store = [p](auto typed) { std::memcpy(p, &typed, sizeof(typed)); };
  switch (t.dtype()) {
    case DType::kFloat16:
      return store(sb::float_to_half(static_cast<float>(v)));
    case DType::kBFloat16:
      return store(sb::float_to_bfloat16(static_cast<float>(v)));
    case DType::kFloat32:
      return store(static_cast<float>(v));
    case DType::kFloat64:
      return store(v);
    case DType::kInt8:
      return store(static_cast<int8_t>(v));
    case DType::kUInt8:
      return store(static_cast<uint8_t>(v));
    case DType::kInt32:
      return store(static_cast<int32_t>(v));
    case DType::kInt64:
      return store(static_cast<int64_t>(v));
    case DType::kBool:
      return store(static_cast<uint8_t>(v != 0));
  }
}

using ValueFn = std::function<double(int64_t)>;

Tensor cpu_tensor(DType dtype, const Tensor::Shape& shape, const ValueFn& value) {
  Tensor t = Tensor::empty(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) put(t, i, value(i));
  return t;
}

Tensor cuda_tensor(int device, DType dtype, const Tensor::Shape& shape,
                   const ValueFn& value) {
  return sb::copy_to_cuda(cpu_tensor(dtype, shape, value), device);
}

std::vector<double> values_of(const Tensor& t) {
  const Tensor cpu = t.device().is_cpu() ? t : sb::copy_to_cpu(t);
  std::vector<double> out(static_cast<size_t>(cpu.numel()));
  for (int64_t i = 0; i < cpu.numel(); ++i) out[i] = get(cpu, i);
  return out;
}

std::vector<double> expected(int64_t n, const ValueFn& value) {
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = value(i);
  return out;
}

// ---------------------------------------------------------------------------
// Ranks as threads

// Runs body(rank) on n threads; rethrows the first exception on the caller.
void run_threads(int n, const std::function<void(int)>& body) {
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(rank);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  if (first) std::rethrow_exception(first);
}

// What one rank saw go wrong; reported on the main thread (Catch2's
// assertions are not thread-safe).
class Log {
 public:
  explicit Log(int rank) : rank_(rank) {}

  void expect(bool ok, std::string_view what) {
    if (!ok) failures_.push_back(fmt::format("rank {}: {}", rank_, what));
  }
  // Exact by default; `tolerance` is relative (for AVG, which NCCL may
  // compute as a pre-multiplied sum).
  void expect_values(const Tensor& t, const std::vector<double>& want,
                     std::string_view what, double tolerance = 0) {
    const std::vector<double> got = values_of(t);
    bool ok = got.size() == want.size();
    for (size_t i = 0; ok && i < got.size(); ++i) {
      ok = std::abs(got[i] - want[i]) <= tolerance * std::max(1.0, std::abs(want[i]));
    }
    expect(ok, fmt::format("{}: got [{}], expected [{}]", what, fmt::join(got, ", "),
                           fmt::join(want, ", ")));
  }
  // Records a failure unless `call` throws E with every fragment in its message.
  template <typename E, typename Call>
  void expect_throws(Call&& call, std::string_view what,
                     const std::vector<std::string>& fragments) {
    try {
      call();
    } catch (const E& e) {
      for (const auto& fragment : fragments) {
        expect(std::string(e.what()).find(fragment) != std::string::npos,
               fmt::format("{}: \"{}\" does not name \"{}\"", what, e.what(), fragment));
      }
      return;
    } catch (const std::exception& e) {
      expect(false, fmt::format("{}: wrong exception type: {}", what, e.what()));
      return;
    }
    expect(false, fmt::format("{}: did not throw", what));
  }
  const std::vector<std::string>& failures() const { return failures_; }

 private:
  int rank_;
  std::vector<std::string> failures_;
};

std::string unique_name(std::string_view base) {
  static std::atomic<int> counter{0};
  return fmt::format("{}-{}", base, counter.fetch_add(1));
}

// One NcclProcessGroup per rank (rank r on device_of(r)), built and
// destroyed on the ranks' threads (both need every rank at once).
class Ranks {
 public:
  using Body = std::function<void(NcclProcessGroup& pg, Log& log)>;

  Ranks(
      int n, std::chrono::milliseconds timeout = 60s,
      const std::function<int(int)>& device_of = [](int rank) { return rank; })
      : name_(unique_name("nccl")), groups_(n) {
    sb::HashStore store;  // used during construction only
    run_threads(n, [&](int rank) {
      NcclOptions options;
      options.group_name = name_;
      options.timeout = timeout;
      options.device = device_of(rank);
      groups_[rank] = std::make_unique<NcclProcessGroup>(store, rank, n, options);
    });
  }
  ~Ranks() {
    run_threads(static_cast<int>(groups_.size()),
                [&](int rank) { groups_[rank].reset(); });
  }

  const std::string& name() const { return name_; }
  int size() const { return static_cast<int>(groups_.size()); }

  // Runs body on every rank and reports every rank's failures.
  void run(const Body& body) {
    std::vector<Log> logs;
    for (int rank = 0; rank < size(); ++rank) logs.emplace_back(rank);
    run_threads(size(), [&](int rank) { body(*groups_[rank], logs[rank]); });
    size_t count = 0;
    for (const Log& log : logs) {
      for (const std::string& failure : log.failures()) {
        FAIL_CHECK(failure);
        ++count;
      }
    }
    CHECK(count == 0);
  }

 private:
  std::string name_;
  std::vector<std::unique_ptr<NcclProcessGroup>> groups_;
};

constexpr DType kTestedDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                                   DType::kFloat64, DType::kInt8,    DType::kUInt8,
                                   DType::kInt32,   DType::kInt64,   DType::kBool};

}  // namespace

TEST_CASE("allreduce reduces every dtype with every op", "[nccl][gpu]") {
  if (skip_unless_gpus(1)) return;
  for (int world_size : world_sizes()) {
    INFO("world size " << world_size);
    Ranks ranks(world_size);
    const int n = ranks.size();
    ranks.run([&](NcclProcessGroup& pg, Log& log) {
      const int r = pg.rank();
      const int device = pg.device().index;
      for (DType dtype : kTestedDTypes) {
        const bool is_bool = dtype == DType::kBool;
        // bool: element i is set on rank i only; others: (rank + 1) + i % 2.
        auto mine = [&](int rank, int64_t i) {
          return is_bool ? double(i == rank) : double(rank + 1 + i % 2);
        };
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin,
                            ReduceOp::kMax, ReduceOp::kAvg}) {
          if (op == ReduceOp::kAvg && !sb::is_floating(dtype)) continue;
          Tensor t =
              cuda_tensor(device, dtype, {6}, [&](int64_t i) { return mine(r, i); });
          pg.allreduce(t, op).wait();
          auto want = [&](int64_t i) {
            if (is_bool) {
              const bool any = op == ReduceOp::kSum || op == ReduceOp::kMax;
              return any ? double(i < n) : double(n == 1 && i == 0);
            }
            double acc = mine(0, i);
            for (int q = 1; q < n; ++q) {
              const double v = mine(q, i);
              switch (op) {
                case ReduceOp::kSum:
                case ReduceOp::kAvg:
                  acc += v;
                  break;
                case ReduceOp::kProduct:
                  acc *= v;
                  break;
                case ReduceOp::kMin:
                  acc = std::min(acc, v);
                  break;
                case ReduceOp::kMax:
                  acc = std::max(acc, v);
                  break;
              }
            }
            return op == ReduceOp::kAvg ? acc / n : acc;
          };
          const bool half = dtype == DType::kFloat16 || dtype == DType::kBFloat16;
          const double tolerance = op != ReduceOp::kAvg ? 0 : half ? 1e-2 : 1e-6;
          log.expect_values(t, expected(6, want),
                            fmt::format("allreduce {} {}", sb::dtype_name(dtype),
                                        sb::collective::reduce_op_name(op)),
                            tolerance);
        }
      }
    });
  }
}

TEST_CASE("broadcast and reduce move values from and to a root", "[nccl][gpu]") {
  if (skip_unless_gpus(1)) return;
  for (int world_size : world_sizes()) {
    INFO("world size " << world_size);
    Ranks ranks(world_size);
    const int n = ranks.size();
    const int root = n - 1;
    ranks.run([&](NcclProcessGroup& pg, Log& log) {
      const int r = pg.rank();
      const int device = pg.device().index;
      for (DType dtype : {DType::kFloat32, DType::kInt64, DType::kFloat16}) {
        Tensor b =
            cuda_tensor(device, dtype, {2, 3}, [&](int64_t i) { return 10 * r + i; });
        pg.broadcast(b, root).wait();
        log.expect_values(b, expected(6, [&](int64_t i) { return 10 * root + i; }),
                          fmt::format("broadcast {}", sb::dtype_name(dtype)));

        Tensor t = cuda_tensor(device, dtype, {5}, [&](int64_t i) { return r + i; });
        pg.reduce(t, root, ReduceOp::kSum).wait();
        if (r == root) {
          log.expect_values(
              t, expected(5, [&](int64_t i) { return n * (n - 1) / 2 + n * i; }),
              fmt::format("reduce {}", sb::dtype_name(dtype)));
        }
      }
    });
  }
}

TEST_CASE("allgather and gather collect every rank's tensor, staged or in place",
          "[nccl][gpu]") {
  if (skip_unless_gpus(1)) return;
  for (int world_size : world_sizes()) {
    INFO("world size " << world_size);
    Ranks ranks(world_size);
    const int n = ranks.size();
    ranks.run([&](NcclProcessGroup& pg, Log& log) {
      const int r = pg.rank();
      const int device = pg.device().index;
      const Tensor input = cuda_tensor(device, DType::kFloat32, {3},
                                       [&](int64_t i) { return 100 * r + i; });
      auto of_rank = [](int q) {
        return expected(3, [q](int64_t i) { return 100 * q + i; });
      };
      // Separate tensors: staged through one flat buffer.
      std::vector<Tensor> outs;
      for (int q = 0; q < n; ++q)
        outs.push_back(Tensor::empty({3}, DType::kFloat32, pg.device()));
      pg.allgather(outs, input).wait();
      for (int q = 0; q < n; ++q)
        log.expect_values(outs[q], of_rank(q), "allgather (staged)");
      // Views of one buffer: gathered in place.
      Tensor flat = Tensor::empty({n * 3}, DType::kFloat32, pg.device());
      std::vector<Tensor> views;
      for (int q = 0; q < n; ++q) views.push_back(flat.narrow0(q * 3, 3));
      pg.allgather(views, input).wait();
      for (int q = 0; q < n; ++q)
        log.expect_values(views[q], of_rank(q), "allgather (flat)");

      std::vector<Tensor> gathered;
      if (r == 0) {
        for (int q = 0; q < n; ++q) {
          gathered.push_back(Tensor::empty({3}, DType::kFloat32, pg.device()));
        }
      }
      pg.gather(gathered, input, 0).wait();
      for (size_t q = 0; q < gathered.size(); ++q) {
        log.expect_values(gathered[q], of_rank(static_cast<int>(q)), "gather");
      }
    });
  }
}

TEST_CASE("scatter and reduce_scatter hand each rank its chunk", "[nccl][gpu]") {
  if (skip_unless_gpus(1)) return;
  for (int world_size : world_sizes()) {
    INFO("world size " << world_size);
    Ranks ranks(world_size);
    const int n = ranks.size();
    ranks.run([&](NcclProcessGroup& pg, Log& log) {
      const int r = pg.rank();
      const int device = pg.device().index;
      std::vector<Tensor> inputs;
      for (int q = 0; q < n; ++q) {
        inputs.push_back(cuda_tensor(device, DType::kInt32, {4},
                                     [&](int64_t i) { return 10 * q + i + r; }));
      }
      Tensor out = Tensor::empty({4}, DType::kInt32, pg.device());
      pg.scatter(out, r == 0 ? inputs : std::vector<Tensor>{}, 0).wait();
      log.expect_values(out, expected(4, [&](int64_t i) { return 10 * r + i; }),
                        "scatter");

      Tensor reduced = Tensor::empty({4}, DType::kInt32, pg.device());
      pg.reduce_scatter(reduced, inputs, ReduceOp::kSum).wait();
      log.expect_values(
          reduced,
          expected(4, [&](int64_t i) { return n * (10 * r + i) + n * (n - 1) / 2; }),
          "reduce_scatter");
    });
  }
}

TEST_CASE("alltoall and alltoall_single exchange chunks between every pair of ranks",
          "[nccl][gpu]") {
  if (skip_unless_gpus(1)) return;
  for (int world_size : world_sizes()) {
    INFO("world size " << world_size);
    Ranks ranks(world_size);
    const int n = ranks.size();
    ranks.run([&](NcclProcessGroup& pg, Log& log) {
      const int r = pg.rank();
      const int device = pg.device().index;
      // Chunk q of rank r holds 100 * r + 10 * q + i.
      std::vector<Tensor> ins, outs;
      for (int q = 0; q < n; ++q) {
        ins.push_back(cuda_tensor(device, DType::kFloat64, {2},
                                  [&](int64_t i) { return 100 * r + 10 * q + i; }));
        outs.push_back(Tensor::empty({2}, DType::kFloat64, pg.device()));
      }
      pg.alltoall(outs, ins).wait();
      for (int q = 0; q < n; ++q) {
        log.expect_values(outs[q],
                          expected(2, [&](int64_t i) { return 100 * q + 10 * r + i; }),
                          "alltoall");
      }
      Tensor in = cuda_tensor(device, DType::kBFloat16, {n * 2},
                              [&](int64_t e) { return 100 * r + 10 * (e / 2) + e % 2; });
      Tensor out = Tensor::empty({n * 2}, DType::kBFloat16, pg.device());
      pg.alltoall_single(out, in).wait();
      log.expect_values(
          out, expected(n * 2, [&](int64_t e) { return 100 * (e / 2) + 10 * r + e % 2; }),
          "alltoall_single");
    });
  }
}

TEST_CASE("barrier completes on every rank, and ops refuse tensors on the wrong device",
          "[nccl][gpu]") {
  if (skip_unless_gpus(1)) return;
  for (int world_size : world_sizes()) {
    INFO("world size " << world_size);
    Ranks ranks(world_size);
    ranks.run([&](NcclProcessGroup& pg, Log& log) {
      pg.barrier().wait();
      pg.barrier().wait(10s);
      Tensor cpu = Tensor::from_vector<float>({1, 2});
      log.expect_throws<std::invalid_argument>([&] { pg.allreduce(cpu); },
                                               "allreduce of a CPU tensor",
                                               {"allreduce in group", "is on cpu"});
      log.expect(pg.backend_name() == "NCCL", "backend_name");
    });
  }
}

TEST_CASE("send and recv pass a tensor around a ring", "[nccl][gpu]") {
  if (skip_unless_gpus(2)) return;
  Ranks ranks(world());
  const int n = ranks.size();
  ranks.run([&](NcclProcessGroup& pg, Log& log) {
    const int r = pg.rank();
    const int device = pg.device().index;
    Tensor mine =
        cuda_tensor(device, DType::kUInt8, {7}, [&](int64_t i) { return r * 10 + i; });
    Tensor got = Tensor::empty({7}, DType::kUInt8, pg.device());
    const int next = (r + 1) % n;
    const int prev = (r + n - 1) % n;
    // Posted before waiting on either, so no ordering deadlock.
    Work sent = pg.send(mine, next, /*tag=*/3);
    Work received = pg.recv(got, prev, /*tag=*/3);
    sent.wait();
    received.wait();
    log.expect_values(got, expected(7, [&](int64_t i) { return prev * 10 + i; }), "recv");
    log.expect_throws<std::invalid_argument>([&] { pg.send(mine, r); }, "send to itself",
                                             {"is this rank"});
  });
}

TEST_CASE("multigpu collectives drive several devices per rank", "[nccl][gpu]") {
  if (skip_unless_gpus(2)) return;
  const int k = std::min(sb::cuda_device_count(), 4) / 2;  // devices per rank
  Ranks ranks(2, 60s, [k](int rank) { return rank * k; });
  const int total = 2 * k;  // NCCL ranks of the multigpu communicator
  ranks.run([&](NcclProcessGroup& pg, Log& log) {
    const int r = pg.rank();
    auto global = [&](int i) { return r * k + i; };
    std::vector<Tensor> ts;
    for (int i = 0; i < k; ++i) {
      const int g = global(i);
      ts.push_back(
          cuda_tensor(g, DType::kFloat32, {4}, [g](int64_t e) { return g + 1 + e; }));
    }
    pg.allreduce_multigpu(ts).wait();
    for (int i = 0; i < k; ++i) {
      log.expect_values(
          ts[i],
          expected(4, [&](int64_t e) { return total * (total + 1) / 2 + total * e; }),
          "allreduce_multigpu");
    }

    for (int i = 0; i < k; ++i) {
      const int g = global(i);
      ts[i] = cuda_tensor(g, DType::kInt32, {3}, [g](int64_t e) { return 10 * g + e; });
    }
    pg.broadcast_multigpu(ts, /*src_rank=*/1, /*src_tensor=*/k - 1).wait();
    const int root = 1 * k + (k - 1);
    for (int i = 0; i < k; ++i) {
      log.expect_values(ts[i], expected(3, [&](int64_t e) { return 10 * root + e; }),
                        "broadcast_multigpu");
    }

    for (int i = 0; i < k; ++i) {
      const int g = global(i);
      ts[i] = cuda_tensor(g, DType::kInt32, {3}, [g](int64_t e) { return g + e; });
    }
    pg.reduce_multigpu(ts, /*dst_rank=*/0, /*dst_tensor=*/0).wait();
    if (r == 0) {
      log.expect_values(
          ts[0],
          expected(3, [&](int64_t e) { return total * (total - 1) / 2 + total * e; }),
          "reduce_multigpu");
    }

    std::vector<Tensor> inputs;
    std::vector<std::vector<Tensor>> outputs(k);
    for (int i = 0; i < k; ++i) {
      const int g = global(i);
      inputs.push_back(
          cuda_tensor(g, DType::kFloat16, {2}, [g](int64_t e) { return g * 2 + e; }));
      for (int q = 0; q < total; ++q) {
        outputs[i].push_back(Tensor::empty({2}, DType::kFloat16, Device::cuda(g)));
      }
    }
    pg.allgather_multigpu(outputs, inputs).wait();
    for (int i = 0; i < k; ++i) {
      for (int q = 0; q < total; ++q) {
        log.expect_values(outputs[i][q],
                          expected(2, [&](int64_t e) { return q * 2 + e; }),
                          "allgather_multigpu");
      }
    }

    std::vector<Tensor> reduced;
    std::vector<std::vector<Tensor>> chunks(k);
    for (int i = 0; i < k; ++i) {
      const int g = global(i);
      reduced.push_back(Tensor::empty({2}, DType::kFloat32, Device::cuda(g)));
      for (int q = 0; q < total; ++q) {
        chunks[i].push_back(cuda_tensor(g, DType::kFloat32, {2},
                                        [q, g](int64_t e) { return 10 * q + e + g; }));
      }
    }
    pg.reduce_scatter_multigpu(reduced, chunks).wait();
    for (int i = 0; i < k; ++i) {
      const int g = global(i);
      log.expect_values(reduced[i],
                        expected(2,
                                 [&](int64_t e) {
                                   return total * (10 * g + e) + total * (total - 1) / 2;
                                 }),
                        "reduce_scatter_multigpu");
    }
  });
}

TEST_CASE("send_multigpu and recv_multigpu address a device of the peer", "[nccl][gpu]") {
  if (skip_unless_gpus(2)) return;
  const int k = std::min(sb::cuda_device_count(), 4) / 2;
  Ranks ranks(2, 60s, [k](int rank) { return rank * k; });
  ranks.run([&](NcclProcessGroup& pg, Log& log) {
    const int r = pg.rank();
    const int mine = r * k + (k - 1);  // this rank's last device
    const int theirs = (1 - r) * k + (k - 1);
    Tensor out =
        cuda_tensor(mine, DType::kInt64, {5}, [r](int64_t e) { return 1000 * r + e; });
    Tensor in = Tensor::empty({5}, DType::kInt64, Device::cuda(mine));
    // Rank 0 sends first, then receives; rank 1 the other way round.
    if (r == 0) {
      pg.send_multigpu(out, 1, theirs).wait();
      pg.recv_multigpu(in, 1, theirs).wait();
    } else {
      pg.recv_multigpu(in, 0, theirs).wait();
      pg.send_multigpu(out, 0, theirs).wait();
    }
    log.expect_values(in, expected(5, [r](int64_t e) { return 1000 * (1 - r) + e; }),
                      "recv_multigpu");
  });
}

TEST_CASE(
    "A rank that never joins an allreduce makes wait throw TimeoutError and breaks "
    "the group",
    "[nccl][gpu][timeout]") {
  if (skip_unless_gpus(2)) return;
  Ranks ranks(2, 1500ms);
  const std::string group = ranks.name();
  ranks.run([&](NcclProcessGroup& pg, Log& log) {
    if (pg.rank() != 0) return;  // rank 1 never arrives
    Tensor t =
        cuda_tensor(pg.device().index, DType::kFloat32, {4}, [](int64_t) { return 1; });
    Work work = pg.allreduce(t);
    const auto start = std::chrono::steady_clock::now();
    log.expect_throws<sb::TimeoutError>(
        [&] { work.wait(); }, "wait",
        {"allreduce", "group \"" + group + "\"", "rank 0", "1500 ms"});
    log.expect(std::chrono::steady_clock::now() - start < 20s,
               "the timeout took too long");
    log.expect_throws<sb::Error>([&] { pg.allreduce(t); }, "the next op",
                                 {"allreduce", "broken", "1500 ms"});
  });
}

TEST_CASE("A wait shorter than the group's timeout throws TimeoutError naming it",
          "[nccl][gpu][timeout]") {
  if (skip_unless_gpus(2)) return;
  Ranks ranks(2, 5s);
  ranks.run([&](NcclProcessGroup& pg, Log& log) {
    if (pg.rank() != 0) return;
    Tensor t =
        cuda_tensor(pg.device().index, DType::kInt32, {4}, [](int64_t) { return 1; });
    Work work = pg.broadcast(t, 1);
    log.expect_throws<sb::TimeoutError>([&] { work.wait(200ms); }, "wait(200ms)",
                                        {"broadcast", "rank 0", "200 ms"});
  });
}
