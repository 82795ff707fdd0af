// Switchboard under a real SLURM cluster (Debian's slurm-wlm 22.05 on
// network namespace hosts host0..host2, a controller on a fourth, munge;
// tests/util/slurm_cluster.h): srun starting the workers directly, which
// take their ranks from SLURM_PROCID/SLURM_NTASKS and the store's host from
// the job's first node, with a job secret the batch script made; sbatch
// running tools/launch once per node (docs/multi_host.md's recipe); and a
// node whose processes are all SIGKILLed mid-job, which ends the job
// naming it. Every case checks the workers' results, not only exit
// statuses, and that no process is left on any host: between jobs only the
// daemons, after the cluster's stop() nothing at all.
#include <fmt/format.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rendezvous/init_method.h"
#include "rpc/rpc.h"
#include "tests/util/slurm_cluster.h"
#include "tests/util/subprocess.h"

namespace {

namespace rpc = switchboard::rpc;
using sbtest::SlurmCluster;
using sbtest::Subprocess;
using Clock = std::chrono::steady_clock;

std::string self_exe() {
  char path[PATH_MAX] = {};
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  REQUIRE(n > 0);
  return std::string(path, static_cast<size_t>(n));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// What rpc_minimal's rank `rank` of `world` prints.
std::string minimal_line(int rank, int world) {
  return fmt::format("worker{}: add on worker{} gave {}, scale gave 2.5", rank,
                     (rank + 1) % world, rank + 40);
}

// A cluster of three nodes (two CPUs each), or null where it cannot run
// (printed "skipped: <why>").
std::unique_ptr<SlurmCluster> three_nodes() {
  const auto started = Clock::now();
  std::unique_ptr<SlurmCluster> slurm = SlurmCluster::start({.nodes = 3});
  if (slurm) {
    fmt::print("slurm_test: cluster up in {:.1f} s\n",
               std::chrono::duration<double>(Clock::now() - started).count());
  }
  return slurm;
}

// A batch job: its id, how it ended and what it printed.
struct Batch {
  std::string id;
  SlurmCluster::JobEnd end;
  std::string out;
};

// Submits `script` with sbatch and waits for the job to end.
Batch run_batch(SlurmCluster& slurm, const std::string& script) {
  const auto started = Clock::now();
  Batch batch;
  batch.id = slurm.sbatch(script, {});
  batch.end = slurm.wait_job(batch.id);
  batch.out = read_file(slurm.output_of(batch.id));
  fmt::print("slurm_test: job {} ended {} after {:.1f} s\n", batch.id, batch.end.state,
             std::chrono::duration<double>(Clock::now() - started).count());
  return batch;
}

// The job ended COMPLETED with exit code 0.
void check_completed(const Batch& batch) {
  CHECK(batch.end.state == "COMPLETED");
  CHECK(batch.end.exit_code == "0:0");
}

// No process of a job is left on any host; then, once the cluster is
// stopped, no process at all.
void check_nothing_left(SlurmCluster& slurm) {
  CHECK(slurm.wait_quiet() == "");
  slurm.stop();
  for (int host = 0; host < slurm.hosts().size(); ++host) {
    INFO("host " << host);
    CHECK(slurm.hosts().pids(host).empty());
  }
}

}  // namespace

// A worker of a static group that keeps calling the next rank, as a
// training step would, until a call fails: prints
// "worker<r> on <host> (job <id>): calling worker<next>" once its first
// call is answered, and "worker<r> on <host>: call <n> to worker<next>
// failed: <error>" when one fails, then exits 1. Exits 2 if nothing fails
// within two minutes. Rank, world size and the store from srun's variables.
SB_CHILD_MAIN(ring) {
  const int rank = switchboard::rendezvous::env_rank().value();
  const int world = switchboard::rendezvous::env_world_size().value();
  char host[HOST_NAME_MAX + 1] = {};
  ::gethostname(host, sizeof(host) - 1);
  const char* job = std::getenv("SLURM_JOB_ID");
  rpc::register_function("add", [](int64_t a, int64_t b) { return a + b; });
  rpc::init_rpc(fmt::format("worker{}", rank), rank, world);
  const std::string next = fmt::format("worker{}", (rank + 1) % world);
  rpc::rpc_sync<int64_t>(next, "add", int64_t{rank}, int64_t{40});
  fmt::print("worker{} on {} (job {}): calling {}\n", rank, host, job ? job : "-", next);
  std::fflush(stdout);
  const auto until = Clock::now() + std::chrono::minutes(2);
  for (int call = 2; Clock::now() < until; ++call) {
    try {
      rpc::rpc_sync<int64_t>(next, "add", int64_t{rank}, int64_t{call});
    } catch (const std::exception& e) {
      fmt::print("worker{} on {}: call {} to {} failed: {}\n", rank, host, call, next,
                 e.what());
      std::fflush(stdout);
      std::_Exit(1);  // as a job's worker would, without a graceful shutdown
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a step's pace
  }
  fmt::print("worker{}: no call failed within 2 minutes\n", rank);
  std::fflush(stdout);
  std::_Exit(2);
}

TEST_CASE(
    "srun starts rpc_minimal on three nodes of two tasks, with no launcher and no "
    "MASTER_ADDR, and the job secret the batch script made",
    "[multihost][slurm]") {
  std::unique_ptr<SlurmCluster> slurm = three_nodes();
  if (!slurm) return;
  // docs/multi_host.md, "One task per worker, without the launcher".
  const std::string script = fmt::format(R"sh(#!/bin/sh
#SBATCH --nodes=3
#SBATCH --ntasks-per-node=2
# The job secret, readable by its owner only, where every node sees it.
umask 077
secret="$SLURM_SUBMIT_DIR/job-$SLURM_JOB_ID.secret"
head -c 32 /dev/urandom > "$secret"
echo "secret: $(stat -c '%a %s' "$secret")"
export SWITCHBOARD_SECRET_FILE="$secret"
srun --kill-on-bad-exit=1 -l {}
status=$?
rm -f "$secret"
exit $status
)sh",
                                         sbtest::runfile("examples/rpc_minimal"));
  const Batch batch = run_batch(*slurm, script);
  const std::string& out = batch.out;
  INFO("job " << batch.id << " printed:\n" << out);
  check_completed(batch);
  CHECK_THAT(out, Catch::Contains("secret: 600 32"));
  // Task r is rank r: each called the next one's add.
  for (int rank = 0; rank < 6; ++rank) {
    CHECK_THAT(out, Catch::Contains(fmt::format("{}: {}", rank, minimal_line(rank, 6))));
  }
  CHECK_FALSE(
      std::ifstream(fmt::format("{}/jobs/job-{}.secret", slurm->dir(), batch.id)).good());
  check_nothing_left(*slurm);
}

TEST_CASE(
    "sbatch runs tools/launch once per node, with the first node's host name as the "
    "master address, and again with launch --slurm",
    "[multihost][slurm][launch]") {
  std::unique_ptr<SlurmCluster> slurm = three_nodes();
  if (!slurm) return;
  // docs/multi_host.md, "One launcher per node".
  const std::string script =
      fmt::format(R"sh(#!/bin/bash
#SBATCH --nodes=3
#SBATCH --ntasks-per-node=1
umask 077
export SECRET="$SLURM_SUBMIT_DIR/job-$SLURM_JOB_ID.secret"
head -c 32 /dev/urandom > "$SECRET"
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
echo "master: $MASTER_ADDR"
srun bash -c 'exec {launch} --nnodes "$SLURM_NNODES" --node-rank "$SLURM_NODEID" \
    --nproc-per-node 2 --master-addr "$MASTER_ADDR" --master-port 29500 \
    --secret-file "$SECRET" -- {program}'
status=$?
rm -f "$SECRET"
exit $status
)sh",
                  fmt::arg("launch", sbtest::runfile("tools/launch/launch")),
                  fmt::arg("program", sbtest::runfile("examples/rpc_minimal")));
  const Batch batch = run_batch(*slurm, script);
  const std::string& out = batch.out;
  INFO("job " << batch.id << " printed:\n" << out);
  check_completed(batch);
  CHECK_THAT(out, Catch::Contains("master: host0"));
  for (int rank = 0; rank < 6; ++rank)
    CHECK_THAT(out, Catch::Contains(minimal_line(rank, 6)));
  CHECK(slurm->wait_quiet() == "");

