#include "tests/util/slurm_cluster.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

namespace sbtest {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr auto kPoll = std::chrono::milliseconds(100);
constexpr auto kDaemonUp = std::chrono::seconds(60);    // bound on each readiness wait
constexpr auto kDaemonStop = std::chrono::seconds(10);  // SIGTERM to SIGKILL

// Where Debian's packages put each program.
std::string program(const std::string& name) {
  for (const char* dir : {"/usr/sbin", "/usr/bin", "/sbin", "/bin"}) {
    const std::string path = fmt::format("{}/{}", dir, name);
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  return {};
}

// The programs a cluster runs, and the package that has each.
const std::vector<std::pair<std::string, std::string>>& programs() {
  static const std::vector<std::pair<std::string, std::string>> list = {
      {"slurmctld", "slurmctld"},  {"slurmd", "slurmd"},
      {"slurmstepd", "slurmd"},    {"srun", "slurm-client"},
      {"sbatch", "slurm-client"},  {"scontrol", "slurm-client"},
      {"sinfo", "slurm-client"},   {"squeue", "slurm-client"},
      {"scancel", "slurm-client"}, {"munged", "munge"},
      {"munge", "munge"}};
  return list;
}

// Whether our child `pid` has exited (gone, or a zombie not yet reaped).
bool exited(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string stat;
  if (!std::getline(in, stat)) return true;
  const size_t paren = stat.rfind(") ");
  return paren == std::string::npos || stat[paren + 2] == 'Z';
}

// The parent of `pid`, or 0.
int parent(int pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string stat;
  std::getline(in, stat);
  const size_t paren = stat.rfind(") ");
  if (paren == std::string::npos) return 0;
  std::istringstream fields(stat.substr(paren + 2));
  char state = 0;
  int ppid = 0;
  fields >> state >> ppid;
  return ppid;
}

std::string comm(int pid) {
  std::ifstream in(fmt::format("/proc/{}/comm", pid));
  std::string name;
  std::getline(in, name);
  return name.empty() ? "?" : name;
}

// The last `lines` lines of file `path`.
std::string tail(const std::string& path, size_t lines = 15) {
  std::ifstream in(path);
  if (!in) return fmt::format("({} does not exist)", path);
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) all.push_back(line);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) {
    out += all[i] + "\n";
  }
  return out;
}

// The first line of `path` that contains `needle`, or "".
std::string line_with(const std::string& path, const std::string& needle) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.find(needle) != std::string::npos) return line;
  }
  return {};
}

void write_file(const std::string& path, const std::string& text, fs::perms perms) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw std::runtime_error(fmt::format("SlurmCluster: cannot write {}", path));
  fs::permissions(path, perms);
}

// The cluster's directory. Unix socket paths (munged's, slurmstepd's in the
// spool) are limited to 107 bytes, and Bazel's TEST_TMPDIR is often longer
// than what leaves room for them; then a directory in /tmp, whose name
// carries our pid so that a later run removes it if we die without our
// destructor.
std::string make_dir() {
  const pid_t me = ::getpid();
  std::error_code ignored;
  for (const fs::directory_entry& entry : fs::directory_iterator("/tmp", ignored)) {
    const std::string name = entry.path().filename().string();
    std::smatch m;
    static const std::regex stale(R"(sbslurm(\d+)-.*)");
    if (!std::regex_match(name, m, stale)) continue;
    const pid_t owner = static_cast<pid_t>(std::stol(m[1]));
    if (owner != me && ::kill(owner, 0) != 0 && errno == ESRCH)
      fs::remove_all(entry.path(), ignored);
  }
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string base = tmp != nullptr && std::string(tmp).size() < 40
                               ? std::string(tmp)
                               : std::string("/tmp");
  std::string dir = fmt::format("{}/sbslurm{}-XXXXXX", base, me);
  if (::mkdtemp(dir.data()) == nullptr) {
    throw std::runtime_error(
        fmt::format("SlurmCluster: mkdtemp {}: {}", dir, std::strerror(errno)));
  }
  fs::permissions(dir, fs::perms::owner_all | fs::perms::group_read |
                           fs::perms::group_exec | fs::perms::others_read |
                           fs::perms::others_exec);
  return dir;
}

// The hosts' names as a SLURM host list: host[0-2].
std::string host_list(int nodes) {
  return nodes == 1 ? "host0" : fmt::format("host[0-{}]", nodes - 1);
}

