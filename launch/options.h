// Command line of the launcher (//launch, run by tools/launch): its options,
// their flags (CLI11, through //common:cli) and where the store server binary
// is found.
//
// Thread safety: plain functions over values; nothing is shared.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI

namespace switchboard::launch {

struct LaunchOptions {
  int nproc = 0;                          // workers to start on this node (>= 1)
  // Several nodes (torchrun's --nnodes/--node-rank): one launcher per node;
  // node 0 runs the store server unless `store` names one. Global ranks are
  // node_rank * nproc + local rank.
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";  // where the store server listens
  uint16_t master_port = 0;               // 0: the store server picks one
  // "tcp://HOST:PORT": an existing store server (no server is started).
  std::string store;
  // The store server binary (node 0 without --store only); empty:
  // find_store_server().
  std::string store_server;
  // Multi-node: how long the launchers wait for each other, and how often a
  // launcher looks at the job's state in the store while its workers run.
  std::chrono::milliseconds join_timeout{300'000};
  std::chrono::milliseconds monitor_interval{100};
  // Node 0 fails the job when another node's launcher has not updated its
  // heartbeat in the store for this long (a launcher killed, a host lost).
  std::chrono::milliseconds node_timeout{30'000};
  // Names this job's keys in the store ("launch/<job_id>/..."): runs that
  // share one store_server need different ids.
  std::string job_id = "job";
  // Restart policy (torchrun's --max_restarts): a worker failing in attempt
  // n < max_restarts stops the workers of every node and starts attempt
  // n + 1 everywhere; a failure in attempt max_restarts ends the job.
  // Nothing else is restartable (supervisor.h).
  int max_restarts = 0;
  // How long stopped workers (and the store server) get between the first
  // signal and SIGKILL.
  std::chrono::milliseconds stop_timeout{5000};
  // The job secret (docs/security.md): a file every node has (--secret-file),
  // else $SWITCHBOARD_SECRET_FILE, else one made for the job when this
  // launcher runs the store server on one node; none with --no-secret.
  std::string secret_file;
  bool no_secret = false;
  // --slurm: under srun, one launch per node; the flags not given come from
  // SLURM_STEP_NUM_NODES, SLURM_NODEID, SLURM_STEP_NODELIST's first node and
  // SLURM_JOB_ID (master port 20000 + id % 10000, job id "slurm-<id>").
  bool slurm = false;
  bool prefix_output = true;         // "[rank N] " before each output line
  std::vector<std::string> command;  // the worker program and its arguments
};

// Declares the launcher's flags on `app` (its name, help and checks) and
// where they go: *options, which must outlive the app. Flags take
// "--flag VALUE" or "--flag=VALUE"; "--" or the first argument that is not a
// flag starts the worker command, which is kept as given. Parsing then fails
// (cli::parse()'s error) on an unknown flag, a value out of range (naming the
// flag and the value), a missing --nproc, a missing program, a --node-rank
// not below --nnodes, several nodes without --master-port (or --store),
// several nodes without a job secret (--secret-file or
// $SWITCHBOARD_SECRET_FILE) or --no-secret, --secret-file with --no-secret,
// a --store that is not tcp://HOST:PORT, or --slurm outside srun (a SLURM
// variable missing or malformed, named) or with several tasks per node.
//
// --nproc-per-node and --max_restarts are torchrun's spellings of --nproc
// and --max-restarts.
void add_launch_flags(CLI::App& app, LaunchOptions* options);

// The store server binary to start when --store-server is not given:
// $SWITCHBOARD_STORE_SERVER, else tools/store_server/store_server in the
// runfiles of this binary ($RUNFILES_DIR, <argv0>.runfiles, or
// <real path>.runfiles), else beside it in bazel-bin
// (<dir>/../store_server/store_server) or in its own folder. Returns an
// absolute path when it can. Throws std::runtime_error listing what was
// tried when nothing is executable.
std::string find_store_server(const std::string& argv0);

// "tcp://HOST:PORT" or "HOST:PORT" (HOST may be "[v6]") as host and port;
// throws std::invalid_argument naming `url` otherwise.
struct StoreAddress {
  std::string host;
  uint16_t port = 0;
};
StoreAddress parse_store_url(const std::string& url);

// Resolves a program name the way execvp() would: a name with a '/' is
// returned as is; otherwise the first executable file of that name in $PATH,
// or the bare name (which then fails to execute) when there is none.
std::string resolve_program(const std::string& name);

}  // namespace switchboard::launch
