// Child processes for multi-process tests.
//
// A test binary runs children by re-executing itself: spawn_child("name",
// args) starts /proc/self/exe --sb-child name args..., and the test main
// dispatches to the function registered with SB_CHILD_MAIN(name). Children
// never inherit the parent's threads or locks (no bare fork()).
//
// Subprocess is not thread-safe; one thread owns it. Destroying a running
// Subprocess kills it (SIGKILL) and reaps it, so no test leaks processes.
// Reads have a guard timeout so a broken test fails instead of hanging.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace sbtest {

using ChildMain = int (*)(const std::vector<std::string>& args);

// Registers a child entry point; returns true (for static initialization).
bool register_child(const char* name, ChildMain main);

// Runs the child named in argv when argv is "--sb-child NAME ...".
// Returns -1 when argv is not a child invocation, else the exit code.
int maybe_run_child(int argc, char** argv);

class Subprocess {
 public:
  // Starts argv[0] (looked up in PATH when it has no '/') with stdout piped
  // to this object (stderr is inherited, so it lands in the test log).
  explicit Subprocess(const std::vector<std::string>& argv);
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&&) = delete;
  ~Subprocess();

  // Reads one line of the child's stdout, without the newline. Throws
  // std::runtime_error on EOF or after `guard` without a full line.
  std::string read_line(std::chrono::seconds guard = std::chrono::seconds(120));
  // Reads stdout until EOF.
  std::string read_all(std::chrono::seconds guard = std::chrono::seconds(120));
  // Waits for exit; returns the exit code, or 128 + signal number.
  int wait();
  void kill(int signal);
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string buffer_;
  bool reaped_ = false;
  int status_ = 0;
};

// Starts this test binary as the child registered under `name`.
Subprocess spawn_child(const std::string& name,
                       const std::vector<std::string>& args = {});

// Path of a runfile (a data dependency), e.g. "tests/store/torch_store_client.py";
// the path itself when not run by Bazel (no TEST_SRCDIR).
std::string runfile(const std::string& path);

}  // namespace sbtest

#define SB_CHILD_MAIN(name)                                               \
  static int sb_child_##name(const std::vector<std::string>& args);      \
  static const bool sb_child_registered_##name =                         \
      ::sbtest::register_child(#name, sb_child_##name);                  \
  static int sb_child_##name(const std::vector<std::string>& args)
