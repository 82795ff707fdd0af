#include "launch/supervisor.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "common/auth.h"
#include "common/error.h"
#include "launch/job_secret.h"
#include "launch/line_relay.h"
#include "launch/node_link.h"
#include "launch/spawn.h"
#include "store/tcp_store.h"

namespace switchboard::launch {

namespace {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;

constexpr std::chrono::seconds kStorePortTimeout{30};
// How often a launcher of several nodes says it is alive (and node 0 looks).
constexpr std::chrono::seconds kHeartbeatInterval{1};

struct Child {
  std::string name;  // "rank 3" or "store server"
  pid_t pid = -1;
  bool running = false;
};

[[noreturn]] void throw_errno(const char* what) {
  throw std::system_error(errno, std::generic_category(), what);
}

std::string signal_name(int signo) {
  const char* abbrev = ::sigabbrev_np(signo);
  return abbrev ? fmt::format("SIG{} ({})", abbrev, signo) : fmt::format("{}", signo);
}

// "exited with status 3", "killed by signal SIGKILL (9)".
std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return fmt::format("killed by signal {}{}", signal_name(WTERMSIG(status)),
                       WCOREDUMP(status) ? " (core dumped)" : "");
  }
  return fmt::format("ended with wait status {:#x}", status);
}

// "5 s", "0.25 s".
std::string seconds(std::chrono::milliseconds duration) {
  return fmt::format("{:g} s", static_cast<double>(duration.count()) / 1000);
}

bool failed(int status) { return !WIFEXITED(status) || WEXITSTATUS(status) != 0; }

// "tcp://127.0.0.1:29500", "tcp://[::1]:29500".
std::string store_url(const std::string& addr, uint16_t port) {
  if (addr.find(':') != std::string::npos)
    return fmt::format("tcp://[{}]:{}", addr, port);
  return fmt::format("tcp://{}:{}", addr, port);
}

// Where a node is in the current attempt (restart policy, supervisor.h).
enum class AttemptState {
  // Its workers run, or have all exited 0: then, on several nodes, it waits
  // for every node's to have (success) or for the attempt to fail.
  kRunning,
  // The attempt failed with restarts left: its workers are being stopped,
  // then (on several nodes) it waits for every node's to be.
  kRestarting,
  // Every worker of every node exited 0 in this attempt: the job is done.
  kSucceeded,
};

// The attempt running and where this node is in it.
struct Attempt {
  int number = 0;  // 0, 1, ...: TORCHELASTIC_RESTART_COUNT
  AttemptState state = AttemptState::kRunning;
  // Several nodes: what this node has said of the attempt in the store.
  bool reported_stopped = false;
  bool reported_succeeded = false;
};

// Runs one job; see supervisor.h. Owns every child and descriptor it makes.
class Supervisor {
 public:
  explicit Supervisor(const LaunchOptions& options) : options_(options) {}
  ~Supervisor();

  int run();

 private:
  bool multi_node() const { return options_.nnodes > 1; }
  bool hosts_store() const { return options_.store.empty() && options_.node_rank == 0; }
  // Chooses the job secret (job_secret.h); false (exit 2 said) when its
  // file is refused.
  bool prepare_secret();
  // SWITCHBOARD_SECRET_FILE for the children: the job's, or removed.
  std::string secret_variable() const { return secret_->variable(); }
  bool join_nodes();
  bool wait_signals_for(std::chrono::milliseconds timeout);
  void monitor_job(TimePoint now);
  void watch_nodes(TimePoint now);
  void report_failure(const std::string& what);
  void lose_store(const std::exception& error);
  void on_worker_failed(const std::string& what);
  void attempt_failed(const std::string& first);
  bool follow_attempt();
  void start_next_attempt();
  // "node 1: " on several nodes, else "" (log lines of this launcher).
  std::string node_tag() const;
  void setup_signals();
  bool start_store_server();
  bool wait_for_port();
  bool parse_port_lines(std::string* pending);
  void start_workers();
  bool start_worker(int rank, const std::string& path);
  void supervise();

