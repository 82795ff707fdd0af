// The main job's RPC demo (tools/rpc_demo) run as tools/demo runs it: a
// parameter server and three trainers under the launcher, in --quick mode.
// Its own checks decide the exit status (the held-out loss fell tenfold,
// the trainers agree), so the test needs no timing: it checks the status
// and that the report lines are there.
#include <catch2/catch.hpp>
#include <string>

#include "tests/util/subprocess.h"

using sbtest::Subprocess;

TEST_CASE("the RPC demo trains as a ps and three trainers under the launcher",
          "[examples][rpc_demo]") {
  // The launcher's store server binds 127.0.0.1, port 0; the demo binds
  // PIPE and Gloo to 127.0.0.1 by default.
  Subprocess launch({sbtest::runfile("tools/launch/launch"), "--nproc", "4", "--",
                     sbtest::runfile("tools/rpc_demo/rpc_demo"), "--quick"});
  const std::string out = launch.read_all();
  INFO(out);
  CHECK(launch.wait() == 0);
  CHECK_THAT(out, Catch::Contains("[rank 0] ps: serving 3 trainers"));
  CHECK_THAT(out, Catch::Contains("[rank 0] ps: trainer-3 is done after 160 pushes; "
                                  "2 still training, batches of 2 now"));
  CHECK_THAT(out, Catch::Contains("[rank 0] ps:   updates 200 from 540 gradients"));
  CHECK_THAT(out, Catch::Contains("[rank 0] ps:   RPC calls served 1086 (push_grad 540, "
                                  "get_params 543, done 3)"));
  CHECK_THAT(out, Catch::Contains("[rank 0] ps: loss went down"));
  for (const char* trainer :
       {"[rank 1] trainer-1", "[rank 2] trainer-2", "[rank 3] trainer-3"}) {
    CHECK_THAT(out,
               Catch::Contains(std::string(trainer) +
                               ": trainers agree on the final parameters: "
                               "max |w_i - mean| = 0 over 64 values and 3 trainers"));
  }
}

TEST_CASE("the RPC demo fails when the loss does not go down", "[examples][rpc_demo]") {
  // Three steps cannot lower the loss tenfold: the ps says so and exits 1,
  // and the launcher reports it.
  Subprocess launch({sbtest::runfile("tools/launch/launch"), "--nproc", "3", "--",
                     sbtest::runfile("tools/rpc_demo/rpc_demo"), "--quick", "--steps",
                     "3"});
  const std::string out = launch.read_all();
  INFO(out);
  CHECK(launch.wait() == 1);
  CHECK_THAT(out, Catch::Contains("[rank 0] ps: FAILED: loss did not go down enough"));
}

TEST_CASE("the RPC demo refuses to run without a trainer", "[examples][rpc_demo]") {
  Subprocess launch({sbtest::runfile("tools/launch/launch"), "--nproc", "1", "--",
                     sbtest::runfile("tools/rpc_demo/rpc_demo"), "--quick"});
  (void)launch.read_all();
  CHECK(launch.wait() == 1);  // the launcher's status for a failed rank (2 here)
}
