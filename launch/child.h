// A child process of the launcher (a worker or the store server), and the
// words the launcher's log lines use for how one ended and for durations.
// Internal to //launch.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>

namespace switchboard::launch {

struct Child {
  std::string name;  // "rank 3" or "store server"
  pid_t pid = -1;
  bool running = false;
};

// "SIGTERM (15)", or the number alone for a signal without a name.
std::string signal_name(int signo);

// A wait status in words: "exited with status 3", "killed by signal
// SIGKILL (9)", "killed by signal SIGSEGV (11) (core dumped)".
std::string describe_status(int status);

// Whether a wait status is a failure: a non-zero exit or a signal.
bool failed(int status);

// "5 s", "0.25 s".
std::string seconds(std::chrono::milliseconds duration);

}  // namespace switchboard::launch
