// Starting the launcher's children (the store server and the workers).
//
// Each child runs in its own process group (its pid is the group id), so a
// terminal's Ctrl-C reaches only the launcher, which forwards it once, and so
// kill(-pid, signal) also reaches whatever the child started itself. Each
// child is killed with SIGKILL when the launcher dies (PR_SET_PDEATHSIG), so
// even `kill -9` of the launcher leaves no orphan.
//
// Thread safety: spawn() forks, so it must be called while the process has
// a single thread (the launcher never starts another). Between fork and exec
// the child makes only async-signal-safe calls.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <string>
#include <vector>

namespace switchboard::launch {

struct SpawnOptions {
  std::string path;               // the executable; no $PATH search here
  std::vector<std::string> argv;  // argv[0] included
  std::vector<std::string> env;   // the whole environment, "NAME=VALUE"
  std::string workdir;            // chdir() here before exec; empty: stay
  // Descriptors to install as the child's stdin/stdout/stderr; -1 inherits
  // ours. They may be close-on-exec: the child's copies are not.
  int stdin_fd = -1;
  int stdout_fd = -1;
  int stderr_fd = -1;
  sigset_t signal_mask;  // the child's signal mask (ours is mostly blocked)
};

struct Spawned {
  pid_t pid = -1;
  // 0 once the child has exec'd; else the errno of its failed chdir()/exec
  // (it then exited 127 without running anything, and spawn() reaped it).
  int exec_error = 0;
};

// Starts `options.path` as described above, with SIGPIPE back at its default
// action (the launcher ignores it). Returns once the child has exec'd or
// failed to. Throws std::system_error when fork() or pipe() fails.
Spawned spawn(const SpawnOptions& options);

// Our environment without the variables named in `overrides` (by their
// "NAME=" part), followed by `overrides`. An entry without '=' ("NAME")
// only removes NAME.
std::vector<std::string> environment_with(const std::vector<std::string>& overrides);

}  // namespace switchboard::launch