  void read_signals();
  void on_signal(int signo);
  void reap_children();
  void on_child_exit(pid_t pid, int status);
  void begin_stop(int signo, int exit_code);
  void stop_workers(int signo, bool say_so);
  void maybe_stop_store();
  void kill_everything();
  void on_deadlines(TimePoint now);
  void drain_and_close_relays();
  int poll_timeout_ms(TimePoint now) const;
  int running_workers() const;
  // The job has succeeded or is failing: no attempt follows.
  bool job_over() const {
    return stopping_ || attempt_.state == AttemptState::kSucceeded;
  }
  bool done() const;

  const LaunchOptions& options_;
  sigset_t original_mask_{};
  int signal_fd_ = -1;
  int dev_null_ = -1;
  int store_stdout_ = -1;  // until the port is read; then a relay owns it
  Child store_{"store server"};
  std::vector<Child> workers_;
  std::vector<LineRelay> relays_;
  uint16_t port_ = 0;
  bool workers_started_ = false;  // start_workers() ran (attempt 0)
  bool stopping_ = false;  // a failure or a signal is ending the job
  Attempt attempt_;        // the restart policy's
  bool store_signaled_ = false;
  int exit_code_ = 0;
  std::optional<TimePoint> worker_kill_at_;  // SIGKILL the workers then
  std::optional<TimePoint> store_kill_at_;   // SIGKILL the store server then
  std::optional<TimePoint> drain_until_;     // stop waiting for output EOF
  // Multi-node (see NodeLink): null on one node, or once the store is gone.
  std::unique_ptr<NodeLink> link_;
  std::string first_failure_;             // the job's, as recorded in the store
  bool reported_done_ = false;            // the job is over, this node's workers reaped
  bool nodes_done_ = false;               // node 0: every node is (the store may go)
  std::optional<TimePoint> next_monitor_;
  // Node 0: each other node's heartbeat counter as last seen, and when (by
  // this launcher's steady clock) it was first seen at that value.
  std::map<int, std::pair<int64_t, TimePoint>> heartbeats_;
  std::optional<TimePoint> next_heartbeat_;
  std::optional<TimePoint> store_grace_until_;  // node 0 after a failure
  // The job secret and its file (set by prepare_secret()).
  std::unique_ptr<JobSecret> secret_;
};

Supervisor::~Supervisor() {
  // Children are still running only when run() threw.
  auto kill_and_reap = [](const Child& child) {
    if (!child.running) return;
    ::kill(-child.pid, SIGKILL);
    while (::waitpid(child.pid, nullptr, 0) < 0 && errno == EINTR) {
    }
  };
  for (const Child& worker : workers_) kill_and_reap(worker);
  kill_and_reap(store_);
  relays_.clear();
  for (int fd : {signal_fd_, dev_null_, store_stdout_}) {
    if (fd >= 0) ::close(fd);
  }
}

bool Supervisor::prepare_secret() {
  try {
    secret_ = std::make_unique<JobSecret>(options_, hosts_store() && !multi_node());
  } catch (const std::invalid_argument& e) {
    fmt::print(stderr, "launch: {}\n", e.what());
    exit_code_ = 2;
    return false;
  }
  return true;
}

int Supervisor::run() {
  if (!prepare_secret()) return exit_code_;
  setup_signals();
  bool ready = true;
  if (hosts_store()) {
    ready = start_store_server() && wait_for_port();
  } else {
    port_ = options_.master_port;
  }
  if (ready && multi_node()) ready = join_nodes();
  if (ready) start_workers();
  supervise();
  if (!first_failure_.empty()) {
    fmt::print(stderr, "launch: node {}: the job failed; first failure: {}\n",
               options_.node_rank, first_failure_);
  }
  return exit_code_;
}

// Waits up to `timeout` for a signal (handled); false once the job is
// stopping.
bool Supervisor::wait_signals_for(std::chrono::milliseconds timeout) {
  pollfd fd{signal_fd_, POLLIN, 0};
  const int rc = ::poll(&fd, 1, static_cast<int>(timeout.count()));
  if (rc < 0 && errno != EINTR) throw_errno("poll");
  if (rc > 0) read_signals();
  return !stopping_;
}

