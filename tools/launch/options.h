// Command line of the launcher: its options, their flags (CLI11, through
// //tools/cli) and where the store server binary is found.
//
// Thread safety: plain functions over values; nothing is shared.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI

namespace switchboard::launch {

struct LaunchOptions {
  int nproc = 0;                          // workers to start (>= 1)
  std::string master_addr = "127.0.0.1";  // where the store server listens
  uint16_t master_port = 0;               // 0: the store server picks one
  std::string store_server;               // empty: find_store_server()
  // How long stopped workers (and the store server) get between the first
  // signal and SIGKILL.
  std::chrono::milliseconds stop_timeout{5000};
  bool prefix_output = true;         // "[rank N] " before each output line
  std::vector<std::string> command;  // the worker program and its arguments
};

// Declares the launcher's flags on `app` (its name, help and checks) and
// where they go: *options, which must outlive the app. Flags take
// "--flag VALUE" or "--flag=VALUE"; "--" or the first argument that is not a
// flag starts the worker command, which is kept as given. Parsing then fails
// (cli::parse()'s error) on an unknown flag, a value out of range (naming the
// flag and the value), a missing --nproc or a missing program.
void add_launch_flags(CLI::App& app, LaunchOptions* options);

// The store server binary to start when --store-server is not given:
// $SWITCHBOARD_STORE_SERVER, else tools/store_server/store_server in the
// runfiles of this binary ($RUNFILES_DIR, <argv0>.runfiles, or
// <real path>.runfiles), else beside it in bazel-bin
// (<dir>/../store_server/store_server) or in its own folder. Returns an
// absolute path when it can. Throws std::runtime_error listing what was
// tried when nothing is executable.
std::string find_store_server(const std::string& argv0);

// Resolves a program name the way execvp() would: a name with a '/' is
// returned as is; otherwise the first executable file of that name in $PATH,
// or the bare name (which then fails to execute) when there is none.
std::string resolve_program(const std::string& name);

}  // namespace switchboard::launch
