// Switchboard workers under real torchrun (PyTorch 2.11's
// torch.distributed.run from the project's virtual environment, @sb_venv,
// with --no_python) across hosts (network
// namespaces with host names, as a cluster's DNS gives them): the static
// rendezvous (torchrun's agent hosts the store, workers are its clients
// under the attempt's prefix) and the c10d rendezvous (the agents meet at an
// endpoint; rank 0 hosts the workers' store on its node), a worker SIGKILLed
// mid-job with --max_restarts (the group restarts, meets in a fresh round
// and completes with the right sums), and a dynamic PIPE group restarted by
// torchrun (the restarted workers find the group of their attempt, never the
// failed one's). Every case checks the workers' results, not only the exit
// status, and that nothing is left in any host.
#include <fmt/format.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "tests/util/netns_spawn.h"
#include "tests/util/subprocess.h"

namespace {

using sbtest::spawn_in;
using sbtest::Subprocess;
using switchboard::netns::NetnsCluster;

constexpr const char* kPort = "29400";  // each cluster is a network of its own

// The project's virtual environment's Python, whose PyTorch runs torchrun.
std::string venv_python() { return sbtest::runfile("external/sb_venv/python"); }

// True (after printing why) where torchrun cannot run.
bool skip_without_torchrun() {
  if (NetnsCluster::skipped()) return true;
  Subprocess probe({venv_python(), "-c", "import torch.distributed.run"});
  probe.read_all();
  if (probe.wait() == 0 && ::access("/usr/bin/unshare", X_OK) == 0) return false;
  std::printf("skipped: no PyTorch in the project's virtual environment (tools/setup) or no "
              "unshare\n");
  return true;
}

// torchrun on host `node` of `nnodes`, `nproc` workers of `program`, with
// the rendezvous flags `rendezvous`, `extra` flags, stdout and stderr on the
// pipe.
Subprocess torchrun(const NetnsCluster& cluster, int node, int nnodes, int nproc,
                    const std::vector<std::string>& rendezvous, const std::string& program,
                    const std::vector<std::string>& extra = {},
                    const std::vector<std::string>& program_args = {}) {
  std::vector<std::string> argv = {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1",
                                   venv_python(), "-m", "torch.distributed.run",
                                   "--nnodes", std::to_string(nnodes), "--nproc_per_node",
                                   std::to_string(nproc), "--redirects", "1", "--tee", "1",
                                   "--monitor_interval", "1"};
  argv.insert(argv.end(), rendezvous.begin(), rendezvous.end());
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.insert(argv.end(), {"--no_python", sbtest::runfile(program)});
  argv.insert(argv.end(), program_args.begin(), program_args.end());
  return spawn_in(cluster, node, argv);
}

std::vector<std::string> static_rendezvous(const NetnsCluster& cluster, int node) {
  return {"--node_rank", std::to_string(node), "--master_addr", cluster.address(0),
          "--master_port", kPort};
}

std::vector<std::string> c10d_rendezvous(const NetnsCluster& cluster) {
  return {"--rdzv_backend", "c10d", "--rdzv_endpoint",
          fmt::format("{}:{}", cluster.host_name(0), kPort), "--rdzv_id", "job1"};
}

// Waits for every torchrun, returning what each printed; checks it exited
// with `status` (0, or non-zero when `status` is 1).
std::vector<std::string> finish(std::vector<Subprocess>& runs, int status) {
  std::vector<std::string> outs;
  for (size_t node = 0; node < runs.size(); ++node) {
    outs.push_back(runs[node].read_all());
    INFO("node " << node << "'s torchrun printed:\n" << outs.back());
    const int got = runs[node].wait();
    if (status == 0) {
      CHECK(got == 0);
    } else {
      CHECK(got != 0);
    }
  }
  return outs;
}

void check_nothing_left(const NetnsCluster& cluster) {
  for (int host = 0; host < cluster.size(); ++host) {
    INFO("host " << host);
    CHECK(cluster.pids(host).empty());
  }
}

// torchrun's prefix of local rank `local`'s lines.
std::string tee(int local) { return fmt::format("[default{}]:", local); }

}  // namespace

