// The store server a launcher runs (supervisor.h, steps 2 and 5): started
// as `STORE_SERVER --host ADDR --port PORT --quiet`, its port read from the
// "port=N" line it prints, its output passed on prefixed "[store] ", and
// stopped last (SIGTERM, then SIGKILL after the stop timeout). Internal to
// //launch.
//
// Ownership: owns the child (its process group) and the pipes of its
// output; the destructor SIGKILLs and reaps a child still running (the
// launcher threw) and closes what is left.
// Errors: start() returns the exec error; std::system_error when pipe2()
// or poll() fails.
// Thread safety: none; the launcher's own thread.
#pragma once

#include <signal.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "launch/child.h"
#include "launch/line_relay.h"
#include "launch/options.h"

namespace switchboard::launch {

class StoreServerProcess {
 public:
  using Clock = std::chrono::steady_clock;

  StoreServerProcess() = default;
  StoreServerProcess(const StoreServerProcess&) = delete;
  StoreServerProcess& operator=(const StoreServerProcess&) = delete;
  ~StoreServerProcess();

  // Starts options.store_server on options.master_addr and master_port
  // with `secret_variable` in its environment, stdin from `stdin_fd`, and
  // `signal_mask` as its signal mask. Its stderr goes through a relay when
  // options.prefix_output (else to the launcher's). Returns 0, or the errno
  // of its exec (then nothing runs).
  int start(const LaunchOptions& options, const std::string& secret_variable,
            int stdin_fd, const sigset_t& signal_mask);

  enum class PortWait {
    kReady,     // port() is set
    kStopping,  // on_signals() said to stop
    kTimedOut,  // no "port=N" within `timeout`
  };
  // Reads its stdout until a "port=N" line, passing on its stderr
  // meanwhile; polls `signal_fd` too, calling on_signals() when it is
  // readable, which returns false once the launcher stops. Its stdout
  // closing (the server exited: SIGCHLD says why) does not end the wait.
  // Afterwards its stdout goes through a relay like its stderr.
  PortWait wait_for_port(int signal_fd, const std::function<bool()>& on_signals,
                         std::chrono::milliseconds timeout);

  uint16_t port() const { return port_; }
  pid_t pid() const { return child_.pid; }
  bool running() const { return child_.running; }
  // It was reaped.
  void exited() { child_.running = false; }
  // terminate() or kill() has been sent: its exit is expected.
  bool signaled() const { return signaled_; }

  // SIGTERM to its process group (once), SIGKILL at on_deadline() after
  // `stop_timeout`.
  void terminate(std::chrono::milliseconds stop_timeout);
  // SIGKILL to its process group now.
  void kill();
  // When on_deadline() must next run, if at all.
  std::optional<Clock::time_point> deadline() const { return kill_at_; }
  // SIGKILL (saying so) when terminate()'s stop timeout has passed.
  void on_deadline(Clock::time_point now, std::chrono::milliseconds stop_timeout);

  // Its output relays ("[store] "), for the launcher's poll loop.
  std::vector<LineRelay>& relays() { return relays_; }
  const std::vector<LineRelay>& relays() const { return relays_; }

 private:
  // Reads once from stdout; sets port_ from a complete "port=N" line.
  // Returns false at EOF.
  bool read_port_lines();

  Child child_{"store server"};
  int stdout_ = -1;      // until the port is read; then a relay owns it
  std::string pending_;  // stdout read but not yet a whole line
  uint16_t port_ = 0;
  bool signaled_ = false;
  std::optional<Clock::time_point> kill_at_;
  std::vector<LineRelay> relays_;  // stderr (prefix_output), then stdout
};

}  // namespace switchboard::launch
