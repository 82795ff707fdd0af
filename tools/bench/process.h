// Helper processes for the benchmarks: servers started with posix_spawn and
// the runfiles that hold them.
//
// Thread safety: a ChildProcess is used from one thread at a time.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace switchboard::bench {

// Finds a data dependency of the bench binary: `env_override` when that
// environment variable is set, else `runfile` (a workspace-relative path such
// as "tools/store_server/store_server") under $RUNFILES_DIR, under
// <argv0>.runfiles/switchboard, or under the current directory (where
// `bazel run` starts us). Throws std::runtime_error listing what was tried.
std::string find_runfile(const std::string& argv0, const std::string& runfile,
                         const char* env_override);

// The Python that runs PyTorch's side of a comparison: the project's
// virtual environment's (@sb_venv//:python, PyTorch 2.11 from PyPI; made by
// tools/setup), or $SB_PYTHON. Throws std::runtime_error as find_runfile().
std::string torch_python();

// The directory that holds the Python package (switchboard/ with _C.so and
// _collective.so): $SB_TORCH_RPC_PACKAGE, else bazel-bin/python/pkg of the
// workspace `bazel run` started us from (or of the current directory).
// It is not a data dependency of the bench: its torch headers do not build
// with the thread-safety build's clang. Build it with `bazel build -c opt
// //python:package`. The result may not exist; callers check.
std::string python_package();

// Runs argv[0] with arguments argv[1..] on our stdin, stdout and stderr and
// waits for it; returns its exit status (128 + the signal that killed it).
// Throws std::runtime_error when it cannot be spawned.
int run_inheriting_output(const std::vector<std::string>& argv);

// True once `pid` (a child of ours) has exited: it is a zombie or gone.
bool has_exited(pid_t pid);

// In a child started as a ChildProcess: blocks until the parent closes our
// stdin (it holds the other end), which is how the parent says "exit".
void wait_for_stdin_eof();

// A child process whose stdin and stdout are pipes to us; stderr is shared.
// Closing stdin is how a child like torch_store_server.py learns to exit, so
// it dies with us even if we crash.
class ChildProcess {
 public:
  // Starts argv[0] with arguments argv[1..]. Throws std::runtime_error when
  // the program cannot be spawned.
  explicit ChildProcess(const std::vector<std::string>& argv);
  // Calls stop().
  ~ChildProcess();

  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Reads the child's stdout until a line "port=N" and returns N. Throws
  // std::runtime_error naming the program when it exits, or `timeout`
  // passes, first.
  uint16_t read_port(std::chrono::milliseconds timeout);

  // Closes stdin, sends SIGTERM and reaps the child. Idempotent.
  void stop();

  // CPU time (user + system, all threads) the child has used so far, from
  // /proc/<pid>/stat (clock-tick resolution); 0 once it has been reaped.
  double cpu_seconds() const;

  pid_t pid() const { return pid_; }

 private:
  std::string name_;
  pid_t pid_ = -1;
  int stdin_fd_ = -1;   // our end of the child's stdin
  int stdout_fd_ = -1;  // our end of the child's stdout
  std::string pending_;  // stdout bytes read but not yet a whole line
};

}  // namespace switchboard::bench
