// launch: starts a store server and N local workers with torchrun's
// environment, and supervises them; only main() is here, the supervisor is
// //launch (launch/supervisor.h).
//
//   launch --nproc N [--max-restarts R] [--master-addr ADDR] [--master-port P]
//          [--store-server PATH] [--timeout-stop S] [--no-prefix] [--] PROGRAM [ARGS...]
//   launch --nnodes N --node-rank R --nproc-per-node P --master-addr ADDR
//          --master-port PORT [--max-restarts R] [--store tcp://HOST:PORT]
//          [--join-timeout S] [--job-id ID] [--] PROGRAM [ARGS...]  (one per node)
//
// `launch --help` (launch/options.cc) and launch/supervisor.h say what it
// does. Under `bazel run`, relative paths (the program, --store-server) are
// taken from where the command was typed ($BUILD_WORKING_DIRECTORY), and the
// workers run there.
//
// Exit status: 0 every worker of one attempt exited 0; 1 a worker (in the
// last attempt), a node or the store server failed; 2 usage error; 128+S
// stopped by signal S.
#include <fmt/format.h>

#include <cstdlib>
#include <exception>
#include <string>

#include "common/cli.h"
#include "common/logging.h"
#include "launch/options.h"
#include "launch/supervisor.h"

int main(int argc, char** argv) {
  using namespace switchboard::launch;
  switchboard::init_logging("launch");
  LaunchOptions options;
  CLI::App app;
  add_launch_flags(app, &options);
  if (auto status =
          switchboard::cli::report(app, switchboard::cli::parse(app, argc, argv))) {
    return *status;
  }
  try {
    std::string& store_server = options.store_server;
    const char* user_dir = std::getenv("BUILD_WORKING_DIRECTORY");  // bazel run
    // Only the node that runs the store server needs its binary.
    const bool runs_store = options.store.empty() && options.node_rank == 0;
    if (!runs_store) {
      store_server.clear();
    } else if (store_server.empty()) {
      store_server = find_store_server(argc > 0 ? argv[0] : "launch");
    } else if (user_dir != nullptr && store_server[0] != '/') {
      store_server = fmt::format("{}/{}", user_dir, store_server);
    }
    return run_launcher(options);
  } catch (const std::exception& e) {
    fmt::print(stderr, "launch: {}\n", e.what());
    return 1;
  }
}
