// The README's examples run as a user runs them: the custom backend
// example alone, the minimal RPC program as two workers under the
// launcher. Their output is what the README shows.
#include <fmt/format.h>

#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "store/tcp_store_server.h"
#include "tests/util/subprocess.h"

using sbtest::Subprocess;

namespace {

// A port nobody listens on now (bound to 0 and closed): torchrun needs one
// for its agent's store or c10d endpoint.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// torchrun: PyTorch 2.11's, from the project's virtual environment
// (@sb_venv).
std::vector<std::string> torchrun_command() {
  return {sbtest::runfile("external/sb_venv/python"), "-m", "torch.distributed.run"};
}

// True (after printing why) where torchrun cannot run.
bool skip_without_torchrun() {
  Subprocess probe({torchrun_command()[0], "-c", "import torch.distributed.run"});
  probe.read_all();
  if (probe.wait() == 0) return false;
  WARN("skipped: no PyTorch in the project's virtual environment (tools/setup)");
  std::printf("skipped: no PyTorch in the project's virtual environment (tools/setup)\n");
  return true;
}

}  // namespace

TEST_CASE("the custom backend example serves a call over LOOPBACK and times one out",
          "[examples]") {
  Subprocess example({sbtest::runfile("examples/custom_backend")});
  const std::string out = example.read_all();
  CHECK(example.wait() == 0);
  CHECK(out ==
        "hello, LOOPBACK\n"
        "rpc to \"solo\" function \"nap\": timed out after 50 ms\n"
        "greet: 1 sent, 1 served; nap: 1 timed out\n");
}

TEST_CASE("the minimal RPC example runs as two workers under the launcher",
          "[examples]") {
  // The launcher's own lines go to stderr (the test log); the workers'
  // stdout, prefixed with their rank, comes through stdout.
  Subprocess launch({sbtest::runfile("tools/launch/launch"), "--nproc", "2", "--",
                     sbtest::runfile("examples/rpc_minimal")});
  const std::string out = launch.read_all();
  CHECK(launch.wait() == 0);
  CHECK_THAT(out, Catch::Contains("[rank 0] worker0: add on worker1 gave 40, scale gave 2.5"));
  CHECK_THAT(out, Catch::Contains("[rank 1] worker1: add on worker0 gave 41, scale gave 2.5"));
}

TEST_CASE("the minimal RPC example that cannot start says why and exits 1, without aborting",
          "[examples]") {
  // Rank 0 would host the store on a port another store holds (as under
  // torchrun without its agent store): init_rpc throws.
  switchboard::TcpStoreServer taken;
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(taken.port()).c_str(), 1);
  Subprocess example({sbtest::runfile("examples/rpc_minimal")});
  (void)example.read_all();
  const int status = example.wait();
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) ::unsetenv(name);
  CHECK(status == 1);  // not 128 + SIGABRT ("terminate called ...")
}

TEST_CASE("the minimal RPC example runs under torchrun, with the static and the c10d "
          "rendezvous",
          "[examples][torchrun]") {
  if (skip_without_torchrun()) return;
  const std::string port = std::to_string(free_port());
  const std::vector<std::vector<std::string>> rendezvous = {
      {"--master_addr", "127.0.0.1", "--master_port", port},
      {"--rdzv_backend", "c10d", "--rdzv_endpoint", "127.0.0.1:" + port}};
  for (const auto& how : rendezvous) {
    INFO(how[0]);
    std::vector<std::string> argv = torchrun_command();
    argv.insert(argv.end(), {"--nnodes", "1", "--nproc_per_node", "2", "--redirects", "1",
                             "--tee", "1"});
    argv.insert(argv.end(), how.begin(), how.end());
    argv.insert(argv.end(), {"--no_python", sbtest::runfile("examples/rpc_minimal")});
    Subprocess torchrun(argv);
    const std::string out = torchrun.read_all();
    CHECK(torchrun.wait() == 0);
    CHECK_THAT(out, Catch::Contains("[default0]:worker0: add on worker1 gave 40, scale gave 2.5"));
    CHECK_THAT(out, Catch::Contains("[default1]:worker1: add on worker0 gave 41, scale gave 2.5"));
  }
}

TEST_CASE("under torchrun --max_restarts a worker SIGKILLed mid-job restarts the group, which "
          "meets in a fresh round and completes; without restarts the job fails",
          "[examples][torchrun][failure]") {
  if (skip_without_torchrun()) return;
  for (const char* restarts : {"1", "0"}) {
    INFO("--max_restarts " << restarts);
    std::vector<std::string> argv = torchrun_command();
    argv.insert(argv.end(),
                {"--nnodes", "1", "--nproc_per_node", "2", "--redirects", "1", "--tee", "1",
                 "--max_restarts", restarts, "--monitor_interval", "1", "--master_addr",
                 "127.0.0.1", "--master_port", std::to_string(free_port()), "--no_python",
                 sbtest::runfile("tests/examples/elastic_worker")});
    Subprocess torchrun(argv);
    const std::string out = torchrun.read_all();
    const int status = torchrun.wait();
    if (std::string(restarts) == "1") {
      // Attempt 0's rank 1 died serving rank 0's call, before answering;
      // attempt 1 met under its own prefix of torchrun's store and computed
      // the right sums.
      CHECK(status == 0);
      CHECK_THAT(out, !Catch::Contains("worker0 attempt 0: ") &&
                          !Catch::Contains("worker1 attempt 0: "));
      CHECK_THAT(out, Catch::Contains("[default0]:worker0 attempt 1: 40"));
      CHECK_THAT(out, Catch::Contains("[default1]:worker1 attempt 1: 41"));
    } else {
      CHECK(status != 0);
      CHECK_THAT(out, !Catch::Contains("attempt 1"));
    }
  }
}
