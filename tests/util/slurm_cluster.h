// A real SLURM cluster on namespace hosts, for tests: Debian's slurm-wlm
// 22.05 (slurmctld, one slurmd per node, each host with its own host name)
// authenticated by a private munged, started by the constructor and torn
// down by stop() or the destructor.
//
//   std::unique_ptr<sbtest::SlurmCluster> slurm =
//       sbtest::SlurmCluster::start({.nodes = 3});
//   if (!slurm) return;  // printed "skipped: <why>"
//   Subprocess step = slurm->srun({"-N3", "-n6", "/path/worker"});
//   const std::string id = slurm->sbatch(script, {"-N3"});
//   const sbtest::SlurmCluster::JobEnd end = slurm->wait_job(id);
//
// The layout: hosts 0 .. nodes-1 of a NetnsCluster with host names are the
// compute nodes, NodeName=host[0-N] at 198.18.0.[1-N+1]; one more host,
// host<nodes>, runs slurmctld and munged. Every daemon runs in the
// foreground, started with NetnsCluster::daemon_command (its host's network
// namespace, the cluster's /etc/hosts, its host name), as this process's
// child. One munged serves every host: its socket is a path on the shared
// file system (slurm.conf's AuthInfo=socket=...), as is everything else
// (slurm.conf, state, spool, logs, job output): dir(), which every host
// sees. No cgroups are used (proctrack/linuxproc, task/none) and nothing
// outside dir() is written.
//
// Clients (srun, sbatch, scontrol ...) run in host 0 under its name "host0"
// with SLURM_CONF set. Inside a namespace, because srun must reach the
// nodes and they must reach it back; under a NodeName, because slurmctld
// sends a step's node-failure message to the address of the step's host
// name, and an srun under any other name never learns that a node died
// and hangs.
//
// Readiness is polled, never slept for: `scontrol ping` until the
// controller is UP, then `sinfo` until every node is idle, each bounded,
// failing with what is not up and the daemon's log tail.
//
// Not thread-safe: one thread owns a cluster. Needs root, iproute2,
// util-linux and the packages slurmd, slurmctld, slurm-client and munge
// (tools/setup installs them).
#pragma once

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/util/netns_spawn.h"
#include "tests/util/subprocess.h"

namespace sbtest {

class SlurmCluster {
 public:
  struct Options {
    int nodes = 3;
    int cpus = 2;  // CPUs per node: srun -N3 -n6 puts two tasks on each
    // slurm.conf's SlurmdTimeout and MessageTimeout, in seconds: a node
    // whose processes all died is DOWN (and a step on it ends with "Node
    // failure on hostK") at most about SlurmdTimeout + 2 * (MessageTimeout
    // + 1) s later (7.5 s measured with these values).
    int slurmd_timeout = 4;
    int message_timeout = 2;
  };

  // Thrown by the constructor where SLURM cannot run on this machine
  // although unavailable() found everything (slurmd refusing this host's
  // cgroups, as SLURM 22.05 does without a cgroup file system it can use).
  struct Unavailable : std::runtime_error {
    using std::runtime_error::runtime_error;
  };

  // How a job ended: scontrol's JobState (COMPLETED, FAILED, NODE_FAIL,
  // CANCELLED, TIMEOUT ...) and ExitCode ("0:0").
  struct JobEnd {
    std::string state;
    std::string exit_code;
  };

  // Why SLURM clusters cannot be made here (not root, no namespaces, a
  // program missing); empty when they can.
  static std::string unavailable();
  // Makes a cluster; where it cannot run here (unavailable(), or the
  // constructor's Unavailable, remembered for later calls) prints
  // "skipped: <reason>" and returns null. Other failures throw.
  static std::unique_ptr<SlurmCluster> start(Options options);