TEST_CASE("rpc_minimal under torchrun on two hosts of two workers, with the static and the "
          "c10d rendezvous",
          "[multihost][torchrun]") {
  if (skip_without_torchrun()) return;
  for (const bool c10d : {false, true}) {
    INFO((c10d ? "c10d" : "static"));
    NetnsCluster cluster({.hosts = 2, .host_names = true});
    std::vector<Subprocess> runs;
    for (int node = 0; node < 2; ++node) {
      runs.push_back(torchrun(cluster, node, 2, 2,
                              c10d ? c10d_rendezvous(cluster) : static_rendezvous(cluster, node),
                              "examples/rpc_minimal"));
    }
    const std::vector<std::string> outs = finish(runs, 0);
    // Every rank called the next one's add; which node has which ranks is
    // the rendezvous' choice under c10d, so look for each line anywhere.
    const std::string all = outs[0] + outs[1];
    for (int rank = 0; rank < 4; ++rank) {
      CHECK_THAT(all, Catch::Contains(fmt::format("worker{}: add on worker{} gave {}, scale gave 2.5",
                                                  rank, (rank + 1) % 4, rank + 40)));
    }
    if (!c10d) {
      CHECK_THAT(outs[0], Catch::Contains(tee(1) + "worker1: add on worker2 gave 41"));
      CHECK_THAT(outs[1], Catch::Contains(tee(1) + "worker3: add on worker0 gave 43"));
    }
    check_nothing_left(cluster);
  }
}

TEST_CASE("under torchrun --max_restarts on two hosts a worker SIGKILLed mid-job restarts the "
          "group, which meets in a fresh round and completes",
          "[multihost][torchrun][failure]") {
  if (skip_without_torchrun()) return;
  NetnsCluster cluster({.hosts = 2, .host_names = true});
  std::vector<Subprocess> runs;
  for (int node = 0; node < 2; ++node) {
    runs.push_back(torchrun(cluster, node, 2, 2, c10d_rendezvous(cluster),
                            "tests/examples/elastic_worker", {"--max_restarts", "1"}));
  }
  const std::vector<std::string> outs = finish(runs, 0);
  const std::string all = outs[0] + outs[1];
  // Attempt 0's rank 1 killed itself when first called, before answering;
  // attempt 1's four workers met and each added its rank to 40 on the next
  // one.
  for (int rank = 0; rank < 4; ++rank) {
    CHECK_THAT(all, Catch::Contains(fmt::format("worker{} attempt 1: {}", rank, rank + 40)));
  }
  // (worker2 and worker3 of attempt 0 may have had their answers from
  // worker3 and worker0 before the group failed; worker0's call went to the
  // dying worker1, and worker1 made none.)
  CHECK_THAT(all, !Catch::Contains("worker0 attempt 0"));
  CHECK_THAT(all, !Catch::Contains("worker1 attempt 0"));
  check_nothing_left(cluster);
}

TEST_CASE("a dynamic PIPE group under torchrun on two hosts: after a restart the workers find "
          "the group of their attempt, never the failed one's",
          "[multihost][torchrun][dynamic]") {
  if (skip_without_torchrun()) return;
  NetnsCluster cluster({.hosts = 2, .host_names = true});
  std::vector<Subprocess> runs;
  for (int node = 0; node < 2; ++node) {
    runs.push_back(torchrun(cluster, node, 2, 2, static_rendezvous(cluster, node),
                            "tests/examples/elastic_worker", {"--max_restarts", "1"},
                            {"--dynamic"}));
  }
  const std::vector<std::string> outs = finish(runs, 0);
  const std::string all = outs[0] + outs[1];
  // Attempt 0: four members, then rank 1 was lost and the others failed, so
  // that both agents restarted. Attempt 1's workers met under the agent
  // store's attempt_1 prefix and saw exactly the four of attempt 1 (a member
  // left over from attempt 0 would be a fifth name, or a name taken), and
  // completed the ring.
  CHECK_THAT(all, Catch::Contains("attempt 0: lost worker1"));
  for (int rank = 0; rank < 4; ++rank) {
    CHECK_THAT(all, Catch::Contains(fmt::format(
                        "worker{} attempt 1: {} (members worker0,worker1,worker2,worker3)", rank,
                        rank + 40)));
  }
  check_nothing_left(cluster);
}
