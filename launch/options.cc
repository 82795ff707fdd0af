#include "launch/options.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <string_view>
#include <system_error>

#include "common/cli.h"
#include "rendezvous/init_method.h"

namespace switchboard::launch {

namespace {

constexpr int kMaxProcesses = 4096;
constexpr double kMaxStopSeconds = 24 * 3600;

constexpr const char* kDescription =
    "Starts a store server and N local workers running PROGRAM ARGS, each with\n"
    "torchrun's environment: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,\n"
    "GROUP_RANK, NODE_RANK, MASTER_ADDR, MASTER_PORT, plus\n"
    "SWITCHBOARD_STORE=tcp://ADDR:PORT. On several nodes, run one launch per\n"
    "node with the same --nnodes, --master-addr and --master-port and its own\n"
    "--node-rank: node 0 runs the store server, the launchers wait for each\n"
    "other (--join-timeout) and the job runs and fails as one.\n"
    "Each worker also gets TORCHELASTIC_RESTART_COUNT (the attempt, from 0),\n"
    "TORCHELASTIC_MAX_RESTARTS and TORCHELASTIC_RUN_ID (the --job-id).\n"
    "Everything after \"--\" (or from the first argument that is not a flag)\n"
    "goes to the workers unchanged.";

constexpr const char* kFooter =
    "When a worker exits non-zero or is killed by a signal, the others get\n"
    "SIGTERM (SIGKILL after the timeout). With restarts left (--max-restarts),\n"
    "every node then starts all its workers again, as the next attempt;\n"
    "otherwise launch exits 1, naming the rank (on several nodes, every\n"
    "launcher names the node and rank that failed first). A signal to a\n"
    "launcher, a lost node or a lost store server ends the job at once.\n"
    "SIGINT, SIGTERM and SIGHUP are forwarded to every worker (on every node);\n"
    "launch then exits 128 + the signal number (a second signal kills the\n"
    "workers at once).\n"
    "Exit status: 0 all workers of one attempt exited 0; 1 a worker (in the\n"
    "last attempt), a node or the store server failed; 2 usage error; 128+S\n"
    "stopped by signal S.";

constexpr int kMaxNodes = 4096;
constexpr int kMaxRestarts = 10'000;
constexpr double kMaxJoinSeconds = 7 * 24 * 3600;

std::string slurm_variable(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    throw CLI::ValidationError(fmt::format(
        "--slurm: environment variable {} is not set (run launch with srun, one task per "
        "node)",
        name));
  }
  return value;
}

int slurm_int(const char* name, int min, int max) {
  const std::string text = slurm_variable(name);
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || value < min || value > max) {
    throw CLI::ValidationError(fmt::format(
        "--slurm: environment variable {}: expected an integer in [{}, {}], got \"{}\"", name,
        min, max, text));
  }
  return static_cast<int>(value);
}

// --slurm: what srun tells a launcher started once per node, for the flags
// the command line did not give.
void apply_slurm(const CLI::App& app, LaunchOptions& options) {
  const int nodes = slurm_int("SLURM_STEP_NUM_NODES", 1, kMaxNodes);
  const int tasks = slurm_int("SLURM_STEP_NUM_TASKS", 1, 1 << 30);
  if (tasks != nodes) {
    throw CLI::ValidationError(fmt::format(
        "--slurm: this step runs {} tasks on {} nodes; run one launch per node "
        "(srun --ntasks-per-node=1)",
        tasks, nodes));
  }
  if (app.count("--nnodes") == 0) options.nnodes = nodes;
  if (app.count("--node-rank") == 0) options.node_rank = slurm_int("SLURM_NODEID", 0, kMaxNodes - 1);
  const int job = slurm_int("SLURM_JOB_ID", 0, std::numeric_limits<int>::max());
  if (app.count("--job-id") == 0) options.job_id = fmt::format("slurm-{}", job);
  if (!options.store.empty()) return;
  if (app.count("--master-addr") == 0) {
    try {
      options.master_addr = rendezvous::slurm_first_node(slurm_variable("SLURM_STEP_NODELIST"));
    } catch (const std::invalid_argument& e) {
      throw CLI::ValidationError(fmt::format("--slurm: {}", e.what()));
    }
  }
  if (app.count("--master-port") == 0) options.master_port = rendezvous::slurm_store_port(job);
}

bool is_executable_file(const std::string& path) {
  std::error_code error;
  return std::filesystem::is_regular_file(path, error) &&
         ::access(path.c_str(), X_OK) == 0;
}

}  // namespace