// Connects to the job's store and waits until every node's launcher has
// announced itself, --join-timeout at most; false (the job stopping) on a
// timeout, a failure recorded by another node, or a signal.
bool Supervisor::join_nodes() {
  const TimePoint deadline = Clock::now() + options_.join_timeout;
  const std::string at = fmt::format("{}:{}", options_.master_addr, port_);
  std::string last_error;
  while (!link_) {
    try {
      link_ = std::make_unique<NodeLink>(options_, port_, secret_->secret());
    } catch (const AuthenticationError& e) {
      // Another secret than the job's: trying again cannot help.
      fmt::print(stderr, "launch: node {}: cannot reach the job's store at {}: {}\n",
                 options_.node_rank, at, e.what());
      begin_stop(SIGTERM, 1);
      return false;
    } catch (const std::exception& e) {
      last_error = e.what();
      if (Clock::now() >= deadline) {
        fmt::print(stderr,
                   "launch: node {}: cannot reach the job's store at {} within {} ({})\n",
                   options_.node_rank, at, seconds(options_.join_timeout), last_error);
        begin_stop(SIGTERM, 1);
        return false;
      }
      if (!wait_signals_for(options_.monitor_interval)) return false;
    }
  }
  try {
    link_->announce();
    fmt::print(stderr, "launch: node {} of {}: waiting for the other nodes at {}\n",
               options_.node_rank, options_.nnodes, at);
    for (;;) {
      if (auto failure = link_->failure()) {
        first_failure_ = *failure;
        fmt::print(stderr, "launch: node {}: the job failed before it started\n",
                   options_.node_rank);
        begin_stop(SIGTERM, 1);
        return false;
      }
      const std::vector<int> missing = link_->missing();
      if (missing.empty()) return true;
      if (Clock::now() >= deadline) {
        report_failure(fmt::format("node(s) {} did not arrive within {} (seen from node {})",
                                   fmt::join(missing, ", "), seconds(options_.join_timeout),
                                   options_.node_rank));
        begin_stop(SIGTERM, 1);
        return false;
      }
      if (!wait_signals_for(options_.monitor_interval)) return false;
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "launch: node {}: the job's store at {} failed: {}\n",
               options_.node_rank, at, e.what());
    link_.reset();
    begin_stop(SIGTERM, 1);
    return false;
  }
}

// Records the job's first failure in the store (when this node's is first)
// and remembers the one that is.
void Supervisor::report_failure(const std::string& what) {
  if (!link_) {
    if (first_failure_.empty()) first_failure_ = what;
    return;
  }
  try {
    first_failure_ = link_->report_failure(what);
  } catch (const std::exception& e) {
    if (first_failure_.empty()) first_failure_ = what;
    fmt::print(stderr, "launch: node {}: cannot record the failure in the store: {}\n",
               options_.node_rank, e.what());
    link_.reset();
  }
}

// Node 0: a node whose launcher has not beaten its counter for
// --node-timeout (by this launcher's own clock; no clocks are compared),
// and which has not said it is done, is gone: the job fails, naming it.
// Without this, a launcher killed with SIGKILL (or its host lost) would
// leave node 0 waiting for its "done" for ever.
void Supervisor::watch_nodes(TimePoint now) {
  for (int node = 1; node < options_.nnodes; ++node) {
    if (link_->node_done(node)) continue;
    const int64_t beats = link_->heartbeats_of(node);
    auto [it, first] = heartbeats_.try_emplace(node, beats, now);
    if (!first && it->second.first != beats) it->second = {beats, now};
    if (now - it->second.second < options_.node_timeout) continue;
    const std::string what = fmt::format(
        "node {} stopped responding (its launcher has not updated the store for {})", node,
        seconds(options_.node_timeout));
    fmt::print(stderr, "launch: node {}: {}\n", options_.node_rank, what);
    report_failure(what);
    begin_stop(SIGTERM, 1);
    return;
  }
}

// The store cannot be reached any more (multi-node): this node's workers
// stop, and the job's failure is recorded if the store answers after all.
void Supervisor::lose_store(const std::exception& error) {
  if (!stopping_) {
    fmt::print(stderr,
               "launch: node {}: the job's store at {}:{} is gone ({}); stopping\n",
               options_.node_rank, options_.master_addr, port_, error.what());
    report_failure(
        fmt::format("the store at {}:{} went away", options_.master_addr, port_));
    begin_stop(SIGTERM, 1);
  }
  link_.reset();
  nodes_done_ = true;
  maybe_stop_store();
}

