#include "launch/child.h"

#include <fmt/format.h>
#include <string.h>
#include <sys/wait.h>

namespace switchboard::launch {

std::string signal_name(int signo) {
  const char* abbrev = ::sigabbrev_np(signo);
  return abbrev ? fmt::format("SIG{} ({})", abbrev, signo) : fmt::format("{}", signo);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return fmt::format("killed by signal {}{}", signal_name(WTERMSIG(status)),
                       WCOREDUMP(status) ? " (core dumped)" : "");
  }
  return fmt::format("ended with wait status {:#x}", status);
}

bool failed(int status) { return !WIFEXITED(status) || WEXITSTATUS(status) != 0; }

std::string seconds(std::chrono::milliseconds duration) {
  return fmt::format("{:g} s", static_cast<double>(duration.count()) / 1000);
}

}  // namespace switchboard::launch
