// `bench collective`: allreduce and alltoall of our GlooProcessGroup against
// PyTorch's ProcessGroupGloo, run one after the other on this machine.
//
//   bench collective [--rounds N]
//
// For each world size (2, then 4) it runs N rounds (default 3) of our ranks
// and PyTorch's (alternating which goes first) over loopback, and reports
// each side's lowest round median, so that a burst of other load on the
// machine during one round does not decide the ratio. Each launch is a fresh
// set of processes rendezvousing through its own store:
//   ours:  a TcpStore master in this process, and `world` copies of this
//          binary in worker mode (`bench collective --worker WORLD RANK PORT`)
//          that each build a GlooProcessGroup on a TcpStore client;
//   torch: the venv's Python (@sb_venv) tools/bench/torch_collective.py (or
//          $SB_TORCH_COLLECTIVE for the script), which starts a
//          torch.distributed.TCPStore master and `world` ranks calling
//          init_process_group("gloo").
// Both sides run the same cases with the same timing (see kCases and
// time_case) and leave rank 0's figures in their store under the same keys
// ("bench/<op>_<bytes>" = "<median ms> <min ms>", then "bench/done" = "ok" or
// the first error), where this process reads them with a TcpStore client.
//
// Prints `# ...` header lines and `name=value` result lines on stdout.
#include "tools/bench/collective_bench.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "collective/gloo_process_group.h"
#include "common/cli.h"
#include "common/error.h"
#include "core/tensor.h"
#include "store/tcp_store.h"
#include "tools/bench/process.h"
#include "tools/bench/report.h"

namespace switchboard::bench {

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kHost = "127.0.0.1";
constexpr int kWorldSizes[] = {2, 4};
// The goal: our time per op at most this multiple of PyTorch's, every case.
constexpr double kTargetRatio = 1.10;
// Bounds rendezvous, every op, and how long we wait for one side's results.
constexpr std::chrono::seconds kTimeout{300};
constexpr const char* kDoneKey = "bench/done";

// One measured configuration: `iters` timed ops of `op` on a float32 tensor
// of `bytes` bytes, after `warmup` untimed ones.
struct Case {
  const char* op;  // "allreduce" (SUM, in place) or "alltoall" (alltoall_single)
  int64_t bytes;
  int warmup;
  int iters;