// Multi-node, every monitor_interval while the job runs: another node's
// failure stops this node's workers; the attempt is followed (restarts,
// success); when the job is over and this node's workers are all reaped it
// says so; node 0 keeps the store up until every node is done (or, after a
// failure, for the stop timeout and a little more).
void Supervisor::monitor_job(TimePoint now) {
  if (!link_ || (next_monitor_ && now < *next_monitor_)) return;
  next_monitor_ = now + options_.monitor_interval;
  bool next_attempt = false;
  try {
    if (!next_heartbeat_ || now >= *next_heartbeat_) {
      next_heartbeat_ = now + kHeartbeatInterval;
      link_->heartbeat();
      if (hosts_store() && !stopping_) watch_nodes(now);
    }
    if (!stopping_) {
      if (auto failure = link_->failure()) {
        first_failure_ = *failure;
        fmt::print(stderr, "launch: node {}: stopping: the job failed ({})\n",
                   options_.node_rank, *failure);
        begin_stop(SIGTERM, 1);
      }
    }
    next_attempt = follow_attempt();
    if (!link_) return;  // follow_attempt() lost the store
    // Done: the job is over and every worker reaped, or none started (the
    // job failed first).
    if (job_over() && running_workers() == 0 && !reported_done_) {
      link_->report_done();
      reported_done_ = true;
    }
    if (hosts_store() && reported_done_ && !nodes_done_) {
      const int64_t done = link_->nodes_done();
      if (done >= options_.nnodes) {
        nodes_done_ = true;
      } else if (stopping_) {
        // After a failure: nodes that never arrived will not say they are
        // done; wait for those that did, the grace period at most.
        const auto arrived =
            static_cast<int64_t>(options_.nnodes) - static_cast<int64_t>(link_->missing().size());
        if (done >= arrived) nodes_done_ = true;
        if (!store_grace_until_) {
          store_grace_until_ = now + options_.stop_timeout + std::chrono::seconds(2);
        }
        if (now >= *store_grace_until_) nodes_done_ = true;
      }
      if (nodes_done_) maybe_stop_store();
    }
  } catch (const std::exception& e) {
    lose_store(e);
    return;
  }
  // Outside the try: only the store's errors mean the store is lost.
  if (next_attempt) start_next_attempt();
}

std::string Supervisor::node_tag() const {
  return multi_node() ? fmt::format("node {}: ", options_.node_rank) : std::string();
}

// A worker of the running attempt failed here (`what` names it): the
// attempt's first failure is recorded (several nodes), and the restart
// policy decides.
void Supervisor::on_worker_failed(const std::string& what) {
  std::string first = what;
  if (link_) {
    try {
      first = link_->report_attempt_failure(attempt_.number, what);
    } catch (const std::exception& e) {
      lose_store(e);
      return;
    }
  }
  attempt_failed(first);
}

// The running attempt failed, `first` being its first failure (on any
// node): its workers here are stopped; with restarts left the next attempt
// follows (follow_attempt()), else the job fails naming it.
void Supervisor::attempt_failed(const std::string& first) {
  if (attempt_.number < options_.max_restarts) {
    fmt::print(stderr, "launch: {}attempt {} failed: {}; restarting ({} of {})\n",
               node_tag(), attempt_.number, first, attempt_.number + 1,
               options_.max_restarts);
    attempt_.state = AttemptState::kRestarting;
    stop_workers(SIGTERM, true);
    return;
  }
  std::string what = first;
  if (options_.max_restarts > 0) {
    fmt::print(stderr,
               "launch: {}attempt {} failed: {}; no restarts left (--max-restarts {})\n",
               node_tag(), attempt_.number, first, options_.max_restarts);
    what = fmt::format("attempt {}: {}", attempt_.number, first);
  }
  if (multi_node()) report_failure(what);
  begin_stop(SIGTERM, 1);
}