void add_launch_flags(CLI::App& app, LaunchOptions* options) {
  app.name("launch");
  app.description(kDescription);
  app.footer(kFooter);
  cli::set_synopsis(app, "launch --nproc N [flags] [--] PROGRAM [ARGS...]");
  app.add_option("--nproc,--nproc-per-node", options->nproc, "number of workers on this node")
      ->type_name("N")
      ->required()
      ->check(cli::in_range(1, kMaxProcesses));
  app.add_option("--nnodes", options->nnodes, "number of nodes, one launch on each")
      ->type_name("N")
      ->check(cli::in_range(1, kMaxNodes));
  app.add_option("--node-rank", options->node_rank, "this node's rank, 0 to --nnodes - 1")
      ->type_name("R")
      ->check(cli::in_range(0, kMaxNodes - 1));
  app.add_option("--store", options->store,
                 "tcp://HOST:PORT of a running store_server to use instead of starting "
                 "one")
      ->type_name("URL")
      ->check(cli::non_empty("a URL"));
  app.add_option_function<double>(
         "--node-timeout",
         [options](double seconds) {
           options->node_timeout = std::chrono::milliseconds(std::llround(seconds * 1000));
         },
         "seconds node 0 waits for a node whose launcher stopped updating the store "
         "before failing the job")
      ->type_name("S")
      ->default_str(fmt::format("{}", options->node_timeout.count() / 1000.0))
      ->check(cli::number_in(1, kMaxJoinSeconds));
  app.add_option("--max-restarts,--max_restarts", options->max_restarts,
                 "restarts of the whole group (every node) after a worker fails before "
                 "the job fails; each worker gets TORCHELASTIC_RESTART_COUNT")
      ->type_name("N")
      ->check(cli::in_range(0, kMaxRestarts));
  app.add_option("--job-id", options->job_id,
                 "names this job's keys in the store; runs sharing one --store need "
                 "different ids")
      ->type_name("ID")
      ->check(cli::non_empty("an id"));
  app.add_option_function<double>(
         "--join-timeout",
         [options](double seconds) {
           options->join_timeout = std::chrono::milliseconds(std::llround(seconds * 1000));
         },
         "seconds the launchers of several nodes wait for each other")
      ->type_name("S")
      ->default_str(fmt::format("{}", options->join_timeout.count() / 1000.0))
      ->check(cli::number_in(0.001, kMaxJoinSeconds));
  app.add_option("--master-addr", options->master_addr,
                 "address the store server listens on and the workers connect to")
      ->type_name("ADDR")
      ->check(cli::non_empty("an address"));
  app.add_option("--master-port", options->master_port,
                 "store server port; 0 lets it pick one")
      ->type_name("PORT")
      ->check(cli::in_range(0, 65535));
  app.add_option("--store-server", options->store_server,
                 "store server binary (default: $SWITCHBOARD_STORE_SERVER, else "
                 "//tools/store_server from the runfiles or beside this binary)")
      ->type_name("PATH")
      ->check(cli::non_empty("a path"));
  app.add_option_function<double>(
         "--timeout-stop",
         [options](double seconds) {
           options->stop_timeout =
               std::chrono::milliseconds(std::llround(seconds * 1000));
         },
         "seconds stopped workers get before SIGKILL")
      ->type_name("S")
      ->default_str(fmt::format("{}", options->stop_timeout.count() / 1000.0))
      ->check(cli::number_in(0, kMaxStopSeconds));
  app.add_option("--secret-file", options->secret_file,
                 "the job secret, a file only its owner can read, the same on every node "
                 "(default: $SWITCHBOARD_SECRET_FILE, else one made for this job when this "
                 "launcher runs the store server on a single node)")
      ->type_name("PATH")
      ->check(cli::non_empty("a path"));
  app.add_flag("--slurm", options->slurm,
               "one launch per node under srun (srun --ntasks-per-node=1): --nnodes, "
               "--node-rank, --master-addr (the step's first node), --master-port (20000 + "
               "the job id % 10000) and --job-id from SLURM's variables, unless given");
  app.add_flag("--no-secret", options->no_secret,
               "run the job without a secret: the store server and the workers let in "
               "anyone who can reach them");
  app.add_flag_callback(
      "--no-prefix", [options] { options->prefix_output = false; },
      "leave worker output as is (default: \"[rank N] \" before every line of "
      "stdout and stderr)");
  app.add_option("PROGRAM", options->command, "the worker program and its arguments")
      ->option_text("[ARGS...]");
  // "--" or the first argument that is not a flag starts the worker command:
  // everything from there on is the worker's, flags included.
  app.positionals_at_end();
  app.callback([options, &app] {
    if (options->slurm) apply_slurm(app, *options);
    if (options->command.empty() || options->command[0].empty()) {
      throw CLI::ValidationError("no program given (put it after --)");
    }
    if (options->node_rank >= options->nnodes) {
      throw CLI::ValidationError(fmt::format("--node-rank {} is not below --nnodes {}",
                                             options->node_rank, options->nnodes));
    }
    if (!options->store.empty()) {
      try {
        const StoreAddress at = parse_store_url(options->store);
        options->master_addr = at.host;
        options->master_port = at.port;
      } catch (const std::invalid_argument& e) {
        throw CLI::ValidationError(e.what());
      }
    } else if (options->nnodes > 1 && options->master_port == 0) {
      throw CLI::ValidationError(fmt::format(
          "--nnodes {} needs --master-port (every node must know where node 0's store "
          "server listens) or --store",
          options->nnodes));
    }
    if (options->no_secret && !options->secret_file.empty()) {
      throw CLI::ValidationError("--secret-file and --no-secret contradict each other");
    }
    const char* env_secret = std::getenv("SWITCHBOARD_SECRET_FILE");
    if (options->nnodes > 1 && !options->no_secret && options->secret_file.empty() &&
        (env_secret == nullptr || *env_secret == '\0')) {
      throw CLI::ValidationError(fmt::format(
          "--nnodes {} needs a job secret that every node has: --secret-file PATH (the same "
          "file on every node, e.g. made with `head -c 32 /dev/urandom > PATH; chmod 600 "
          "PATH`) or SWITCHBOARD_SECRET_FILE; or --no-secret to let anyone who can reach "
          "the job in",
          options->nnodes));
    }
  });
}