  std::string label() const { return fmt::format("{}_{}MiB", op, bytes >> 20); }
  std::string key() const { return fmt::format("bench/{}_{}", op, bytes); }
  std::string spec() const {
    return fmt::format("{}:{}:{}:{}", op, bytes, warmup, iters);
  }
};

// Chosen so that one round of both sides, both world sizes, takes about 20 s
// on two idle cores (the default 3 rounds: about a minute; more under load).
constexpr Case kCases[] = {
    {"allreduce", 1 << 20, 20, 200},
    {"allreduce", 64 << 20, 3, 20},
    {"alltoall", 1 << 20, 20, 200},
    {"alltoall", 64 << 20, 3, 20},
};

struct Timing {
  double median_ms = 0;
  double min_ms = 0;
};

using Results = std::map<std::string, Timing>;  // by Case::label()

// The median as Python's statistics.median computes it, and the minimum.
Timing summarize(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  size_t mid = ms.size() / 2;
  double median = ms.size() % 2 ? ms[mid] : (ms[mid - 1] + ms[mid]) / 2;
  return Timing{median, ms.front()};
}

// ---- worker mode: one rank of our group ----

Timing time_case(collective::ProcessGroup& group, const Case& c) {
  int64_t numel = c.bytes / static_cast<int64_t>(sizeof(float));
  Tensor input = Tensor::zeros({numel}, DType::kFloat32);
  Tensor output = Tensor::zeros({numel}, DType::kFloat32);
  bool allreduce = std::string_view(c.op) == "allreduce";
  auto run_once = [&] {
    (allreduce ? group.allreduce(input) : group.alltoall_single(output, input)).wait();
  };
  for (int i = 0; i < c.warmup; ++i) run_once();
  group.barrier().wait();
  std::vector<double> ms;
  for (int i = 0; i < c.iters; ++i) {
    auto start = Clock::now();
    run_once();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  return summarize(std::move(ms));
}

// Runs every case, publishes rank 0's figures, then keeps the group until
// the bench closes our stdin (or ends us), so no peer sees us leave early.
void run_rank(Store& store, int world, int rank) {
  collective::GlooOptions options;
  options.group_name = fmt::format("bench_collective_r{}", world);
  options.timeout = kTimeout;
  options.hostname = kHost;
  collective::GlooProcessGroup group(store, rank, world, options);
  for (const Case& c : kCases) {
    Timing t = time_case(group, c);
    if (rank == 0)
      store.set(c.key(), fmt::format("{:.6f} {:.6f}", t.median_ms, t.min_ms));
  }
  group.barrier().wait();
  if (rank == 0) store.set(kDoneKey, "ok");
  char buffer[64];
  while (::read(STDIN_FILENO, buffer, sizeof buffer) > 0) {
  }
}

// A rank of ours: `bench collective --worker WORLD RANK PORT`.
struct WorkerArgs {
  int world = 0;
  int rank = 0;
  uint16_t port = 0;
};

int run_worker(const WorkerArgs& args) {
  const int world = args.world;
  const int rank = args.rank;
  TcpStoreOptions store_options;
  store_options.timeout = kTimeout;
  TcpStore store(kHost, args.port, store_options);
  try {
    run_rank(store, world, rank);
    return 0;
  } catch (const std::exception& e) {
    std::string error = fmt::format("our rank {}: {}", rank, e.what());
    fmt::print(stderr, "bench collective: {}\n", error);
    store.set(kDoneKey, error);
    return 1;
  }
}

// ---- the bench: launch both sides, collect, compare ----

// Waits for kDoneKey in `store`, failing early when one of `children`
// exits, and returns every case's figures. Throws std::runtime_error naming
// `side` and what went wrong.
Results collect(Store& store, const std::vector<pid_t>& children,
                const std::string& side) {
  auto deadline = Clock::now() + kTimeout;
  for (;;) {
    try {
      store.wait({kDoneKey}, std::chrono::seconds(5));
      break;
    } catch (const TimeoutError&) {
      for (pid_t pid : children) {
        if (has_exited(pid)) {
          throw std::runtime_error(fmt::format("{}: process {} exited early", side, pid));
        }
      }
      if (Clock::now() > deadline) {
        throw std::runtime_error(
            fmt::format("{}: no results within {} s", side, kTimeout.count()));
      }
    }
  }
  if (std::string done = to_string(store.get(kDoneKey)); done != "ok") {
    throw std::runtime_error(fmt::format("{}: {}", side, done));
  }
  Results results;
  for (const Case& c : kCases) {
    std::istringstream value(to_string(store.get(c.key())));
    Timing& t = results[c.label()];
    value >> t.median_ms >> t.min_ms;
  }
  return results;
}

std::string self_exe() {
  char path[4096];
  ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) throw std::runtime_error("cannot read /proc/self/exe");
  return std::string(path, static_cast<size_t>(n));
}

Results run_ours(int world) {
  TcpStoreOptions options;
  options.is_master = true;
  options.wait_for_workers = false;
  options.timeout = kTimeout;
  TcpStore store(kHost, 0, options);
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; ++rank) {
    ranks.push_back(std::make_unique<ChildProcess>(std::vector<std::string>{
        self_exe(), "collective", "--worker", std::to_string(world), std::to_string(rank),
        std::to_string(store.port())}));
    pids.push_back(ranks.back()->pid());
  }
  return collect(store, pids, fmt::format("ours, {} ranks", world));
}

// PyTorch's side. The first launch tells whether the venv's PyTorch is here;
// without it every run() returns nullopt.
class TorchBaseline {
 public:
  explicit TorchBaseline(std::string script) : script_(std::move(script)) {}