// A job state that will still change.
bool job_running(const std::string& state) {
  static const std::set<std::string> running = {
      "PENDING",   "RUNNING",      "CONFIGURING", "COMPLETING",
      "SUSPENDED", "REQUEUED",     "RESIZING",    "SIGNALING",
      "STAGE_OUT", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"};
  return state.empty() || running.count(state) > 0;
}

}  // namespace

std::string SlurmCluster::unavailable() {
  if (std::string why = NetnsCluster::unavailable(); !why.empty()) return why;
  if (std::string why = NetnsCluster::daemon_unavailable(); !why.empty()) return why;
  for (const auto& [name, package] : programs()) {
    if (program(name).empty()) {
      return fmt::format(
          "SLURM's {} is not installed (apt-get install {}; tools/setup "
          "installs slurmd slurmctld slurm-client munge)",
          name, package);
    }
  }
  return {};
}

std::unique_ptr<SlurmCluster> SlurmCluster::start(Options options) {
  static std::string why = unavailable();
  if (why.empty()) {
    try {
      return std::make_unique<SlurmCluster>(options);
    } catch (const Unavailable& e) {
      why = e.what();
    }
  }
  fmt::print("skipped: {}\n", why);
  std::fflush(stdout);
  return nullptr;
}

SlurmCluster::SlurmCluster(Options options)
    : hosts_({.hosts = options.nodes + 1, .host_names = true}),
      nodes_(options.nodes),
      controller_(options.nodes),
      dir_(make_dir()) {
  try {
    write_files(options);
    start_munged();
    launch(controller_, "slurmctld", dir_ + "/log/slurmctld.log",
           {program("slurmctld"), "-D", "-i", "-f", conf()});
    wait_controller();
    for (int node = 0; node < nodes_; ++node) {
      launch(node, "slurmd " + node_name(node),
             fmt::format("{}/log/slurmd.{}.log", dir_, node_name(node)),
             {program("slurmd"), "-D", "-N", node_name(node), "-f", conf()});
    }
    wait_nodes_idle();
  } catch (...) {
    stop();
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
    throw;
  }
}

SlurmCluster::~SlurmCluster() {
  stop();
  std::error_code ignored;
  // Keep the logs where Bazel collects a test's outputs (outputs.zip).
  if (const char* outputs = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR")) {
    const fs::path to = fs::path(outputs) / fs::path(dir_).filename();
    fs::create_directories(to, ignored);
    fs::copy(dir_ + "/log", to / "log", fs::copy_options::recursive, ignored);
    fs::copy(dir_ + "/jobs", to / "jobs", fs::copy_options::recursive, ignored);
  }
  fs::remove_all(dir_, ignored);
}

void SlurmCluster::write_files(const Options& options) {
  for (const char* sub : {"etc", "state", "log", "run", "jobs", "munge"}) {
    fs::create_directories(fmt::format("{}/{}", dir_, sub));
  }
  for (int node = 0; node < nodes_; ++node) {
    fs::create_directories(fmt::format("{}/spool/{}", dir_, node_name(node)));
  }
  // munged wants every directory up to its socket searchable by all.
  fs::permissions(dir_ + "/munge", fs::perms::owner_all | fs::perms::group_read |
                                       fs::perms::group_exec | fs::perms::others_read |
                                       fs::perms::others_exec);
  // The munge key: 1024 random bytes, readable by its owner only.
  std::ifstream random("/dev/urandom", std::ios::binary);
  std::string key(1024, '\0');
  random.read(key.data(), static_cast<std::streamsize>(key.size()));
  if (!random) throw std::runtime_error("SlurmCluster: cannot read /dev/urandom");
  write_file(dir_ + "/munge/munge.key", key, fs::perms::owner_read);

  const std::string d = dir_;
  write_file(
      conf(),
      fmt::format(R"(# Written by sbtest::SlurmCluster (tests/util/slurm_cluster.h).
ClusterName=sbtest
SlurmctldHost={ctl}({ctl_addr})
SlurmUser=root
SlurmdUser=root
# A private munged; auth/munge and cred/munge both take AuthInfo's socket.
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge/munge.sock
StateSaveLocation={d}/state
# %n is the node's name (slurmd -N): every slurmd shares this file system.
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd.%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
# No cgroups: processes tracked by their parents, no task plugin, no accounting.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# The nodes share one machine's CPUs and memory: take the CPUs declared here.
SlurmdParameters=config_overrides
ReturnToService=2
# Short, so that a lost node is found within seconds. slurmctld reads
# MessageTimeout once, when it starts.
SlurmctldTimeout=10
SlurmdTimeout={slurmd_timeout}
MessageTimeout={message_timeout}
KillWait=2
InactiveLimit=0
# Ended jobs stay visible to scontrol (wait_job) for this long.
MinJobAge=300
NodeName={nodes} NodeAddr=198.18.0.[1-{n}] CPUs={cpus} State=UNKNOWN
PartitionName=all Nodes=ALL Default=YES MaxTime=INFINITE State=UP
)",
                  fmt::arg("ctl", hosts_.host_name(controller_)),
                  fmt::arg("ctl_addr", hosts_.address(controller_)), fmt::arg("d", d),
                  fmt::arg("slurmd_timeout", options.slurmd_timeout),
                  fmt::arg("message_timeout", options.message_timeout),
                  fmt::arg("nodes", host_list(nodes_)), fmt::arg("n", nodes_),
                  fmt::arg("cpus", options.cpus)),
      fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
          fs::perms::others_read);
}

