#include "launch/store_server_process.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <system_error>
#include <utility>

#include "launch/spawn.h"

namespace switchboard::launch {

namespace {

[[noreturn]] void throw_errno(const char* what) {
  throw std::system_error(errno, std::generic_category(), what);
}

}  // namespace

StoreServerProcess::~StoreServerProcess() {
  if (child_.running) {
    ::kill(-child_.pid, SIGKILL);
    while (::waitpid(child_.pid, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  relays_.clear();
  if (stdout_ >= 0) ::close(stdout_);
}

int StoreServerProcess::start(const LaunchOptions& options,
                              const std::string& secret_variable, int stdin_fd,
                              const sigset_t& signal_mask) {
  int out[2];
  int err[2] = {-1, -1};
  if (::pipe2(out, O_CLOEXEC) != 0) throw_errno("pipe2");
  if (options.prefix_output && ::pipe2(err, O_CLOEXEC) != 0) throw_errno("pipe2");
  SpawnOptions spawn_options;
  spawn_options.path = options.store_server;
  spawn_options.argv = {options.store_server,
                        "--host",
                        options.master_addr,
                        "--port",
                        std::to_string(options.master_port),
                        "--quiet"};
  spawn_options.env = environment_with({secret_variable});
  spawn_options.stdin_fd = stdin_fd;
  spawn_options.stdout_fd = out[1];
  spawn_options.stderr_fd = err[1];
  spawn_options.signal_mask = signal_mask;
  Spawned spawned = spawn(spawn_options);
  ::close(out[1]);
  stdout_ = out[0];
  if (err[1] >= 0) {
    ::close(err[1]);
    relays_.emplace_back(err[0], STDERR_FILENO, "[store] ");
  }
  child_.pid = spawned.pid;
  child_.running = spawned.exec_error == 0;
  return spawned.exec_error;
}

StoreServerProcess::PortWait StoreServerProcess::wait_for_port(
    int signal_fd, const std::function<bool()>& on_signals,
    std::chrono::milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  PortWait result = PortWait::kReady;
  while (port_ == 0) {
    auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      result = PortWait::kTimedOut;
      break;
    }
    // The stderr relay (if any) is polled too, so the server never blocks
    // on a full pipe.
    LineRelay* err_relay = relays_.empty() || !relays_[0].open() ? nullptr : &relays_[0];
    pollfd fds[3] = {{signal_fd, POLLIN, 0},
                     {err_relay ? err_relay->source() : -1, POLLIN, 0},
                     {stdout_, POLLIN, 0}};
    int rc = ::poll(fds, 3, static_cast<int>(left));
    if (rc < 0 && errno != EINTR) throw_errno("poll");
    if (fds[1].revents != 0) err_relay->read_some();
    if (fds[2].revents != 0 && !read_port_lines()) {
      ::close(stdout_);  // EOF: its exit (SIGCHLD) will tell why
      stdout_ = -1;
    }
    if (fds[0].revents != 0 && !on_signals()) {
      result = PortWait::kStopping;
      break;
    }
  }
  if (stdout_ >= 0) {
    relays_.emplace_back(std::exchange(stdout_, -1), STDERR_FILENO, "[store] ",
                         std::move(pending_));
  }
  return result;
}

bool StoreServerProcess::read_port_lines() {
  char chunk[4096];
  ssize_t n = ::read(stdout_, chunk, sizeof chunk);
  if (n < 0 && errno == EINTR) return true;
  if (n <= 0) return false;
  pending_.append(chunk, static_cast<size_t>(n));
  for (size_t eol; port_ == 0 && (eol = pending_.find('\n')) != std::string::npos;) {
    std::string line = pending_.substr(0, eol);
    pending_.erase(0, eol + 1);
    int port = 0;
    if (std::sscanf(line.c_str(), "port=%d", &port) == 1 && port > 0 && port < 65536) {
      port_ = static_cast<uint16_t>(port);
    }
  }
  return true;
}

void StoreServerProcess::terminate(std::chrono::milliseconds stop_timeout) {
  if (!child_.running || signaled_) return;
  signaled_ = true;
  ::kill(-child_.pid, SIGTERM);
  kill_at_ = Clock::now() + stop_timeout;
}

void StoreServerProcess::kill() {
  if (child_.running) ::kill(-child_.pid, SIGKILL);
  signaled_ = true;
  kill_at_.reset();
}

void StoreServerProcess::on_deadline(Clock::time_point now,
                                     std::chrono::milliseconds stop_timeout) {
  if (!kill_at_ || now < *kill_at_) return;
  kill_at_.reset();
  if (!child_.running) return;
  fmt::print(stderr, "launch: store server still running after {}; sending SIGKILL\n",
             seconds(stop_timeout));
  ::kill(-child_.pid, SIGKILL);
}

}  // namespace switchboard::launch
