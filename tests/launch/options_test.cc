// The launcher's flags (launch/options.h) without starting anything:
// what they accept, what they refuse and with which message, and that the
// worker's command is passed on unchanged.
#include "launch/options.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "common/cli.h"

namespace cli = switchboard::cli;
using switchboard::launch::add_launch_flags;
using switchboard::launch::LaunchOptions;
using Args = std::vector<std::string>;

namespace {

using Parsed = cli::Parsed<LaunchOptions>;

Parsed parse(const Args& args) { return cli::parse_flags(add_launch_flags, args); }

}  // namespace

TEST_CASE("launch flags: defaults with only --nproc and a program", "[launch][cli]") {
  Parsed p = parse({"--nproc", "4", "worker"});
  INFO(p.outcome.error);
  REQUIRE(p.outcome.ok());
  CHECK(p.flags.nproc == 4);
  CHECK(p.flags.master_addr == "127.0.0.1");
  CHECK(p.flags.master_port == 0);
  CHECK(p.flags.store_server.empty());
  CHECK(p.flags.stop_timeout == std::chrono::milliseconds(5000));
  CHECK(p.flags.max_restarts == 0);
  CHECK(p.flags.prefix_output);
  CHECK(p.flags.command == Args{"worker"});
}

TEST_CASE("launch flags: --max-restarts, and torchrun's --max_restarts",
          "[launch][cli]") {
  auto [args, restarts] = GENERATE(table<Args, int>({
      {{"--nproc", "2", "--max-restarts", "3", "worker"}, 3},
      {{"--nproc", "2", "--max-restarts=0", "worker"}, 0},
      {{"--nproc", "2", "--max_restarts", "1", "worker"}, 1},
      {{"--nproc", "2", "--max_restarts=10000", "--", "worker"}, 10000},
  }));
  Parsed p = parse(args);
  INFO(p.outcome.error);
  REQUIRE(p.outcome.ok());
  CHECK(p.flags.max_restarts == restarts);
  CHECK(p.flags.command == Args{"worker"});
}

TEST_CASE("launch flags: every flag, in both forms", "[launch][cli]") {
  Parsed p = parse({"--nproc=2", "--master-addr", "localhost", "--master-port=29517",
                    "--store-server", "/bin/store", "--timeout-stop", "0.2",
                    "--no-prefix", "--", "worker"});
  INFO(p.outcome.error);
  REQUIRE(p.outcome.ok());
  CHECK(p.flags.nproc == 2);
  CHECK(p.flags.master_addr == "localhost");
  CHECK(p.flags.master_port == 29517);
  CHECK(p.flags.store_server == "/bin/store");
  CHECK(p.flags.stop_timeout == std::chrono::milliseconds(200));
  CHECK_FALSE(p.flags.prefix_output);
  CHECK(p.flags.command == Args{"worker"});
}

TEST_CASE("launch flags: several nodes, torchrun's spelling", "[launch][cli]") {
  Parsed p = parse({"--nnodes", "4", "--node-rank=3", "--nproc-per-node", "8",
                    "--master-addr", "10.0.0.1", "--master-port", "29500", "--join-timeout",
                    "2.5", "--job-id", "run7", "--node-timeout", "4", "--secret-file", "/s",
                    "--", "worker"});
  INFO(p.outcome.error);
  REQUIRE(p.outcome.ok());
  CHECK(p.flags.nnodes == 4);
  CHECK(p.flags.node_rank == 3);
  CHECK(p.flags.nproc == 8);
  CHECK(p.flags.master_addr == "10.0.0.1");
  CHECK(p.flags.master_port == 29500);
  CHECK(p.flags.join_timeout == std::chrono::milliseconds(2500));
  CHECK(p.flags.job_id == "run7");
  CHECK(p.flags.node_timeout == std::chrono::milliseconds(4000));
  CHECK(p.flags.store.empty());
}

TEST_CASE("launch flags: --store names an existing store server, which is where the "
          "workers go",
          "[launch][cli]") {
  auto [url, host, port] = GENERATE(table<std::string, std::string, int>({
      {"tcp://10.0.0.5:29600", "10.0.0.5", 29600},
      {"tcp://[fd00::1]:7", "fd00::1", 7},
      {"node-0.cluster:29500", "node-0.cluster", 29500},
  }));
  Parsed p = parse({"--nnodes", "2", "--node-rank", "1", "--nproc", "1", "--store", url,
                    "--no-secret", "--", "worker"});
  INFO(url << ": " << p.outcome.error);
  REQUIRE(p.outcome.ok());
  CHECK(p.flags.store == url);
  CHECK(p.flags.master_addr == host);
  CHECK(p.flags.master_port == port);
}