// Moves the attempt on once this node's workers are all reaped: after a
// failure, to the next attempt (on several nodes, once every node has
// stopped its workers); after every worker exited 0, to the job's success
// (on several nodes, once every node's did; the attempt failing elsewhere
// meanwhile restarts this node too). Returns true when the next attempt
// may start (start_next_attempt()). Store errors are the caller's
// (monitor_job()).
bool Supervisor::follow_attempt() {
  if (stopping_ || !workers_started_) return false;
  if (attempt_.state == AttemptState::kRunning && link_) {
    if (auto failure = link_->attempt_failure(attempt_.number)) attempt_failed(*failure);
    if (stopping_) return false;
  }
  if (running_workers() > 0) return false;
  if (attempt_.state == AttemptState::kRunning) {
    if (link_) {
      if (!attempt_.reported_succeeded) {
        link_->report_succeeded(attempt_.number);
        attempt_.reported_succeeded = true;
      }
      if (!link_->all_succeeded(attempt_.number)) return false;
    }
    attempt_.state = AttemptState::kSucceeded;
    if (options_.max_restarts > 0) {
      fmt::print(stderr, "launch: {}every worker{} exited 0 in attempt {}\n", node_tag(),
                 multi_node() ? " of every node" : "", attempt_.number);
    }
    maybe_stop_store();
  } else if (attempt_.state == AttemptState::kRestarting) {
    if (link_) {
      if (!attempt_.reported_stopped) {
        link_->report_stopped(attempt_.number);
        attempt_.reported_stopped = true;
      }
      if (!link_->all_stopped(attempt_.number)) return false;
    }
    return true;
  }
  return false;
}

// Every worker of the failed attempt is reaped (on every node): the same
// ranks start again as the next attempt.
void Supervisor::start_next_attempt() {
  attempt_ = Attempt{.number = attempt_.number + 1};
  worker_kill_at_.reset();  // the old attempt's: all reaped
  workers_.clear();
  start_workers();
}

void Supervisor::setup_signals() {
  // SIGCHLD ignored by whoever started us would make the kernel reap our
  // children itself, and waitpid() would never see them.
  ::signal(SIGCHLD, SIG_DFL);
  ::signal(SIGPIPE, SIG_IGN);
  sigset_t handled;
  sigemptyset(&handled);
  for (int signo : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&handled, signo);
  if (::sigprocmask(SIG_BLOCK, &handled, &original_mask_) != 0)
    throw_errno("sigprocmask");
  signal_fd_ = ::signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signal_fd_ < 0) throw_errno("signalfd");
  dev_null_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (dev_null_ < 0) throw_errno("open /dev/null");
}

bool Supervisor::start_store_server() {
  int out[2];
  int err[2] = {-1, -1};
  if (::pipe2(out, O_CLOEXEC) != 0) throw_errno("pipe2");
  if (options_.prefix_output && ::pipe2(err, O_CLOEXEC) != 0) throw_errno("pipe2");
  SpawnOptions spawn_options;
  spawn_options.path = options_.store_server;
  spawn_options.argv = {options_.store_server,
                        "--host",
                        options_.master_addr,
                        "--port",
                        std::to_string(options_.master_port),
                        "--quiet"};
  spawn_options.env = environment_with({secret_variable()});
  spawn_options.stdin_fd = dev_null_;
  spawn_options.stdout_fd = out[1];
  spawn_options.stderr_fd = err[1];
  spawn_options.signal_mask = original_mask_;
  Spawned spawned = spawn(spawn_options);
  ::close(out[1]);
  store_stdout_ = out[0];
  if (err[1] >= 0) {
    ::close(err[1]);
    relays_.emplace_back(err[0], STDERR_FILENO, "[store] ");
  }
  store_.pid = spawned.pid;
  store_.running = spawned.exec_error == 0;
  if (store_.running) return true;
  fmt::print(stderr, "launch: cannot execute the store server '{}': {}\n",
             options_.store_server, std::strerror(spawned.exec_error));
  begin_stop(SIGTERM, 1);
  return false;
}

// Reads the store server's stdout until "port=N", a signal, its exit or the
// timeout; all but the first end the job (stopping_).
bool Supervisor::wait_for_port() {
  TimePoint deadline = Clock::now() + kStorePortTimeout;
  std::string pending;
  while (port_ == 0 && !stopping_) {
    auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      fmt::print(stderr, "launch: the store server printed no port=N within {} s\n",
                 kStorePortTimeout.count());
      begin_stop(SIGTERM, 1);
      break;
    }
    // The store server's stderr relay (if any) is polled too, so it never
    // blocks on a full pipe.
    LineRelay* err_relay = relays_.empty() || !relays_[0].open() ? nullptr : &relays_[0];
    pollfd fds[3] = {{signal_fd_, POLLIN, 0},
                     {err_relay ? err_relay->source() : -1, POLLIN, 0},
                     {store_stdout_, POLLIN, 0}};
    int rc = ::poll(fds, 3, static_cast<int>(left));
    if (rc < 0 && errno != EINTR) throw_errno("poll");
    if (fds[1].revents != 0) err_relay->read_some();
    if (fds[2].revents != 0 && !parse_port_lines(&pending)) {
      ::close(store_stdout_);  // EOF: its exit (SIGCHLD) will tell us why
      store_stdout_ = -1;
    }
    if (fds[0].revents != 0) read_signals();
  }
  if (store_stdout_ >= 0) {
    relays_.emplace_back(std::exchange(store_stdout_, -1), STDERR_FILENO, "[store] ",
                         std::move(pending));
  }
  return port_ != 0 && !stopping_;
}

