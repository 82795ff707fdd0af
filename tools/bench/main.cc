// Switchboard's benchmarks, one subcommand per layer:
//
//   bazel run -c opt //tools/bench -- store [--seconds S]
//   bazel run -c opt //tools/bench -- collective [--rounds N]
//   bazel run -c opt //tools/bench -- rpc [--quick]
//   bazel run -c opt //tools/bench -- auth [--rounds N]
//   bazel run -c opt //tools/bench -- ray [--quick]
//
// Each subcommand prints `# ...` header lines and `name=value` results.
// `bench --help` lists the subcommands, `bench SUBCOMMAND --help` their
// flags. Exit status: 0 done; 1 a benchmark failed; 2 usage error.
#include <string>
#include <vector>

#include "common/cli.h"
#include "common/logging.h"
#include "tools/bench/auth_bench.h"
#include "tools/bench/collective_bench.h"
#include "tools/bench/ray_bench.h"
#include "tools/bench/rpc_bench.h"
#include "tools/bench/store_bench.h"

int main(int argc, char** argv) {
  using namespace switchboard::bench;
  namespace cli = switchboard::cli;
  switchboard::init_logging("bench");
  const std::string argv0 = argc > 0 ? argv[0] : "bench";
  CLI::App app(
      "Switchboard's benchmarks, one subcommand per layer. Each prints\n"
      "`# ...` header lines and `name=value` result lines on stdout.",
      "bench");
  cli::set_synopsis(app, "bench SUBCOMMAND [flags]");
  app.require_subcommand(1);
  // Every benchmark, in the order `bench --help` lists them.
  const std::vector<Subcommand> benches = {
      add_store_bench(app, argv0),
      add_collective_bench(app, argv0),
      add_rpc_bench(app, argv0),
      add_auth_bench(app, argv0),
      add_ray_bench(app, argv0),
  };
  if (auto status = cli::report(app, cli::parse(app, argc, argv))) return *status;
  for (const Subcommand& bench : benches) {
    if (bench.app->parsed()) return bench.run();
  }
  return 2;  // require_subcommand(1) makes parse() fail first
}
