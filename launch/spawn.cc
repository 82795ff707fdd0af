#include "launch/spawn.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <string_view>
#include <system_error>

extern char** environ;

namespace switchboard::launch {

namespace {

constexpr int kExecFailedStatus = 127;  // what shells exit with, too

std::vector<char*> c_strings(const std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (const auto& s : strings) pointers.push_back(const_cast<char*>(s.c_str()));
  pointers.push_back(nullptr);
  return pointers;
}

// In the child: reports errno through `error_fd` and exits.
[[noreturn]] void fail_in_child(int error_fd, int error) {
  while (::write(error_fd, &error, sizeof error) < 0 && errno == EINTR) {
  }
  ::_exit(kExecFailedStatus);
}

// In the child: makes `fd` the descriptor `target`, kept open across exec.
void install_fd(int fd, int target, int error_fd) {
  if (fd < 0) return;
  int rc = fd == target ? ::fcntl(fd, F_SETFD, 0) : ::dup2(fd, target);
  if (rc < 0) fail_in_child(error_fd, errno);
}

// In the child, after fork(): only async-signal-safe calls from here on.
[[noreturn]] void exec_child(const SpawnOptions& options, char* const* argv,
                             char* const* envp, pid_t parent, int error_fd) {
  ::setpgid(0, 0);
  // Die with the launcher. If it died before the prctl, we were already
  // reparented and must not run at all.
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) fail_in_child(error_fd, errno);
  if (::getppid() != parent) ::_exit(kExecFailedStatus);
  struct sigaction default_action = {};
  default_action.sa_handler = SIG_DFL;
  ::sigaction(SIGPIPE, &default_action, nullptr);
  install_fd(options.stdin_fd, STDIN_FILENO, error_fd);
  install_fd(options.stdout_fd, STDOUT_FILENO, error_fd);
  install_fd(options.stderr_fd, STDERR_FILENO, error_fd);
  if (!options.workdir.empty() && ::chdir(options.workdir.c_str()) != 0) {
    fail_in_child(error_fd, errno);
  }
  ::sigprocmask(SIG_SETMASK, &options.signal_mask, nullptr);
  ::execve(options.path.c_str(), argv, envp);
  fail_in_child(error_fd, errno);
}

// In the parent: the child's exec errno from the error pipe, 0 when the
// pipe closed without one (exec succeeded and closed it).
int read_exec_error(int fd) {
  int error = 0;
  ssize_t n;
  while ((n = ::read(fd, &error, sizeof error)) < 0 && errno == EINTR) {
  }
  return n == static_cast<ssize_t>(sizeof error) ? error : 0;
}

}  // namespace

Spawned spawn(const SpawnOptions& options) {
  // Everything the child needs is built before fork(): it must not allocate.
  std::vector<char*> argv = c_strings(options.argv);
  std::vector<char*> envp = c_strings(options.env);
  int error_pipe[2];
  if (::pipe2(error_pipe, O_CLOEXEC) != 0) {
    throw std::system_error(errno, std::generic_category(), "pipe2");
  }
  pid_t parent = ::getpid();
  Spawned spawned;
  spawned.pid = ::fork();
  if (spawned.pid == 0) {
    ::close(error_pipe[0]);
    exec_child(options, argv.data(), envp.data(), parent, error_pipe[1]);
  }
  int fork_errno = errno;
  ::close(error_pipe[1]);
  if (spawned.pid < 0) {
    ::close(error_pipe[0]);
    throw std::system_error(fork_errno, std::generic_category(), "fork");
  }
  // Also here, so that kill(-pid) works even before the child gets to it
  // (it fails harmlessly once the child has exec'd).
  ::setpgid(spawned.pid, spawned.pid);
  spawned.exec_error = read_exec_error(error_pipe[0]);
  ::close(error_pipe[0]);
  if (spawned.exec_error != 0) {  // it has exited or is about to: reap it
    while (::waitpid(spawned.pid, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  return spawned;
}

std::vector<std::string> environment_with(const std::vector<std::string>& overrides) {
  auto overridden = [&](std::string_view entry) {
    for (const auto& o : overrides) {
      const size_t eq = o.find('=');
      const std::string name = eq == std::string::npos ? o + "=" : o.substr(0, eq + 1);
      if (entry.substr(0, name.size()) == name) return true;
    }
    return false;
  };
  std::vector<std::string> env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (!overridden(*entry)) env.emplace_back(*entry);
  }
  for (const auto& o : overrides) {
    if (o.find('=') != std::string::npos) env.push_back(o);
  }
  return env;
}

}  // namespace switchboard::launch