  // Starts munged, slurmctld and one slurmd per node and waits until every
  // node is idle. Throws Unavailable (see above), or std::runtime_error
  // naming what did not come up, with its log's tail.
  explicit SlurmCluster(Options options);
  // stop(), then the hosts go (NetnsCluster kills what is left in them).
  ~SlurmCluster();
  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  const NetnsCluster& hosts() const { return hosts_; }
  int nodes() const { return nodes_; }
  // Node `node`'s name, "host<node>".
  std::string node_name(int node) const { return hosts_.host_name(node); }
  // The cluster's directory, seen by every host (slurm.conf, logs, job
  // output): for scripts and job files.
  const std::string& dir() const { return dir_; }

  // Runs `argv` in host 0 as a client (see above), with `env` added;
  // stdout and stderr come back on the pipe. The caller owns the process:
  // destroying it while it runs kills it. So for srun() below.
  Subprocess client(const std::vector<std::string>& argv,
                    const std::map<std::string, std::string>& env = {}) const;
  // Runs a client to its end (within `guard`); returns what it printed.
  // Throws std::runtime_error with its output when it fails.
  std::string run(const std::vector<std::string>& argv,
                  const std::map<std::string, std::string>& env = {},
                  std::chrono::seconds guard = std::chrono::seconds(30)) const;
  // srun `args` from host 0 (a job step in an allocation of its own), with
  // `env` added to srun's environment, which srun passes to its tasks.
  Subprocess srun(const std::vector<std::string>& args,
                  const std::map<std::string, std::string>& env = {}) const;
  // Writes `script` to a file in dir() and submits it with sbatch `args`
  // (from host 0, in dir()); returns the job id. The job's output goes to
  // output_of(id).
  std::string sbatch(const std::string& script, const std::vector<std::string>& args,
                     const std::map<std::string, std::string>& env = {});
  // Where sbatch() puts job `id`'s output.
  std::string output_of(const std::string& id) const;
  // Polls `scontrol -o show job ID` until the job has ended; throws
  // std::runtime_error after `timeout`, with the job's last state.
  JobEnd wait_job(const std::string& id,
                  std::chrono::seconds timeout = std::chrono::seconds(120)) const;
  // sinfo's state of each node ("idle", "down*" ...), by name.
  std::map<std::string, std::string> node_states() const;

  // Polls until no process of a job is left on any host (only the
  // daemons: slurmd on a node; slurmctld, its slurmscriptd and munged on
  // the controller's host) and every node that has a slurmd is idle; returns "" then, or
  // a description of what is still there after `timeout`.
  std::string wait_quiet(std::chrono::seconds timeout = std::chrono::seconds(30)) const;

  // SIGKILLs every process in node `node`'s host (slurmd, slurmstepd, the
  // tasks), as when the machine dies, until none is left.
  void kill_node(int node);

  // Cancels every job, stops every daemon by its pid (SIGTERM, then SIGKILL
  // after a bound), then kills whatever is left in the hosts. Idempotent.
  // Afterwards no process is left in any host.
  void stop();

 private:
  struct Daemon {
    std::string name;  // "slurmd host1", for messages
    std::string log;   // its log file
    Subprocess process;
  };

  NetnsCluster hosts_;
  int nodes_;
  int controller_;  // the host of slurmctld and munged
  std::string dir_;
  // munged, slurmctld, then node i's slurmd at 2 + i (a deque: launch()'s
  // references stay valid).
  std::deque<Daemon> daemons_;
  int scripts_ = 0;
  bool stopped_ = false;

  std::string conf() const { return dir_ + "/etc/slurm.conf"; }
  void write_files(const Options& options);
  Daemon& launch(int host, const std::string& name, const std::string& log,
                 const std::vector<std::string>& argv);
  void start_munged();
  void wait_controller();
  void wait_nodes_idle();
  [[noreturn]] void not_up(const std::string& what, const Daemon* daemon) const;
  void stop_daemons();
  std::string job_processes() const;
};

}  // namespace sbtest
