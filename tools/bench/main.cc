// Switchboard's benchmarks, one subcommand per layer:
//
//   bazel run -c opt //tools/bench -- store [--seconds S]
//   bazel run -c opt //tools/bench -- collective [--rounds N]
//   bazel run -c opt //tools/bench -- rpc [--quick]
//
// Each subcommand prints `# ...` header lines and `name=value` results.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "tools/bench/collective_bench.h"
#include "tools/bench/rpc_bench.h"
#include "tools/bench/store_bench.h"

namespace {

using namespace switchboard::bench;

struct Subcommand {
  const char* name;
  const char* summary;
  // Gets argv[0] (to find runfiles) and the arguments after the subcommand;
  // returns the exit status.
  int (*run)(const std::string& argv0, const std::vector<std::string>& args);
};

// Every benchmark, in the order `bench` lists them.
constexpr Subcommand kSubcommands[] = {
    {"store", "TcpStore server throughput vs PyTorch's, and 1,000 held connections",
     run_store_bench},
    {"collective", "Gloo allreduce/alltoall, 1 and 64 MiB, 2 and 4 ranks, vs PyTorch's",
     run_collective_bench},
    {"rpc", "rpc_sync/rpc_async/echo of PIPE and PROCESS_GROUP vs raw TCP and PyTorch's",
     run_rpc_bench},
};

int usage() {
  fmt::print(stderr, "usage: bench <subcommand> [flags]\n");
  for (const auto& sub : kSubcommands)
    fmt::print(stderr, "  {:<12}{}\n", sub.name, sub.summary);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  std::string name = argv[1];
  for (const auto& sub : kSubcommands) {
    if (name == sub.name)
      return sub.run(argv[0], std::vector<std::string>(argv + 2, argv + argc));
  }
  fmt::print(stderr, "bench: unknown subcommand '{}'\n", name);
  return usage();
}
