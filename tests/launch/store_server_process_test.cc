// The store server a launcher runs (launch/store_server_process.h), with
// shell scripts standing in for it: its port read from the line it prints
// whatever the writes, a wait that ends on the launcher's signals or at the
// timeout, an exec error returned, and its stop.
#include "launch/store_server_process.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>

using switchboard::launch::LaunchOptions;
using switchboard::launch::StoreServerProcess;
using PortWait = StoreServerProcess::PortWait;
using namespace std::chrono_literals;

namespace {

// A fake store server: `body` as a shell script in a folder of its own.
class FakeServer {
 public:
  explicit FakeServer(const std::string& body) {
    const char* base = std::getenv("TEST_TMPDIR");
    dir_ = fmt::format("{}/store_server_process_test.XXXXXX", base ? base : "/tmp");
    REQUIRE(::mkdtemp(dir_.data()) != nullptr);
    path_ = dir_ + "/store_server";
    std::ofstream(path_) << "#!/bin/sh\n" << body << "\n";
    REQUIRE(::chmod(path_.c_str(), 0700) == 0);
  }
  ~FakeServer() {
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string dir_;
  std::string path_;
};

LaunchOptions options_for(const std::string& server) {
  LaunchOptions options;
  options.store_server = server;
  options.master_addr = "127.0.0.1";
  options.prefix_output = true;
  return options;
}

sigset_t current_mask() {
  sigset_t mask;
  ::sigprocmask(SIG_SETMASK, nullptr, &mask);
  return mask;
}

// Starts `fake` as the store server; true once it runs.
bool start(StoreServerProcess& server, const FakeServer& fake) {
  return server.start(options_for(fake.path()), "SWITCHBOARD_SECRET_FILE", -1,
                      current_mask()) == 0 &&
         server.running();
}

// Waits for the server's exit; its wait status.
int reap(StoreServerProcess& server) {
  int status = 0;
  while (::waitpid(server.pid(), &status, 0) < 0 && errno == EINTR) {
  }
  server.exited();
  return status;
}

// A pipe that stands in for the launcher's signalfd.
struct SignalPipe {
  SignalPipe() { REQUIRE(::pipe2(fds, O_CLOEXEC) == 0); }
  ~SignalPipe() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  int fds[2];
};

}  // namespace

TEST_CASE("the port is read from the server's line, across writes and after other lines",
          "[launch][store_server]") {
  // Invalid ports are not taken; the line may come in pieces.
  FakeServer fake(
      "echo starting; printf 'port=0\\nport=70000\\npo'; sleep 0.01; printf 'rt=43'; "
      "printf '21\\nport=99\\n'; exec sleep 1000");
  StoreServerProcess server;
  REQUIRE(start(server, fake));
  SignalPipe signals;
  int calls = 0;
  auto on_signals = [&] {
    ++calls;
    return true;
  };
  REQUIRE(server.wait_for_port(signals.fds[0], on_signals, 60s) == PortWait::kReady);
  CHECK(server.port() == 4321);
  CHECK(calls == 0);
  // Its stderr and (now) its stdout go through relays.
  CHECK(server.relays().size() == 2);

  server.terminate(5s);
  CHECK(server.signaled());
  REQUIRE(server.deadline().has_value());
  const int status = reap(server);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGTERM);
  CHECK_FALSE(server.running());
  // Nothing left to kill once it is reaped.
  server.on_deadline(*server.deadline(), 5s);
  CHECK_FALSE(server.deadline().has_value());
}

TEST_CASE("the wait for the port ends when the launcher's signals say stop",
          "[launch][store_server]") {
  FakeServer fake("exec sleep 1000");
  StoreServerProcess server;
  REQUIRE(start(server, fake));
  SignalPipe signals;
  REQUIRE(::write(signals.fds[1], "x", 1) == 1);
  int calls = 0;
  auto on_signals = [&] {
    ++calls;
    return false;
  };
  CHECK(server.wait_for_port(signals.fds[0], on_signals, 60s) == PortWait::kStopping);
  CHECK(calls == 1);
  CHECK(server.port() == 0);
  // The destructor kills and reaps a server still running.
}

TEST_CASE("a server that exits without a port leaves the wait to its timeout",
          "[launch][store_server]") {
  FakeServer fake("echo no port here; exit 3");
  StoreServerProcess server;
  REQUIRE(start(server, fake));
  SignalPipe signals;
  auto on_signals = [] { return true; };
  CHECK(server.wait_for_port(signals.fds[0], on_signals, 200ms) == PortWait::kTimedOut);
  CHECK(server.port() == 0);
  const int status = reap(server);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 3);
}

TEST_CASE("a store server that cannot be executed is an exec error, and nothing runs",
          "[launch][store_server]") {
  StoreServerProcess server;
  CHECK(server.start(options_for("/nonexistent/store_server"), "SWITCHBOARD_SECRET_FILE",
                     -1, current_mask()) == ENOENT);
  CHECK_FALSE(server.running());
}

TEST_CASE("kill() sends SIGKILL now and cancels the deadline", "[launch][store_server]") {
  FakeServer fake("trap '' TERM; echo port=1234; while :; do sleep 1; done");
  StoreServerProcess server;
  REQUIRE(start(server, fake));
  SignalPipe signals;
  auto on_signals = [] { return true; };
  REQUIRE(server.wait_for_port(signals.fds[0], on_signals, 60s) == PortWait::kReady);
  server.terminate(60s);
  server.kill();
  CHECK_FALSE(server.deadline().has_value());
  const int status = reap(server);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
}
