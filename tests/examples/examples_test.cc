// The README's examples run as a user runs them: the custom backend
// example alone, the minimal RPC program as two workers under the
// launcher. Their output is what the README shows.
#include <fmt/format.h>

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <string>

#include "store/tcp_store_server.h"
#include "tests/util/subprocess.h"

using sbtest::Subprocess;

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