SlurmCluster::Daemon& SlurmCluster::launch(int host, const std::string& name,
                                           const std::string& log,
                                           const std::vector<std::string>& argv) {
  // The daemon logs to `log` itself; what it prints goes to a file beside
  // it (a pipe no one reads would fill). sh execs the command: the pid is
  // the daemon's.
  std::string out = log;
  out.replace(out.size() - 4, 4, ".out");
  std::vector<std::string> full = {"/bin/sh", "-c", "exec \"$@\" >>\"$0\" 2>&1", out};
  for (std::string& a : hosts_.daemon_command(host, argv, {{"SLURM_CONF", conf()}})) {
    full.push_back(std::move(a));
  }
  daemons_.push_back(Daemon{name, log, Subprocess(full)});
  return daemons_.back();
}

void SlurmCluster::start_munged() {
  const std::string m = dir_ + "/munge";
  Daemon& munged =
      launch(controller_, "munged", dir_ + "/log/munged.log",
             {program("munged"), "--foreground", "--socket=" + m + "/munge.sock",
              "--key-file=" + m + "/munge.key", "--pid-file=" + m + "/munged.pid",
              "--log-file=" + dir_ + "/log/munged.log",
              "--seed-file=" + m + "/munged.seed", "--num-threads=2"});
  // Up when a credential can be made (`munge -n`: no payload).
  const auto deadline = Clock::now() + kDaemonUp;
  for (;;) {
    if (fs::exists(m + "/munge.sock")) {
      Subprocess probe({"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1", program("munge"),
                        "-n", "--socket=" + m + "/munge.sock"});
      probe.read_all(std::chrono::seconds(10));
      if (probe.wait() == 0) return;
    }
    if (exited(munged.process.pid())) not_up("munged (it exited)", &munged);
    if (Clock::now() > deadline) not_up("munged", &munged);
    std::this_thread::sleep_for(kPoll);
  }
}

void SlurmCluster::wait_controller() {
  const Daemon& ctl = daemons_.back();
  const auto deadline = Clock::now() + kDaemonUp;
  for (;;) {
    Subprocess ping = client({program("scontrol"), "ping"});
    const std::string out = ping.read_all(std::chrono::seconds(30));
    if (ping.wait() == 0 && out.find("is UP") != std::string::npos) return;
    if (exited(ctl.process.pid())) not_up("slurmctld (it exited)", &ctl);
    if (Clock::now() > deadline) not_up("slurmctld (`scontrol ping`: " + out + ")", &ctl);
    std::this_thread::sleep_for(kPoll);
  }
}

