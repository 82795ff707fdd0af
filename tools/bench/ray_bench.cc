#include "tools/bench/ray_bench.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/cli.h"
#include "tools/bench/process.h"

namespace switchboard::bench {
namespace {

struct Flags {
  bool quick = false;
  std::string actors = "2,4";
};

int run_bench(const std::string& argv0, const Flags& flags) {
  const std::string package = python_package();
  if (::access((package + "/switchboard/_collective.so").c_str(), R_OK) != 0) {
    fmt::print(stderr,
               "bench ray: no {}/switchboard/_collective.so: run `bazel build -c opt "
               "//python:package` first, or set SB_TORCH_RPC_PACKAGE\n",
               package);
    return 2;
  }
  std::string python, script;
  try {
    python = torch_python();
    script = find_runfile(argv0, "tools/bench/ray_collective.py", "SB_RAY_COLLECTIVE");
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench ray: {}\n", e.what());
    return 2;
  }
  // The actors inherit the environment of the Ray that the script starts.
  const char* old = std::getenv("PYTHONPATH");
  const std::string path = old && *old ? package + ":" + old : package;
  ::setenv("PYTHONPATH", path.c_str(), 1);
  std::vector<std::string> argv = {python, script, "--actors", flags.actors};
  if (flags.quick) argv.push_back("--quick");
  return run_inheriting_output(argv);
}

}  // namespace

Subcommand add_ray_bench(CLI::App& bench, const std::string& argv0) {
  auto flags = std::make_shared<Flags>();
  CLI::App* sub = bench.add_subcommand(
      "ray", "Ray's collective API on SWITCHBOARD vs Ray's GLOO (allreduce, allgather, "
             "broadcast)");
  cli::set_synopsis(*sub, "bench ray [--quick] [--actors 2,4]");
  sub->add_flag("--quick", flags->quick, "fewer calls: a smoke run");
  sub->add_option("--actors", flags->actors, "group sizes, comma-separated")
      ->type_name("N,N");
  return {sub, [argv0, flags] { return run_bench(argv0, *flags); }};
}

}  // namespace switchboard::bench