TEST_CASE("launch flags: the worker's command is kept as given, flags and -- included",
          "[launch][cli]") {
  auto [args, command] = GENERATE(table<Args, Args>({
      {{"--nproc", "1", "--", "prog", "--nproc", "3", "--", "-h"},
       {"prog", "--nproc", "3", "--", "-h"}},
      {{"--nproc", "1", "prog", "--quick", "--steps=5", "x"},
       {"prog", "--quick", "--steps=5", "x"}},
      {{"--nproc", "1", "--", "--weird", ""}, {"--weird", ""}},
      {{"--nproc", "1", "--", "prog", "--help"}, {"prog", "--help"}},
  }));
  Parsed p = parse(args);
  INFO(p.outcome.error);
  REQUIRE(p.outcome.ok());
  CHECK(p.flags.command == command);
}

// The cases of launch_test's "usage errors exit 2 with the usage text", at
// the parser, with the message each gives.
TEST_CASE("launch flags: usage errors name the flag and the value", "[launch][cli]") {
  auto [args, error] = GENERATE(table<Args, std::string>({
      {Args{}, "--nproc is required"},
      {{"--nproc"}, "--nproc needs a value"},
      {{"--nproc", "0"}, "--nproc: '0' is not an integer from 1 to 4096"},
      {{"--nproc", "x"}, "--nproc: 'x' is not an integer from 1 to 4096"},
      {{"--nproc", "4097", "--", "true"},
       "--nproc: '4097' is not an integer from 1 to 4096"},
      {{"--nproc", "2"}, "no program given (put it after --)"},
      {{"--nproc", "2", "--"}, "no program given (put it after --)"},
      {{"--bogus", "--nproc", "2", "--", "true"}, "unknown flag '--bogus'"},
      {{"--nproc", "2", "--master-port", "70000", "--", "true"},
       "--master-port: '70000' is not an integer from 0 to 65535"},
      {{"--nproc", "2", "--timeout-stop", "-1", "--", "true"},
       "--timeout-stop: '-1' is not a number from 0 to 86400"},
      {{"--nproc", "2", "--timeout-stop", "nan", "--", "true"},
       "--timeout-stop: 'nan' is not a number from 0 to 86400"},
      {{"--nproc", "2", "--master-addr=", "--", "true"},
       "--master-addr: wants an address, not '--'"},
      {{"--nproc", "2", "--store-server=", "--", "true"},
       "--store-server: wants a path, not '--'"},
      {{"--nproc", "2", "--nnodes", "2", "--node-rank", "2", "--master-port", "1", "--",
        "true"},
       "--node-rank 2 is not below --nnodes 2"},
      {{"--nproc", "2", "--nnodes", "2", "--", "true"},
       "--nnodes 2 needs --master-port (every node must know where node 0's store server "
       "listens) or --store"},
      {{"--nproc", "2", "--store", "tcp://host", "--", "true"},
       "--store \"tcp://host\" is not tcp://HOST:PORT"},
      {{"--nproc", "2", "--store", "tcp://host:0", "--", "true"},
       "--store \"tcp://host:0\": the port must be 1 to 65535, got \"0\""},
      {{"--nproc", "2", "--nnodes", "0", "--", "true"},
       "--nnodes: '0' is not an integer from 1 to 4096"},
      {{"--nproc", "2", "--nnodes", "2", "--master-port", "1", "--", "true"},
       "--nnodes 2 needs a job secret that every node has: --secret-file PATH (the same "
       "file "
       "on every node, e.g. made with `head -c 32 /dev/urandom > PATH; chmod 600 PATH`) "
       "or "
       "SWITCHBOARD_SECRET_FILE; or --no-secret to let anyone who can reach the job in"},
      {{"--nproc", "2", "--secret-file", "/s", "--no-secret", "--", "true"},
       "--secret-file and --no-secret contradict each other"},
      {{"--nproc", "2", "--max-restarts", "-1", "--", "true"},
       "--max-restarts: '-1' is not an integer from 0 to 10000"},
      {{"--nproc", "2", "--max_restarts", "10001", "--", "true"},
       "--max-restarts: '10001' is not an integer from 0 to 10000"},
      {{"--nproc", "2", "--max-restarts", "x", "--", "true"},
       "--max-restarts: 'x' is not an integer from 0 to 10000"},
  }));
  Parsed p = parse(args);
  CHECK_FALSE(p.outcome.help);
  CHECK(p.outcome.error == error);
}

TEST_CASE("launch flags: -h and --help before the program ask for help",
          "[launch][cli]") {
  Args args = GENERATE(Args{"-h"}, Args{"--help"}, Args{"--nproc", "2", "--help", "prog"},
                       Args{"--nproc", "0", "-h"});
  CHECK(parse(args).outcome.help);
}