void SlurmCluster::wait_nodes_idle() {
  const auto deadline = Clock::now() + kDaemonUp;
  for (;;) {
    // A slurmd that exited: SLURM 22.05's slurmd always starts a cgroup
    // plugin, and exits where it cannot (no cgroup file system it knows,
    // a cgroup v2 hierarchy it may not use): this machine cannot run it.
    for (const Daemon& d : daemons_) {
      if (d.name.rfind("slurmd", 0) != 0 || !exited(d.process.pid())) continue;
      for (const char* sign : {"cgroup", "Hybrid mode"}) {
        if (std::string line = line_with(d.log, sign); !line.empty()) {
          throw Unavailable(
              fmt::format("SLURM 22.05's slurmd cannot start on this machine "
                          "(its cgroups): {}",
                          line));
        }
      }
      not_up(d.name + " (it exited)", &d);
    }
    std::map<std::string, std::string> states;
    try {
      states = node_states();
    } catch (const std::exception&) {
      // the controller may be busy: poll again
    }
    int idle = 0;
    for (int node = 0; node < nodes_; ++node) idle += states[node_name(node)] == "idle";
    if (idle == nodes_) return;
    if (Clock::now() > deadline) {
      std::string not_idle;
      const Daemon* first = nullptr;
      for (int node = 0; node < nodes_; ++node) {
        const std::string state = states[node_name(node)];
        if (state == "idle") continue;
        not_idle +=
            fmt::format(" {} ({})", node_name(node), state.empty() ? "unknown" : state);
        if (first == nullptr) first = &daemons_.at(static_cast<size_t>(node) + 2);
      }
      not_up("slurmd: nodes not idle:" + not_idle, first);
    }
    std::this_thread::sleep_for(kPoll);
  }
}

void SlurmCluster::not_up(const std::string& what, const Daemon* daemon) const {
  std::string message =
      fmt::format("SlurmCluster: {} not up within {} s", what,
                  std::chrono::duration_cast<std::chrono::seconds>(kDaemonUp).count());
  if (daemon != nullptr) {
    message += fmt::format("; the end of {}'s log ({}):\n{}", daemon->name, daemon->log,
                           tail(daemon->log));
  }
  throw std::runtime_error(message);
}