std::string find_store_server(const std::string& argv0) {
  namespace fs = std::filesystem;
  if (const char* path = std::getenv("SWITCHBOARD_STORE_SERVER")) return path;
  const std::string runfile = "switchboard/tools/store_server/store_server";
  std::vector<std::string> candidates;
  if (const char* dir = std::getenv("RUNFILES_DIR")) {
    candidates.push_back(fmt::format("{}/{}", dir, runfile));
  }
  candidates.push_back(fmt::format("{}.runfiles/{}", argv0, runfile));
  std::error_code error;
  fs::path self = fs::read_symlink("/proc/self/exe", error);
  if (!error) {
    candidates.push_back(fmt::format("{}.runfiles/{}", self.string(), runfile));
    candidates.push_back((self.parent_path() / "../store_server/store_server").string());
    candidates.push_back((self.parent_path() / "store_server").string());
  }
  for (const auto& candidate : candidates) {
    if (!is_executable_file(candidate)) continue;
    fs::path absolute = fs::absolute(candidate, error);
    return error ? candidate : absolute.lexically_normal().string();
  }
  throw std::runtime_error(fmt::format(
      "cannot find the store server (tried {}); pass --store-server PATH or set "
      "SWITCHBOARD_STORE_SERVER",
      fmt::join(candidates, ", ")));
}

StoreAddress parse_store_url(const std::string& url) {
  constexpr std::string_view kScheme = "tcp://";
  // "tcp://" may be left out; no other scheme is understood.
  const bool tcp = url.rfind(kScheme, 0) == 0;
  const std::string_view rest = std::string_view(url).substr(tcp ? kScheme.size() : 0);
  const size_t colon = rest.rfind(':');
  if ((!tcp && url.find("://") != std::string::npos) || rest.empty() ||
      colon == std::string_view::npos || colon == 0 || colon + 1 == rest.size()) {
    throw std::invalid_argument(
        fmt::format("--store \"{}\" is not tcp://HOST:PORT", url));
  }
  std::string host(rest.substr(0, colon));
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  int port = 0;
  const std::string digits(rest.substr(colon + 1));
  if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 5 ||
      (port = std::stoi(digits)) < 1 || port > 65535) {
    throw std::invalid_argument(fmt::format(
        "--store \"{}\": the port must be 1 to 65535, got \"{}\"", url, digits));
  }
  return {host, static_cast<uint16_t>(port)};
}

std::string resolve_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::string_view dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    auto colon = dirs.find(':');
    std::string_view dir = dirs.substr(0, colon);
    std::string candidate = fmt::format("{}/{}", dir.empty() ? "." : dir, name);
    if (is_executable_file(candidate)) return candidate;
    if (colon == std::string_view::npos) return name;
    dirs.remove_prefix(colon + 1);
  }
}

}  // namespace switchboard::launch