// Reads once from the store server's stdout and sets port_ from a complete
// "port=N" line; returns false at EOF.
bool Supervisor::parse_port_lines(std::string* pending) {
  char chunk[4096];
  ssize_t n = ::read(store_stdout_, chunk, sizeof chunk);
  if (n < 0 && errno == EINTR) return true;
  if (n <= 0) return false;
  pending->append(chunk, static_cast<size_t>(n));
  for (size_t eol; port_ == 0 && (eol = pending->find('\n')) != std::string::npos;) {
    std::string line = pending->substr(0, eol);
    pending->erase(0, eol + 1);
    int port = 0;
    if (std::sscanf(line.c_str(), "port=%d", &port) == 1 && port > 0 && port < 65536) {
      port_ = static_cast<uint16_t>(port);
    }
  }
  return true;
}

// Starts the workers of the attempt attempt_ names.
void Supervisor::start_workers() {
  if (hosts_store() && attempt_.number == 0) {
    fmt::print(stderr, "launch: store server (pid {}) at {}\n", store_.pid,
               store_url(options_.master_addr, port_));
  }
  std::string path = resolve_program(options_.command[0]);
  for (int local = 0; local < options_.nproc; ++local) {
    if (!start_worker(local, path)) break;
  }
  workers_started_ = true;
  if (stopping_) {
    maybe_stop_store();
    return;
  }
  std::vector<pid_t> pids;
  for (const Child& worker : workers_) pids.push_back(worker.pid);
  fmt::print(stderr, "launch: {}started {} workers (pids {})\n",
             attempt_.number > 0 ? fmt::format("attempt {}: ", attempt_.number) : "",
             workers_.size(), fmt::join(pids, ", "));
}

// Starts the worker of local rank `local`; false (stopping the job) when it
// cannot be executed.
bool Supervisor::start_worker(int local, const std::string& path) {
  const std::string& addr = options_.master_addr;
  const int rank = options_.node_rank * options_.nproc + local;
  SpawnOptions spawn_options;
  spawn_options.path = path;
  spawn_options.argv = options_.command;
  spawn_options.env = environment_with({
      fmt::format("RANK={}", rank),
      fmt::format("LOCAL_RANK={}", local),
      fmt::format("WORLD_SIZE={}", options_.nnodes * options_.nproc),
      fmt::format("LOCAL_WORLD_SIZE={}", options_.nproc),
      fmt::format("GROUP_RANK={}", options_.node_rank),
      fmt::format("NODE_RANK={}", options_.node_rank),
      fmt::format("MASTER_ADDR={}", addr),
      fmt::format("MASTER_PORT={}", port_),
      fmt::format("SWITCHBOARD_STORE={}", store_url(addr, port_)),
      fmt::format("TORCHELASTIC_RESTART_COUNT={}", attempt_.number),
      fmt::format("TORCHELASTIC_MAX_RESTARTS={}", options_.max_restarts),
      fmt::format("TORCHELASTIC_RUN_ID={}", options_.job_id),
      secret_variable(),
  });
  if (const char* dir = std::getenv("BUILD_WORKING_DIRECTORY"))
    spawn_options.workdir = dir;
  spawn_options.stdin_fd = dev_null_;
  spawn_options.signal_mask = original_mask_;
  int out[2] = {-1, -1};
  int err[2] = {-1, -1};
  if (options_.prefix_output) {
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0)
      throw_errno("pipe2");
    spawn_options.stdout_fd = out[1];
    spawn_options.stderr_fd = err[1];
  }
  Spawned spawned = spawn(spawn_options);
  workers_.push_back(
      {fmt::format("rank {}", rank), spawned.pid, spawned.exec_error == 0});
  if (options_.prefix_output) {
    ::close(out[1]);
    ::close(err[1]);
    std::string prefix = fmt::format("[rank {}] ", rank);
    relays_.emplace_back(out[0], STDOUT_FILENO, prefix);
    relays_.emplace_back(err[0], STDERR_FILENO, prefix);
  }
  if (spawned.exec_error == 0) return true;
  fmt::print(stderr, "launch: rank {} cannot execute '{}': {}\n", rank,
             options_.command[0], std::strerror(spawned.exec_error));
  // Not restartable: it would fail again.
  if (multi_node()) {
    report_failure(fmt::format("node {} rank {} cannot execute '{}': {}",
                               options_.node_rank, rank, options_.command[0],
                               std::strerror(spawned.exec_error)));
  }
  begin_stop(SIGTERM, 1);
  return false;
}