TEST_CASE("launch flags: the help starts with the usage line and lists every flag",
          "[launch][cli]") {
  LaunchOptions options;
  CLI::App app;
  add_launch_flags(app, &options);
  const std::string help = cli::help_text(app);
  INFO(help);
  CHECK(help.rfind("usage: launch --nproc N [flags] [--] PROGRAM [ARGS...]\n", 0) == 0);
  for (const char* flag :
       {"--nproc N", "--master-addr ADDR", "--master-port PORT", "--store-server PATH",
        "--timeout-stop S", "--no-prefix", "--nproc-per-node", "--nnodes N",
        "--node-rank R", "--store URL", "--secret-file PATH", "--no-secret",
        "--join-timeout S", "--job-id ID", "--node-timeout S",
        "--max-restarts, --max_restarts N", "TORCHELASTIC_RESTART_COUNT"}) {
    CHECK_THAT(help, Catch::Contains(flag));
  }
  CHECK_THAT(help, Catch::Contains("(0 to 86400;") && Catch::Contains("default 5)"));
}

namespace {

// Sets SLURM's variables for one test case and clears them afterwards.
class SlurmEnv {
 public:
  explicit SlurmEnv(const std::vector<std::pair<const char*, const char*>>& values) {
    for (const char* name : kNames) ::unsetenv(name);
    for (const auto& [name, value] : values) ::setenv(name, value, 1);
  }
  ~SlurmEnv() {
    for (const char* name : kNames) ::unsetenv(name);
  }

 private:
  static constexpr const char* kNames[] = {"SLURM_STEP_NUM_NODES", "SLURM_STEP_NUM_TASKS",
                                           "SLURM_NODEID", "SLURM_STEP_NODELIST",
                                           "SLURM_JOB_ID", "SWITCHBOARD_SECRET_FILE"};
};

}  // namespace

TEST_CASE("launch flags: --slurm takes the nodes, this node's rank, the store's address and "
          "port and the job id from srun; flags given win",
          "[launch][cli][slurm]") {
  SlurmEnv env({{"SLURM_STEP_NUM_NODES", "3"},
                {"SLURM_STEP_NUM_TASKS", "3"},
                {"SLURM_NODEID", "2"},
                {"SLURM_STEP_NODELIST", "gpu[07-09]"},
                {"SLURM_JOB_ID", "4321"}});
  Parsed p = parse({"--slurm", "--nproc", "8", "--secret-file", "/s", "--", "worker"});
  INFO(p.outcome.error);
  REQUIRE(p.outcome.ok());
  CHECK(p.flags.nnodes == 3);
  CHECK(p.flags.node_rank == 2);
  CHECK(p.flags.master_addr == "gpu07");
  CHECK(p.flags.master_port == 24321);
  CHECK(p.flags.job_id == "slurm-4321");
  Parsed given = parse({"--slurm", "--nproc", "8", "--secret-file", "/s", "--master-addr",
                        "10.0.0.1", "--master-port", "29500", "--job-id", "j", "--", "worker"});
  INFO(given.outcome.error);
  REQUIRE(given.outcome.ok());
  CHECK(given.flags.master_addr == "10.0.0.1");
  CHECK(given.flags.master_port == 29500);
  CHECK(given.flags.job_id == "j");
  CHECK(given.flags.node_rank == 2);
}

TEST_CASE("launch flags: --slurm outside srun, or with several tasks per node, is refused "
          "naming why",
          "[launch][cli][slurm]") {
  {
    SlurmEnv env({});
    Parsed p = parse({"--slurm", "--nproc", "2", "--secret-file", "/s", "worker"});
    CHECK_FALSE(p.outcome.ok());
    CHECK_THAT(p.outcome.error, Catch::Contains("SLURM_STEP_NUM_NODES is not set"));
  }
  {
    SlurmEnv env({{"SLURM_STEP_NUM_NODES", "2"},
                  {"SLURM_STEP_NUM_TASKS", "16"},
                  {"SLURM_NODEID", "0"},
                  {"SLURM_STEP_NODELIST", "n[1-2]"},
                  {"SLURM_JOB_ID", "5"}});
    Parsed p = parse({"--slurm", "--nproc", "2", "--secret-file", "/s", "worker"});
    CHECK_FALSE(p.outcome.ok());
    CHECK_THAT(p.outcome.error, Catch::Contains("16 tasks on 2 nodes"));
  }
  {
    SlurmEnv env({{"SLURM_STEP_NUM_NODES", "2"},
                  {"SLURM_STEP_NUM_TASKS", "2"},
                  {"SLURM_NODEID", "x"},
                  {"SLURM_STEP_NODELIST", "n[1-2]"},
                  {"SLURM_JOB_ID", "5"}});
    Parsed p = parse({"--slurm", "--nproc", "2", "--secret-file", "/s", "worker"});
    CHECK_FALSE(p.outcome.ok());
    CHECK_THAT(p.outcome.error, Catch::Contains("SLURM_NODEID") && Catch::Contains("\"x\""));
  }
}
