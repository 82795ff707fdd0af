#include "tests/util/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

extern char** environ;

namespace sbtest {
namespace {

std::map<std::string, ChildMain>& children() {
  static std::map<std::string, ChildMain> registry;
  return registry;
}

}  // namespace

bool register_child(const char* name, ChildMain main) {
  children()[name] = main;
  return true;
}

int maybe_run_child(int argc, char** argv) {
  if (argc < 3 || std::strcmp(argv[1], "--sb-child") != 0) return -1;
  auto it = children().find(argv[2]);
  if (it == children().end()) {
    fmt::print(stderr, "no child entry point named {}\n", argv[2]);
    return 99;
  }
  std::vector<std::string> args(argv + 3, argv + argc);
  try {
    return it->second(args);
  } catch (const std::exception& e) {
    fmt::print(stderr, "child {} threw: {}\n", argv[2], e.what());
    return 98;
  }
}

Subprocess::Subprocess(const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  std::vector<char*> args;
  for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  int rc = posix_spawnp(&pid_, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    throw std::runtime_error(fmt::format("spawn {} failed: {}", argv[0], strerror(rc)));
  }
  stdout_fd_ = fds[0];
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      stdout_fd_(std::exchange(other.stdout_fd_, -1)),
      buffer_(std::move(other.buffer_)),
      reaped_(other.reaped_),
      status_(other.status_) {}

Subprocess::~Subprocess() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    wait();
  }
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

std::string Subprocess::read_line(std::chrono::seconds guard) {
  auto deadline = std::chrono::steady_clock::now() + guard;
  for (;;) {
    auto newline = buffer_.find('\n');
    if (newline != std::string::npos) {
      std::string line = buffer_.substr(0, newline);
      buffer_.erase(0, newline + 1);
      return line;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd pfd{stdout_fd_, POLLIN, 0};
    if (left.count() <= 0 || poll(&pfd, 1, static_cast<int>(left.count())) == 0) {
      throw std::runtime_error(fmt::format(
          "child {}: no line on stdout within {} s (have \"{}\")", pid_,
          guard.count(), buffer_));
    }
    char chunk[4096];
    ssize_t n = read(stdout_fd_, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw std::runtime_error(fmt::format(
          "child {}: stdout closed before a full line (have \"{}\")", pid_, buffer_));
    }
    buffer_.append(chunk, static_cast<size_t>(n));
  }
}

std::string Subprocess::read_all(std::chrono::seconds guard) {
  auto deadline = std::chrono::steady_clock::now() + guard;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd pfd{stdout_fd_, POLLIN, 0};
    if (left.count() <= 0 || poll(&pfd, 1, static_cast<int>(left.count())) == 0) {
      throw std::runtime_error(fmt::format("child {}: stdout not closed within {} s",
                                           pid_, guard.count()));
    }
    char chunk[4096];
    ssize_t n = read(stdout_fd_, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::exchange(buffer_, {});
    buffer_.append(chunk, static_cast<size_t>(n));
  }
}

int Subprocess::wait() {
  if (!reaped_) {
    while (waitpid(pid_, &status_, 0) < 0 && errno == EINTR) {
    }
    reaped_ = true;
  }
  if (WIFEXITED(status_)) return WEXITSTATUS(status_);
  if (WIFSIGNALED(status_)) return 128 + WTERMSIG(status_);
  return -1;
}

void Subprocess::kill(int signal) {
  if (!reaped_) ::kill(pid_, signal);
}

Subprocess spawn_child(const std::string& name, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"/proc/self/exe", "--sb-child", name};
  argv.insert(argv.end(), args.begin(), args.end());
  return Subprocess(argv);
}

std::string runfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return path;  // run from the source tree
  return fmt::format("{}/{}/{}", srcdir, workspace ? workspace : "switchboard", path);
}

}  // namespace sbtest