Subprocess SlurmCluster::client(const std::vector<std::string>& argv,
                                const std::map<std::string, std::string>& env) const {
  std::map<std::string, std::string> all = env;
  all["SLURM_CONF"] = conf();
  std::vector<std::string> merged = {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1"};
  merged.insert(merged.end(), argv.begin(), argv.end());
  return Subprocess(hosts_.daemon_command(0, merged, all));
}

std::string SlurmCluster::run(const std::vector<std::string>& argv,
                              const std::map<std::string, std::string>& env,
                              std::chrono::seconds guard) const {
  Subprocess process = client(argv, env);
  const std::string out = process.read_all(guard);
  if (const int status = process.wait(); status != 0) {
    throw std::runtime_error(fmt::format("SlurmCluster: `{}` failed (exit {}): {}",
                                         fmt::join(argv, " "), status, out));
  }
  return out;
}

Subprocess SlurmCluster::srun(const std::vector<std::string>& args,
                              const std::map<std::string, std::string>& env) const {
  std::vector<std::string> argv = {program("srun")};
  argv.insert(argv.end(), args.begin(), args.end());
  return client(argv, env);
}

std::string SlurmCluster::sbatch(const std::string& script,
                                 const std::vector<std::string>& args,
                                 const std::map<std::string, std::string>& env) {
  const std::string path = fmt::format("{}/jobs/job{}.sh", dir_, scripts_++);
  write_file(path, script,
             fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                 fs::perms::others_read | fs::perms::others_exec);
  std::vector<std::string> argv = {program("sbatch"), "--parsable",
                                   "--chdir=" + dir_ + "/jobs",
                                   "--output=" + dir_ + "/jobs/slurm-%j.out"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back(path);
  const std::string out = run(argv, env);
  std::smatch m;
  if (!std::regex_search(out, m, std::regex(R"((?:^|\n)(\d+)(?:;\S*)?\s*$)"))) {
    throw std::runtime_error("SlurmCluster: sbatch printed no job id: " + out);
  }
  return m[1];
}

std::string SlurmCluster::output_of(const std::string& id) const {
  return fmt::format("{}/jobs/slurm-{}.out", dir_, id);
}

SlurmCluster::JobEnd SlurmCluster::wait_job(const std::string& id,
                                            std::chrono::seconds timeout) const {
  const auto deadline = Clock::now() + timeout;
  std::string last;
  for (;;) {
    Subprocess show = client({program("scontrol"), "-o", "show", "job", id});
    last = show.read_all(std::chrono::seconds(30));
    show.wait();
    std::smatch state;
    std::smatch code;
    if (std::regex_search(last, state, std::regex(R"(JobState=(\S+))")) &&
        std::regex_search(last, code, std::regex(R"(\bExitCode=(\S+))")) &&
        !job_running(state[1])) {
      return JobEnd{state[1], code[1]};
    }
    if (Clock::now() > deadline) {
      throw std::runtime_error(
          fmt::format("SlurmCluster: job {} has not ended within {} s: {}", id,
                      timeout.count(), last));
    }
    std::this_thread::sleep_for(kPoll);
  }
}

std::map<std::string, std::string> SlurmCluster::node_states() const {
  std::istringstream lines(run({program("sinfo"), "-h", "-N", "-o", "%N %T"}));
  std::map<std::string, std::string> states;
  for (std::string name, state; lines >> name >> state;) states[name] = state;
  return states;
}

std::string SlurmCluster::job_processes() const {
  std::set<int> daemons;
  for (const Daemon& d : daemons_) {
    if (!exited(d.process.pid())) daemons.insert(d.process.pid());
  }
  std::string found;
  for (int host = 0; host < hosts_.size(); ++host) {
    for (const int pid : hosts_.pids(host)) {
      // slurmctld's own helper, which runs its scripts.
      if (daemons.count(parent(pid)) > 0 && comm(pid) == "slurmscriptd") continue;
      if (daemons.count(pid) == 0)
        found += fmt::format(" host{}: {} ({})", host, pid, comm(pid));
    }
  }
  return found;
}

std::string SlurmCluster::wait_quiet(std::chrono::seconds timeout) const {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    std::string left = job_processes();
    std::map<std::string, std::string> states;
    try {
      states = node_states();
    } catch (const std::exception& e) {
      left += fmt::format(" (sinfo: {})", e.what());
    }
    for (int node = 0; node < nodes_; ++node) {
      const Daemon& slurmd = daemons_.at(static_cast<size_t>(node) + 2);
      const std::string& state = states[node_name(node)];
      if (!exited(slurmd.process.pid()) && state != "idle") {
        left +=
            fmt::format(" {} is {}", node_name(node), state.empty() ? "unknown" : state);
      }
    }
    if (left.empty()) return {};
    if (Clock::now() > deadline)
      return "still there after " + std::to_string(timeout.count()) + " s:" + left;
    std::this_thread::sleep_for(kPoll);
  }
}

void SlurmCluster::kill_node(int node) {
  hosts_.pids(node);  // range check (and the controller's host is no node)
  if (node < 0 || node >= nodes_) throw std::out_of_range("SlurmCluster::kill_node");
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  for (;;) {
    const std::vector<int> pids = hosts_.pids(node);
    if (pids.empty()) return;
    for (const int pid : pids) ::kill(pid, SIGKILL);
    if (Clock::now() > deadline) {
      throw std::runtime_error(
          fmt::format("SlurmCluster: processes of {} survive SIGKILL", node_name(node)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void SlurmCluster::stop() {
  if (stopped_) return;
  stopped_ = true;
  // Every job, while the controller answers.
  try {
    if (!daemons_.empty() && daemons_.size() > 1 && !exited(daemons_[1].process.pid())) {
      std::istringstream ids(
          run({program("squeue"), "-h", "-o", "%i"}, {}, std::chrono::seconds(10)));
      std::vector<std::string> argv = {program("scancel")};
      for (std::string id; ids >> id;) argv.push_back(id);
      if (argv.size() > 1) run(argv, {}, std::chrono::seconds(10));
    }
  } catch (const std::exception&) {
    // Killed below with everything else.
  }
  stop_daemons();
  // What the daemons left (steps, tasks, clients): killed by pid, host by host.
  for (int host = 0; host < hosts_.size(); ++host) {
    for (int round = 0; round < 50; ++round) {
      const std::vector<int> pids = hosts_.pids(host);
      if (pids.empty()) break;
      for (const int pid : pids) ::kill(pid, SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

void SlurmCluster::stop_daemons() {
  // slurmds first, then slurmctld, then munged, which both use.
  std::vector<Daemon*> order;
  for (size_t i = daemons_.size(); i-- > 0;) order.push_back(&daemons_[i]);
  for (Daemon* d : order) {
    d->process.kill(SIGTERM);
    const auto deadline = Clock::now() + kDaemonStop;
    while (!exited(d->process.pid()) && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    d->process.kill(SIGKILL);
    d->process.wait();
  }
}

}  // namespace sbtest