  // One launch of `world` torch ranks; nullopt when PyTorch cannot start.
  // Throws std::runtime_error when it starts but fails.
  std::optional<Results> run(int world) {
    if (!available_) return std::nullopt;
    std::vector<std::string> argv = {torch_python(), script_, fmt::format("--world={}", world)};
    for (const Case& c : kCases) argv.push_back(fmt::format("--case={}", c.spec()));
    std::unique_ptr<ChildProcess> launcher;
    uint16_t port = 0;
    try {
      launcher = std::make_unique<ChildProcess>(argv);
      port = launcher->read_port(std::chrono::seconds(120));  // imports torch
    } catch (const std::exception& e) {
      available_ = false;
      why_not_ = e.what();
      return std::nullopt;
    }
    TcpStoreOptions options;
    options.timeout = kTimeout;
    TcpStore store(kHost, port, options);
    Results results =
        collect(store, {launcher->pid()}, fmt::format("torch, {} ranks", world));
    version_ = to_string(store.get("bench/torch_version"));
    return results;
  }

  bool available() const { return available_; }
  const std::string& why_not() const { return why_not_; }
  const std::string& version() const { return version_; }

 private:
  std::string script_;
  bool available_ = true;
  std::string why_not_;
  std::string version_;
};

struct Flags {
  int rounds = 3;  // launches of each side per world size
};

void print_header(const Flags& flags) {
  int cpus = usable_cpus();
  fmt::print(
      "# collective: ours = GlooProcessGroup, torch = PyTorch's ProcessGroupGloo "
      "(PyTorch 2.11, the project venv); float32, loopback 127.0.0.1, one process per rank, all "
      "ranks sharing {} usable cores\n",
      cpus);
  fmt::print(
      "# collective: allreduce = SUM in place; alltoall = alltoall_single (dim 0 "
      "split across ranks); per world size, {} rounds of ours and torch (alternating "
      "which goes first), each a fresh set of processes; a round's figure = median "
      "per-op time on rank 0 over its timed ops, after warm-up and a barrier\n",
      flags.rounds);
  fmt::print(
      "# collective: ms = the lowest round's median (round_ms lists them all), "
      "min_ms = fastest single op; algbw_GBps = bytes / ms / 1e6; ratio = ours_ms / "
      "torch_ms\n");
  print_value("nproc", std::to_string(cpus));
  // Other processes compete with the ranks for the cores: say how busy the
  // machine was, at the start and (see run_bench) at the end.
  print_value("loadavg_start", load_average());
  print_value("ranks", fmt::format("{}", fmt::join(kWorldSizes, ",")));
  print_value("rounds", std::to_string(flags.rounds));
  for (const Case& c : kCases) {
    print_value(c.label() + "_warmup", std::to_string(c.warmup));
    print_value(c.label() + "_iters", std::to_string(c.iters));
  }
}

// One side's figure for one case over its rounds.
struct Summary {
  double ms = 0;      // lowest round median
  double min_ms = 0;  // fastest op of any round
  std::vector<double> round_ms;
};

Summary summarize_rounds(const std::vector<Results>& rounds, const std::string& label) {
  Summary summary;
  for (const Results& round : rounds)
    summary.round_ms.push_back(round.at(label).median_ms);
  summary.ms = *std::min_element(summary.round_ms.begin(), summary.round_ms.end());
  summary.min_ms = rounds.front().at(label).min_ms;
  for (const Results& round : rounds) {
    summary.min_ms = std::min(summary.min_ms, round.at(label).min_ms);
  }
  return summary;
}

void print_side(const char* side, const std::string& name, int64_t bytes,
                const Summary& s) {
  print_value(fmt::format("{}_{}_ms", side, name), fmt::format("{:.3f}", s.ms));
  print_value(fmt::format("{}_{}_min_ms", side, name), fmt::format("{:.3f}", s.min_ms));
  print_value(fmt::format("{}_{}_round_ms", side, name),
              fmt::format("{:.3f}", fmt::join(s.round_ms, ",")));
  print_value(fmt::format("{}_{}_algbw_GBps", side, name),
              fmt::format("{:.3f}", static_cast<double>(bytes) / (s.ms * 1e6)));
}

// Prints one world size's figures; returns the largest ours/torch ratio
// (0 without torch figures).
double print_results(int world, const std::vector<Results>& ours,
                     const std::vector<Results>& torch) {
  double worst = 0;
  for (const Case& c : kCases) {
    std::string name = fmt::format("{}_r{}", c.label(), world);
    Summary our = summarize_rounds(ours, c.label());
    print_side("ours", name, c.bytes, our);
    if (torch.empty()) continue;
    Summary their = summarize_rounds(torch, c.label());
    print_side("torch", name, c.bytes, their);
    double ratio = our.ms / their.ms;
    print_value("ratio_" + name, fmt::format("{:.3f}", ratio));
    worst = std::max(worst, ratio);
  }
  return worst;
}

