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
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "common/auth.h"
#include "common/error.h"
#include "launch/child.h"
#include "launch/job_secret.h"
#include "launch/line_relay.h"
#include "launch/node_group.h"
#include "launch/node_link.h"
#include "launch/spawn.h"
#include "launch/store_server_process.h"

namespace switchboard::launch {

namespace {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;

constexpr std::chrono::seconds kStorePortTimeout{30};

[[noreturn]] void throw_errno(const char* what) {
  throw std::system_error(errno, std::generic_category(), what);
}

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
  // Several nodes: the job's first failure (NodeGroup::report_failure).
  void report_failure(const std::string& what) { nodes_->report_failure(what); }
  // The store while it can be reached (several nodes), else null.
  NodeLink* link() { return nodes_ && nodes_->linked() ? &nodes_->link() : nullptr; }
  void lose_store(const std::exception& error);
  void on_worker_failed(const std::string& what);
  void attempt_failed(const std::string& first);
  bool follow_attempt();
  void start_next_attempt();
  // "node 1: " on several nodes, else "" (log lines of this launcher).
  std::string node_tag() const;
  void setup_signals();
  bool start_store_server();
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
  // The store server's output relays, then the workers'.
  std::vector<LineRelay*> all_relays();
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
  StoreServerProcess store_;  // started only when hosts_store()
  std::vector<Child> workers_;
  std::vector<LineRelay> relays_;  // the workers'
  uint16_t port_ = 0;
  bool workers_started_ = false;  // start_workers() ran (attempt 0)
  bool stopping_ = false;  // a failure or a signal is ending the job
  Attempt attempt_;        // the restart policy's
  int exit_code_ = 0;
  std::optional<TimePoint> worker_kill_at_;  // SIGKILL the workers then
  std::optional<TimePoint> drain_until_;     // stop waiting for output EOF
  // The other launchers (several nodes), else null.
  std::unique_ptr<NodeGroup> nodes_;
  // The job secret and its file (set by prepare_secret()).
  std::unique_ptr<JobSecret> secret_;
};

Supervisor::~Supervisor() {
  // Children are still running only when run() threw (store_ reaps its
  // own).
  auto kill_and_reap = [](const Child& child) {
    if (!child.running) return;
    ::kill(-child.pid, SIGKILL);
    while (::waitpid(child.pid, nullptr, 0) < 0 && errno == EINTR) {
    }
  };
  for (const Child& worker : workers_) kill_and_reap(worker);
  relays_.clear();
  for (int fd : {signal_fd_, dev_null_}) {
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
  if (multi_node()) nodes_ = std::make_unique<NodeGroup>(options_, secret_->secret());
  bool ready = true;
  if (hosts_store()) {
    ready = start_store_server();
  } else {
    port_ = options_.master_port;
  }
  if (ready && multi_node()) ready = join_nodes();
  if (ready) start_workers();
  supervise();
  if (nodes_ && !nodes_->first_failure().empty()) {
    fmt::print(stderr, "launch: node {}: the job failed; first failure: {}\n",
               options_.node_rank, nodes_->first_failure());
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

// Several nodes: waits until every node's launcher is there (NodeGroup::
// join()); false, the job stopping, when one is not.
bool Supervisor::join_nodes() {
  if (nodes_->join(port_, [this](std::chrono::milliseconds timeout) {
        return wait_signals_for(timeout);
      })) {
    return true;
  }
  if (!stopping_) begin_stop(SIGTERM, 1);
  return false;
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
  nodes_->lose();
  maybe_stop_store();
}

// Multi-node, every monitor_interval while the job runs: another node's
// failure stops this node's workers; the attempt is followed (restarts,
// success); when the job is over and this node's workers are all reaped it
// says so; node 0 keeps the store up until every node is done (or, after a
// failure, for the stop timeout and a little more).
void Supervisor::monitor_job(TimePoint now) {
  if (!nodes_ || !nodes_->due(now)) return;
  bool next_attempt = false;
  try {
    if (auto lost = nodes_->beat(now, hosts_store() && !stopping_)) {
      fmt::print(stderr, "launch: node {}: {}\n", options_.node_rank, *lost);
      report_failure(*lost);
      begin_stop(SIGTERM, 1);
    }
    if (!stopping_ && nodes_->linked()) {
      if (auto failure = nodes_->recorded_failure()) {
        fmt::print(stderr, "launch: node {}: stopping: the job failed ({})\n",
                   options_.node_rank, *failure);
        begin_stop(SIGTERM, 1);
      }
    }
    next_attempt = follow_attempt();
    if (!nodes_->linked()) return;  // the store was lost meanwhile
    // Done: the job is over and every worker reaped, or none started (the
    // job failed first).
    if (job_over() && running_workers() == 0) nodes_->report_done();
    if (hosts_store() && nodes_->reported_done() && nodes_->keeps_store() &&
        nodes_->nodes_done(now, stopping_)) {
      maybe_stop_store();
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
  if (NodeLink* link = this->link()) {
    try {
      first = link->report_attempt_failure(attempt_.number, what);
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
  if (attempt_.state == AttemptState::kRunning && link()) {
    if (auto failure = link()->attempt_failure(attempt_.number)) attempt_failed(*failure);
    if (stopping_) return false;
  }
  if (running_workers() > 0) return false;
  if (attempt_.state == AttemptState::kRunning) {
    if (NodeLink* link = this->link()) {
      if (!attempt_.reported_succeeded) {
        link->report_succeeded(attempt_.number);
        attempt_.reported_succeeded = true;
      }
      if (!link->all_succeeded(attempt_.number)) return false;
    }
    attempt_.state = AttemptState::kSucceeded;
    if (options_.max_restarts > 0) {
      fmt::print(stderr, "launch: {}every worker{} exited 0 in attempt {}\n", node_tag(),
                 multi_node() ? " of every node" : "", attempt_.number);
    }
    maybe_stop_store();
  } else if (attempt_.state == AttemptState::kRestarting) {
    if (NodeLink* link = this->link()) {
      if (!attempt_.reported_stopped) {
        link->report_stopped(attempt_.number);
        attempt_.reported_stopped = true;
      }
      if (!link->all_stopped(attempt_.number)) return false;
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

// Starts the store server and reads its port (port_); false, the job
// stopping, when it cannot be executed, prints no port in time, or a
// signal stops the job meanwhile.
bool Supervisor::start_store_server() {
  if (const int error =
          store_.start(options_, secret_variable(), dev_null_, original_mask_)) {
    fmt::print(stderr, "launch: cannot execute the store server '{}': {}\n",
               options_.store_server, std::strerror(error));
    begin_stop(SIGTERM, 1);
    return false;
  }
  const auto waited = store_.wait_for_port(
      signal_fd_,
      [this] {
        read_signals();
        return !stopping_;
      },
      kStorePortTimeout);
  if (waited == StoreServerProcess::PortWait::kTimedOut) {
    fmt::print(stderr, "launch: the store server printed no port=N within {} s\n",
               kStorePortTimeout.count());
    begin_stop(SIGTERM, 1);
  }
  if (waited != StoreServerProcess::PortWait::kReady) return false;
  port_ = store_.port();
  return true;
}

// Starts the workers of the attempt attempt_ names.
void Supervisor::start_workers() {
  if (hosts_store() && attempt_.number == 0) {
    fmt::print(stderr, "launch: store server (pid {}) at {}\n", store_.pid(),
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
    for (LineRelay* relay : all_relays()) {
      if (!relay->open()) continue;
      fds.push_back({relay->source(), POLLIN, 0});
      polled.push_back(relay);
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
    if (job_over() && !store_.running() && running_workers() == 0 && !drain_until_) {
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
  if (pid == store_.pid()) {
    store_.exited();
    if (!store_.signaled() && !stopping_) {
      fmt::print(stderr, "launch: store server (pid {}) {}{}; stopping the workers\n",
                 pid, describe_status(status),
                 store_.port() == 0 ? " before printing its port" : "");
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
  if (running_workers() > 0) return;
  if (nodes_ && nodes_->keeps_store()) return;
  store_.terminate(options_.stop_timeout);
}

void Supervisor::kill_everything() {
  for (const Child& worker : workers_) {
    if (worker.running) ::kill(-worker.pid, SIGKILL);
  }
  store_.kill();
  worker_kill_at_.reset();
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
  store_.on_deadline(now, options_.stop_timeout);
  if (drain_until_ && now >= *drain_until_) drain_and_close_relays();
}

// Every child is gone but some pipe is still open (a grandchild holds it):
// pass on what is already buffered, then stop listening.
void Supervisor::drain_and_close_relays() {
  constexpr int kMaxReads = 64;  // 1 MiB: more than a pipe buffers
  for (LineRelay* relay : all_relays()) {
    for (int i = 0; i < kMaxReads && relay->open(); ++i) {
      pollfd readable{relay->source(), POLLIN, 0};
      if (::poll(&readable, 1, 0) <= 0) break;
      relay->read_some();
    }
    relay->finish();
  }
}

std::vector<LineRelay*> Supervisor::all_relays() {
  std::vector<LineRelay*> relays;
  for (LineRelay& relay : store_.relays()) relays.push_back(&relay);
  for (LineRelay& relay : relays_) relays.push_back(&relay);
  return relays;
}

int Supervisor::poll_timeout_ms(TimePoint now) const {
  std::optional<TimePoint> next;
  std::optional<TimePoint> monitor;
  if (nodes_) monitor = nodes_->next_due(now);
  for (const auto& deadline :
       {worker_kill_at_, store_.deadline(), drain_until_, monitor}) {
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
  if (!job_over() || store_.running() || running_workers() > 0) return false;
  if (nodes_ && nodes_->owes_done()) return false;  // say so first (monitor_job)
  for (const LineRelay& relay : store_.relays()) {
    if (relay.open()) return false;
  }
  return std::none_of(relays_.begin(), relays_.end(),
                      [](const LineRelay& relay) { return relay.open(); });
}

}  // namespace

int run_launcher(const LaunchOptions& options) {
  Supervisor supervisor(options);
  return supervisor.run();
}

}  // namespace switchboard::launch