// The loop of step 4 (supervisor.h): until every child is reaped and its
// output passed on.
void Supervisor::supervise() {
  while (!done()) {
    std::vector<pollfd> fds = {{signal_fd_, POLLIN, 0}};
    std::vector<LineRelay*> polled;
    for (LineRelay& relay : relays_) {
      if (!relay.open()) continue;
      fds.push_back({relay.source(), POLLIN, 0});
      polled.push_back(&relay);
    }
    int rc = ::poll(fds.data(), fds.size(), poll_timeout_ms(Clock::now()));
    if (rc < 0 && errno != EINTR) throw_errno("poll");
    for (size_t i = 0; rc > 0 && i < polled.size(); ++i) {
      if (fds[i + 1].revents != 0) polled[i]->read_some();
    }
    if (rc > 0 && fds[0].revents != 0) read_signals();
    on_deadlines(Clock::now());
    // One node: the attempt is followed here; several: by monitor_job().
    if (!multi_node() && follow_attempt()) start_next_attempt();
    monitor_job(Clock::now());
    if (job_over() && !store_.running && running_workers() == 0 && !drain_until_) {
      drain_until_ = Clock::now() + options_.stop_timeout;
    }
  }
}

void Supervisor::read_signals() {
  signalfd_siginfo info;
  while (::read(signal_fd_, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
    on_signal(static_cast<int>(info.ssi_signo));
  }
}

void Supervisor::on_signal(int signo) {
  if (signo == SIGCHLD) {
    reap_children();
  } else if (stopping_) {
    fmt::print(stderr, "launch: {} while stopping: killing everything now\n",
               signal_name(signo));
    kill_everything();
  } else {
    fmt::print(stderr, "launch: got {}; forwarding it to {} workers\n",
               signal_name(signo), running_workers());
    if (multi_node()) {
      report_failure(fmt::format("node {}: the launcher got {}", options_.node_rank,
                                 signal_name(signo)));
    }
    begin_stop(signo, 128 + signo);
  }
}

// Several children may have exited for one SIGCHLD.
void Supervisor::reap_children() {
  for (;;) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == EINTR) continue;
    if (pid <= 0) return;
    on_child_exit(pid, status);
  }
}

void Supervisor::on_child_exit(pid_t pid, int status) {
  if (pid == store_.pid) {
    store_.running = false;
    if (!store_signaled_ && !stopping_) {
      fmt::print(stderr, "launch: store server (pid {}) {}{}; stopping the workers\n",
                 pid, describe_status(status),
                 port_ == 0 ? " before printing its port" : "");
      begin_stop(SIGTERM, 1);
    }
  } else {
    auto worker = std::find_if(workers_.begin(), workers_.end(),
                               [&](const Child& child) { return child.pid == pid; });
    if (worker == workers_.end()) return;  // not ours (cannot happen)
    worker->running = false;
    // Workers stopped for a restart or at the job's end are not failures.
    if (!stopping_ && attempt_.state == AttemptState::kRunning && failed(status)) {
      fmt::print(stderr, "launch: {} (pid {}) {}\n", worker->name, pid,
                 describe_status(status));
      on_worker_failed(multi_node()
                           ? fmt::format("node {} {} (pid {}) {}", options_.node_rank,
                                         worker->name, pid, describe_status(status))
                           : fmt::format("{} (pid {}) {}", worker->name, pid,
                                         describe_status(status)));
    }
  }
  maybe_stop_store();
}