int run_bench(const std::string& argv0, const Flags& flags) {
  TorchBaseline torch(
      find_runfile(argv0, "tools/bench/torch_collective.py", "SB_TORCH_COLLECTIVE"));
  print_header(flags);
  double worst = 0;
  for (int world : kWorldSizes) {
    std::vector<Results> ours, theirs;
    for (int round = 0; round < flags.rounds; ++round) {
      progress("collective: {} ranks, round {} of {} (ours and PyTorch's, every case)",
               world, round + 1, flags.rounds);
      // Alternate which side goes first, so neither always follows the other.
      if (round % 2 == 0) ours.push_back(run_ours(world));
      if (std::optional<Results> results = torch.run(world)) theirs.push_back(*results);
      if (round % 2 == 1) ours.push_back(run_ours(world));
    }
    if (world == kWorldSizes[0]) {
      print_value("torch_available", torch.available() ? "1" : "0");
      if (torch.available()) print_value("torch_version", torch.version());
      if (!torch.available()) {
        fmt::print("# collective: no PyTorch baseline: {}\n", torch.why_not());
      }
    }
    worst = std::max(worst, print_results(world, ours, theirs));
  }
  print_value("loadavg_end", load_average());
  print_value("target_ratio", fmt::format("{:.2f}", kTargetRatio));
  if (!torch.available()) {
    print_value("target_met", "unknown");
    return 0;
  }
  print_value("max_ratio", fmt::format("{:.3f}", worst));
  print_value("target_met", worst <= kTargetRatio ? "yes" : "no");
  return 0;
}

// Checks and converts --worker WORLD RANK PORT; throws CLI::ValidationError
// naming what is wrong.
WorkerArgs worker_args(const std::vector<std::string>& values) {
  if (values.size() != 3) {
    throw CLI::ValidationError("--worker", fmt::format("wants WORLD RANK PORT, not '{}'",
                                                       fmt::join(values, " ")));
  }
  auto number = [&](size_t i, const char* what, int64_t min, int64_t max) {
    std::string value = values[i];
    if (std::string error = cli::in_range(min, max)(value); !error.empty()) {
      throw CLI::ValidationError("--worker", fmt::format("{}: {}", what, error));
    }
    return std::stoi(value);
  };
  WorkerArgs args;
  args.world = number(0, "WORLD", 1, 1024);
  args.rank = number(1, "RANK", 0, args.world - 1);
  args.port = static_cast<uint16_t>(number(2, "PORT", 1, 65535));
  return args;
}

}  // namespace

Subcommand add_collective_bench(CLI::App& bench, const std::string& argv0) {
  auto flags = std::make_shared<Flags>();
  auto worker = std::make_shared<std::optional<WorkerArgs>>();
  auto worker_values = std::make_shared<std::vector<std::string>>();
  CLI::App* sub = bench.add_subcommand(
      "collective", "Gloo allreduce/alltoall, 1 and 64 MiB, 2 and 4 ranks, vs PyTorch's");
  cli::set_synopsis(*sub, "bench collective [--rounds N]");
  sub->add_option("--rounds", flags->rounds, "launches of each side per world size")
      ->type_name("N")
      ->check(cli::in_range(1, 100));
  // The rank processes the bench starts (hidden from --help).
  sub->add_option("--worker", *worker_values, "one rank of our side")
      ->expected(3)
      ->group("");
  sub->callback([worker, worker_values] {
    if (!worker_values->empty()) *worker = worker_args(*worker_values);
  });
  return {sub, [argv0, flags, worker] {
            try {
              return worker->has_value() ? run_worker(**worker)
                                         : run_bench(argv0, *flags);
            } catch (const std::exception& e) {
              fmt::print(stderr, "bench collective: {}\n", e.what());
              return 1;
            }
          }};
}

}  // namespace switchboard::bench
