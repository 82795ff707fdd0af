#include "tools/bench/process.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>
#include <stdexcept>

extern char** environ;

namespace switchboard::bench {

namespace {

using Clock = std::chrono::steady_clock;

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Describes a wait() status: "exit 1" or "signal 9".
std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exit {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("signal {}", WTERMSIG(status));
  return fmt::format("status {}", status);
}

// Children still running, for the signal handler below (lock-free atomics
// are async-signal-safe). 0 marks a free slot.
std::atomic<pid_t> g_children[16];

// SIGINT/SIGTERM/SIGHUP: stop the children too, then die of the signal.
void stop_children_and_die(int signo) {
  for (auto& child : g_children) {
    if (pid_t pid = child.load(); pid > 0) ::kill(pid, SIGTERM);
  }
  ::signal(signo, SIG_DFL);
  ::raise(signo);
}

void track_child(pid_t pid) {
  static std::once_flag installed;
  std::call_once(installed, [] {
    for (int signo : {SIGINT, SIGTERM, SIGHUP}) ::signal(signo, stop_children_and_die);
  });
  for (auto& child : g_children) {
    pid_t free_slot = 0;
    if (child.compare_exchange_strong(free_slot, pid)) return;
  }
}

void untrack_child(pid_t pid) {
  for (auto& child : g_children) {
    pid_t mine = pid;
    child.compare_exchange_strong(mine, 0);
  }
}

}  // namespace

std::string find_runfile(const std::string& argv0, const std::string& runfile,
                         const char* env_override) {
  if (const char* path = std::getenv(env_override)) return path;
  std::vector<std::string> candidates;
  if (const char* dir = std::getenv("RUNFILES_DIR")) {
    candidates.push_back(fmt::format("{}/switchboard/{}", dir, runfile));
  }
  candidates.push_back(fmt::format("{}.runfiles/switchboard/{}", argv0, runfile));
  candidates.push_back(runfile);
  for (const auto& path : candidates) {
    if (::access(path.c_str(), R_OK) == 0) return path;
  }
  throw std::runtime_error(fmt::format(
      "cannot find {} (tried {}); run under `bazel run` or set {}", runfile,
      fmt::join(candidates, ", "), env_override));
}

std::string torch_python() {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  const std::string argv0 = n > 0 ? std::string(self, static_cast<size_t>(n)) : "bench";
  return find_runfile(argv0, "external/sb_venv/python", "SB_PYTHON");
}

std::string python_package() {
  if (const char* dir = std::getenv("SB_TORCH_RPC_PACKAGE")) return dir;
  if (const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY")) {
    return std::string(workspace) + "/bazel-bin/python/pkg";
  }
  return "bazel-bin/python/pkg";
}

ChildProcess::ChildProcess(const std::vector<std::string>& argv) : name_(argv.at(0)) {
  int in[2];
  int out[2];
  // Close-on-exec, so no child inherits another child's pipes (a stray copy
  // of a stdin pipe would keep that child alive).
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) {
    throw std::runtime_error(fmt::format("pipe for {}: {}", name_, std::strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  std::vector<char*> args;
  for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  int rc = ::posix_spawn(&pid_, name_.c_str(), &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(in[0]);
  ::close(out[1]);
  stdin_fd_ = in[1];
  stdout_fd_ = out[0];
  if (rc != 0) {
    pid_ = -1;
    close_fd(stdin_fd_);
    close_fd(stdout_fd_);
    throw std::runtime_error(fmt::format("cannot start {}: {}", name_, std::strerror(rc)));
  }
  track_child(pid_);
}

ChildProcess::~ChildProcess() { stop(); }

uint16_t ChildProcess::read_port(std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  for (;;) {
    for (size_t eol; (eol = pending_.find('\n')) != std::string::npos;) {
      std::string line = pending_.substr(0, eol);
      pending_.erase(0, eol + 1);
      if (line.rfind("port=", 0) == 0) return static_cast<uint16_t>(std::stoi(line.substr(5)));
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd readable{stdout_fd_, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&readable, 1, static_cast<int>(left.count())) == 0) {
      throw std::runtime_error(fmt::format("{} printed no port=N within {} ms", name_,
                                           timeout.count()));
    }
    char chunk[256];
    ssize_t n = ::read(stdout_fd_, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw std::runtime_error(fmt::format("{} exited before printing port=N", name_));
    }
    pending_.append(chunk, static_cast<size_t>(n));
  }
}

double ChildProcess::cpu_seconds() const {
  if (pid_ < 0) return 0;
  std::ifstream file(fmt::format("/proc/{}/stat", pid_));
  std::string stat((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  // Fields after the ")" that ends the command name: state is field 3,
  // utime and stime are fields 14 and 15.
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 13; ++i) fields >> field;  // skip state .. cmajflt
  fields >> utime >> stime;
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

void ChildProcess::stop() {
  if (pid_ < 0) return;
  int status = 0;
  bool exited = ::waitpid(pid_, &status, WNOHANG) == pid_;
  if (exited) {
    fmt::print(stderr, "# warning: {} had already exited ({})\n", name_,
               describe_status(status));
  } else {
    close_fd(stdin_fd_);
    ::kill(pid_, SIGTERM);
    ::waitpid(pid_, &status, 0);
  }
  untrack_child(pid_);
  close_fd(stdin_fd_);
  close_fd(stdout_fd_);
  pid_ = -1;
}

int run_inheriting_output(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::fflush(stdout);
  pid_t pid = -1;
  if (const int rc = posix_spawn(&pid, argv.at(0).c_str(), nullptr, nullptr, args.data(),
                                 environ);
      rc != 0) {
    throw std::runtime_error(
        fmt::format("cannot start {}: {}", argv.at(0), std::strerror(rc)));
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

bool has_exited(pid_t pid) {
  std::ifstream file(fmt::format("/proc/{}/stat", pid));
  std::string stat;
  if (!std::getline(file, stat)) return true;
  size_t paren = stat.rfind(')');
  return paren + 2 < stat.size() && stat[paren + 2] == 'Z';
}

void wait_for_stdin_eof() {
  char buffer[64];
  while (::read(STDIN_FILENO, buffer, sizeof buffer) > 0) {
  }
}

}  // namespace switchboard::bench