// Ends the job: `signo` to every running worker's process group, SIGKILL
// after the stop timeout; the launcher will exit with `exit_code`.
void Supervisor::begin_stop(int signo, int exit_code) {
  stopping_ = true;
  exit_code_ = exit_code;
  stop_workers(signo, exit_code == 1);
  maybe_stop_store();
}

// `signo` to every running worker's process group (saying so when
// `say_so`), SIGKILL after the stop timeout (on_deadlines()).
void Supervisor::stop_workers(int signo, bool say_so) {
  const int running = running_workers();
  if (running == 0) return;
  if (say_so) {
    fmt::print(stderr, "launch: stopping {} running workers: {} now, SIGKILL after {}\n",
               running, signal_name(signo), seconds(options_.stop_timeout));
  }
  for (const Child& worker : workers_) {
    if (worker.running) ::kill(-worker.pid, signo);
  }
  worker_kill_at_ = Clock::now() + options_.stop_timeout;
}

// The store server goes last: SIGTERM once the job is over and every worker
// has been reaped (on several nodes: every node's, see monitor_job()).
void Supervisor::maybe_stop_store() {
  if (!job_over()) return;
  if (running_workers() > 0 || !store_.running || store_signaled_) return;
  if (link_ && !nodes_done_) return;
  store_signaled_ = true;
  ::kill(-store_.pid, SIGTERM);
  store_kill_at_ = Clock::now() + options_.stop_timeout;
}

void Supervisor::kill_everything() {
  for (const Child& worker : workers_) {
    if (worker.running) ::kill(-worker.pid, SIGKILL);
  }
  if (store_.running) ::kill(-store_.pid, SIGKILL);
  store_signaled_ = true;
  worker_kill_at_.reset();
  store_kill_at_.reset();
}

void Supervisor::on_deadlines(TimePoint now) {
  if (worker_kill_at_ && now >= *worker_kill_at_) {
    worker_kill_at_.reset();
    if (int running = running_workers(); running > 0) {
      fmt::print(stderr, "launch: {} workers still running after {}; sending SIGKILL\n",
                 running, seconds(options_.stop_timeout));
      for (const Child& worker : workers_) {
        if (worker.running) ::kill(-worker.pid, SIGKILL);
      }
    }
  }
  if (store_kill_at_ && now >= *store_kill_at_) {
    store_kill_at_.reset();
    if (store_.running) {
      fmt::print(stderr, "launch: store server still running after {}; sending SIGKILL\n",
                 seconds(options_.stop_timeout));
      ::kill(-store_.pid, SIGKILL);
    }
  }
  if (drain_until_ && now >= *drain_until_) drain_and_close_relays();
}

// Every child is gone but some pipe is still open (a grandchild holds it):
// pass on what is already buffered, then stop listening.
void Supervisor::drain_and_close_relays() {
  constexpr int kMaxReads = 64;  // 1 MiB: more than a pipe buffers
  for (LineRelay& relay : relays_) {
    for (int i = 0; i < kMaxReads && relay.open(); ++i) {
      pollfd readable{relay.source(), POLLIN, 0};
      if (::poll(&readable, 1, 0) <= 0) break;
      relay.read_some();
    }
    relay.finish();
  }
}

int Supervisor::poll_timeout_ms(TimePoint now) const {
  std::optional<TimePoint> next;
  std::optional<TimePoint> monitor;
  if (link_) monitor = next_monitor_.value_or(now);
  for (const auto& deadline : {worker_kill_at_, store_kill_at_, drain_until_, monitor}) {
    if (deadline && (!next || *deadline < *next)) next = deadline;
  }
  if (!next) return -1;
  auto left = std::chrono::ceil<std::chrono::milliseconds>(*next - now).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1'000'000));
}

int Supervisor::running_workers() const {
  return static_cast<int>(
      std::count_if(workers_.begin(), workers_.end(),
                    [](const Child& child) { return child.running; }));
}

bool Supervisor::done() const {
  if (!job_over() || store_.running || running_workers() > 0) return false;
  if (link_ && !reported_done_) return false;  // say so first (monitor_job)
  return std::none_of(relays_.begin(), relays_.end(),
                      [](const LineRelay& relay) { return relay.open(); });
}

}  // namespace

int run_launcher(const LaunchOptions& options) {
  Supervisor supervisor(options);
  return supervisor.run();
}

}  // namespace switchboard::launch