  // The same with `launch --slurm`, which takes the node count, its node's
  // rank and the store's address and port from srun's variables.
  const std::string short_script =
      fmt::format(R"sh(#!/bin/bash
#SBATCH --nodes=3
#SBATCH --ntasks-per-node=1
umask 077
export SECRET="$SLURM_SUBMIT_DIR/job-$SLURM_JOB_ID.secret"
head -c 32 /dev/urandom > "$SECRET"
srun {launch} --slurm --nproc-per-node 2 --secret-file "$SECRET" -- {program}
status=$?
rm -f "$SECRET"
exit $status
)sh",
                  fmt::arg("launch", sbtest::runfile("tools/launch/launch")),
                  fmt::arg("program", sbtest::runfile("examples/rpc_minimal")));
  const Batch second = run_batch(*slurm, short_script);
  INFO("job " << second.id << " (launch --slurm) printed:\n" << second.out);
  check_completed(second);
  for (int rank = 0; rank < 6; ++rank) {
    CHECK_THAT(second.out, Catch::Contains(minimal_line(rank, 6)));
  }
  check_nothing_left(*slurm);
}

TEST_CASE(
    "a node lost under srun --kill-on-bad-exit ends the job, and SLURM and the workers "
    "name it",
    "[multihost][slurm][failure]") {
  std::unique_ptr<SlurmCluster> slurm = three_nodes();
  if (!slurm) return;
  Subprocess step = slurm->srun({"-N3", "--ntasks-per-node=2", "--kill-on-bad-exit=1",
                                 "-l", self_exe(), "--sb-child", "ring"});
  // Every worker is in the group and has been answered once.
  std::string out;
  std::string job;
  for (int calling = 0; calling < 6;) {
    const std::string line = step.read_line();
    out += line + "\n";
    std::smatch m;
    if (std::regex_search(line, m, std::regex(R"(\(job (\d+)\): calling)"))) {
      job = m[1];
      ++calling;
    }
  }
  const auto killed = Clock::now();
  slurm->kill_node(2);
  out += step.read_all();
  const int status = step.wait();
  const double took = std::chrono::duration<double>(Clock::now() - killed).count();
  INFO("srun printed:\n" << out);
  fmt::print("slurm_test: srun ended {:.1f} s after host2 was killed\n", took);
  CHECK(status != 0);
  CHECK(took < 60);
  // SLURM had put tasks 4 and 5 on host2.
  CHECK_THAT(out, Catch::Contains("4: worker4 on host2 (job ") &&
                      Catch::Contains("5: worker5 on host2 (job "));
  // SLURM names the node; worker3 (host1) names the lost worker it called.
  CHECK_THAT(out, Catch::Contains("Node failure on host2"));
  CHECK(std::regex_search(
      out, std::regex(R"(worker3 on host1: call \d+ to worker4 failed: .*worker4)")));
  const SlurmCluster::JobEnd end = slurm->wait_job(job);
  CHECK(end.state == "NODE_FAIL");
  CHECK(slurm->node_states()["host2"].rfind("down", 0) == 0);
  CHECK(slurm->hosts().pids(2).empty());
  check_nothing_left(*slurm);
}
