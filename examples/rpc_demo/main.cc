// rpc_demo: a parameter server and its trainers over Switchboard RPC, the
// main job (tools/demo). Run it under the launcher:
//
//   bazel build //examples/rpc_demo //tools/launch
//   bazel-bin/tools/launch/launch --nproc 4 -- bazel-bin/examples/rpc_demo/rpc_demo
//
// Rank 0 is the parameter server "ps" (ps.cc); ranks 1..N-1 are the trainers
// "trainer-1", ... (trainer.cc). They form a dynamic group: with 3 or more
// trainers, one joins mid-run and one leaves early. They fit y = X w* + noise with SGD:
// each trainer pushes minibatch gradients to the ps with rpc_async, the ps averages them
// in batches (parameter_server.h) and the trainers fetch the new parameters. At the end
// the trainers check over a Gloo allreduce that they all hold the same parameters.
// `rpc_demo --help` lists the flags.
//
// Exit status: 0 the held-out loss went down and the trainers agree; 1 it
// did not, they do not, or something failed (the error is printed); 2 a
// usage error (bad flags, or not started by the launcher).
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <optional>
#include <string>

#include "common/cli.h"
#include "common/listen_address.h"
#include "common/logging.h"
#include "examples/rpc_demo/flags.h"
#include "examples/rpc_demo/roles.h"
#include "rendezvous/init_method.h"
#include "rpc/rpc.h"

namespace switchboard::rpc_demo {

std::shared_ptr<rpc::RpcBackendOptions> demo_rpc_options(const DemoFlags& flags, int rank) {
  // No listen_address extra: --listen-address reaches PIPE and Gloo alike
  // through SWITCHBOARD_IFNAME (main() sets it).
  auto options =
      rpc::construct_rpc_backend_options(rpc::backend_type("PIPE"), kRpcTimeout, "env://");
  if (flags.metrics_port >= 0) {
    options->metrics_port = flags.metrics_port == 0 ? 0 : flags.metrics_port + rank;
    // On --listen-address (an address or an interface), else on loopback:
    // the ps scrapes its own endpoint there (metrics_report.cc).
    options->metrics_address =
        flags.listen_address.empty()
            ? "127.0.0.1"
            : choose_listen_address({.component = "metrics", .option = flags.listen_address})
                  .address;
  }
  return options;
}

void say_line(const std::string& who, const std::string& text) {
  static std::mutex mu;
  std::lock_guard lock(mu);
  fmt::print("{}: {}\n", who, text);
  std::fflush(stdout);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace switchboard::rpc_demo

namespace {

using namespace switchboard::rpc_demo;

// The role's name, for the error line.
std::string role_name(int rank) {
  return rank == 0 ? "ps" : fmt::format("trainer-{}", rank);
}

}  // namespace

int main(int argc, char** argv) {
  switchboard::init_logging("rpc_demo");
  DemoFlags flags;
  CLI::App app;
  add_demo_flags(app, &flags);
  if (auto status =
          switchboard::cli::report(app, switchboard::cli::parse(app, argc, argv))) {
    return *status;
  }
  std::optional<int> rank;
  std::optional<int> world_size;
  try {
    rank = switchboard::rendezvous::env_rank();
    world_size = switchboard::rendezvous::env_world_size();
  } catch (const std::exception& e) {
    fmt::print(stderr, "rpc_demo: {}\n", e.what());
    return 2;
  }
  if (!rank || !world_size || *world_size < 2) {
    fmt::print(stderr,
               "rpc_demo: needs RANK and a WORLD_SIZE of at least 2 (one ps, one "
               "trainer); found RANK={} WORLD_SIZE={}. Start it with the launcher:\n"
               "  launch --nproc 4 -- rpc_demo\n",
               rank ? std::to_string(*rank) : "(unset)",
               world_size ? std::to_string(*world_size) : "(unset)");
    return 2;
  }
  // From here on, log lines name the worker ("ps", "trainer-2") instead of
  // the program.
  switchboard::set_log_identity(role_name(*rank));
  const int trainers = *world_size - 1;
  const int64_t late = late_joiner(flags, trainers);
  const int64_t leaves = leaver(flags, trainers);
  if (late > trainers || leaves > trainers || (late > 0 && late == leaves) ||
      (leaves > 0 && trainers - 1 < 1)) {
    fmt::print(stderr,
               "rpc_demo: --late-joiner {} and --leaver {} must name different trainers "
               "among 1..{} (0: none), and one trainer must stay\n",
               late, leaves, trainers);
    return 2;
  }
  // --listen-address is the one network setting of every listener (PIPE,
  // the trainers' Gloo group): SWITCHBOARD_IFNAME. Set while this process
  // has one thread.
  if (!flags.listen_address.empty()) {
    ::setenv("SWITCHBOARD_IFNAME", flags.listen_address.c_str(), /*overwrite=*/1);
  }
  try {
    return *rank == 0 ? run_ps(flags, *world_size)
                      : run_trainer(flags, *rank, *world_size);
  } catch (const std::exception& e) {
    say(role_name(*rank), "failed: {}", e.what());
    if (switchboard::rpc::RpcContext::global().initialized()) {
      switchboard::rpc::shutdown(/*graceful=*/false);
    }
    return 1;
  }
}
