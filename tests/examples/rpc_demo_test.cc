// The main job's RPC demo (examples/rpc_demo) run as tools/demo runs it: a
// parameter server and four trainers under the launcher, in --quick mode,
// one of them joining the dynamic group mid-run and one leaving it.
// Its own checks decide the exit status (the held-out loss fell tenfold,
// the trainers agree), so the test needs no timing: it checks the status
// and that the report lines are there.
#include <catch2/catch.hpp>
#include <string>

#include "tests/util/subprocess.h"

using sbtest::Subprocess;

TEST_CASE("the RPC demo trains as a ps and four trainers, one joining mid-run and one "
          "leaving, under the launcher",
          "[examples][rpc_demo][dynamic]") {
  // The launcher's store server binds 127.0.0.1, port 0; the demo binds
  // PIPE and Gloo to 127.0.0.1 by default.
  Subprocess launch({sbtest::runfile("tools/launch/launch"), "--nproc", "5", "--",
                     sbtest::runfile("examples/rpc_demo/rpc_demo"), "--quick"});
  const std::string out = launch.read_all();
  INFO(out);
  CHECK(launch.wait() == 0);
  CHECK_THAT(out, Catch::Contains("[rank 0] ps: serving 4 trainers"));
  // The leaver: a third of its 187 steps, then out of the group.
  CHECK_THAT(out, Catch::Contains("[rank 0] ps: trainer-2 is done after 62 pushes"));
  CHECK_THAT(out, Catch::Contains("[rank 2] trainer-2: leaving the group after 62 of 187 "
                                  "steps"));
  CHECK_THAT(out, Catch::Contains("[rank 0] ps: trainer-2 left the group"));
  // The late joiner: let in at update 100 (half of trainer-1's steps).
  CHECK_THAT(out, Catch::Contains("[rank 0] ps: halfway (100 updates applied): letting "
                                  "trainer-4 join"));
  CHECK_THAT(out, Catch::Contains("[rank 0] ps: trainer-4 joined the group"));
  CHECK_THAT(out, Catch::Contains("[rank 4] trainer-4: joined the group mid-run"));
  CHECK_THAT(out, Catch::Contains("[rank 0] ps: trainer-4 is done after 160 pushes; "
                                  "every trainer is done"));
  // Counts that do not depend on timing (the number of updates does).
  CHECK_THAT(out, Catch::Contains("[rank 0] ps:   trainers 4 (steps 200/62/174/160)"));
  CHECK_THAT(out, Catch::Contains(" from 596 gradients"));
  CHECK_THAT(out, Catch::Contains("[rank 0] ps:   RPC calls served 1201 (push_grad 596, "
                                  "get_params 600, done/join/retire 5)"));
  CHECK_THAT(out, Catch::Contains("[rank 0] ps: loss went down"));
  for (const char* trainer :
       {"[rank 1] trainer-1", "[rank 3] trainer-3", "[rank 4] trainer-4"}) {
    CHECK_THAT(out,
               Catch::Contains(std::string(trainer) +
                               ": trainers agree on the final parameters: "
                               "max |w_i - mean| = 0 over 64 values and 3 trainers"));
  }
  CHECK_THAT(out, !Catch::Contains("[rank 2] trainer-2: trainers agree"));
}

TEST_CASE("the RPC demo with three trainers and nobody joining or leaving late",
          "[examples][rpc_demo]") {
  Subprocess launch({sbtest::runfile("tools/launch/launch"), "--nproc", "4", "--",
                     sbtest::runfile("examples/rpc_demo/rpc_demo"), "--quick",
                     "--late-joiner", "0", "--leaver", "0"});
  const std::string out = launch.read_all();
  INFO(out);
  CHECK(launch.wait() == 0);
  CHECK_THAT(out, Catch::Contains("[rank 0] ps: trainer-3 is done after 160 pushes; "
                                  "2 still training, batches of 2 now"));
  CHECK_THAT(out, Catch::Contains("[rank 0] ps:   updates 200 from 540 gradients"));
  CHECK_THAT(out, Catch::Contains("[rank 0] ps:   RPC calls served 1086 (push_grad 540, "
                                  "get_params 543, done/join/retire 3)"));
  CHECK_THAT(out, !Catch::Contains("left the group"));
  for (const char* trainer :
       {"[rank 1] trainer-1", "[rank 2] trainer-2", "[rank 3] trainer-3"}) {
    CHECK_THAT(out,
               Catch::Contains(std::string(trainer) +
                               ": trainers agree on the final parameters: "
                               "max |w_i - mean| = 0 over 64 values and 3 trainers"));
  }
}

TEST_CASE("the RPC demo with --metrics-port 0 serves metrics and reports them",
          "[examples][rpc_demo][metrics]") {
  Subprocess launch({sbtest::runfile("tools/launch/launch"), "--nproc", "4", "--",
                     sbtest::runfile("examples/rpc_demo/rpc_demo"), "--quick",
                     "--late-joiner", "0", "--leaver", "0", "--metrics-port", "0"});
  const std::string out = launch.read_all();
  INFO(out);
  CHECK(launch.wait() == 0);
  // get_metrics_snapshot(): the ps's served requests, trainer-1's calls.
  CHECK_THAT(out, Catch::Contains("[rank 0] ps:   metrics: served 540 push_grad requests "
                                  "(0 with an error)"));
  CHECK_THAT(out, Catch::Contains("[rank 1] trainer-1:   metrics: sent 200 push_grad calls, "
                                  "latency p50 "));
  // The ps's scrape of its own endpoint.
  CHECK_THAT(out, Catch::Contains("[rank 0] ps:     switchboard_rpc_requests_served_total{"
                                  "worker=\"ps\",function=\"push_grad\"} 540"));
  CHECK_THAT(out, Catch::Contains("[rank 0] ps:     switchboard_rpc_requests_served_total{"
                                  "worker=\"ps\",function=\"get_params\"} 543"));
}

TEST_CASE("the RPC demo refuses a leaver that is also the late joiner",
          "[examples][rpc_demo]") {
  // The usage error goes to stderr: the shell merges it into what we read.
  Subprocess launch({"/bin/sh", "-c",
                     sbtest::runfile("tools/launch/launch") + " --nproc 4 -- " +
                         sbtest::runfile("examples/rpc_demo/rpc_demo") +
                         " --quick --late-joiner 2 --leaver 2 2>&1"});
  const std::string out = launch.read_all();
  INFO(out);
  CHECK(launch.wait() != 0);
  CHECK_THAT(out, Catch::Contains("must name different trainers"));
}

TEST_CASE("the RPC demo fails when the loss does not go down", "[examples][rpc_demo]") {
  // Three steps cannot lower the loss tenfold: the ps says so and exits 1,
  // and the launcher reports it.
  Subprocess launch({sbtest::runfile("tools/launch/launch"), "--nproc", "3", "--",
                     sbtest::runfile("examples/rpc_demo/rpc_demo"), "--quick", "--steps",
                     "3"});
  const std::string out = launch.read_all();
  INFO(out);
  CHECK(launch.wait() == 1);
  CHECK_THAT(out, Catch::Contains("[rank 0] ps: FAILED: loss did not go down enough"));
}

TEST_CASE("the RPC demo refuses to run without a trainer", "[examples][rpc_demo]") {
  Subprocess launch({sbtest::runfile("tools/launch/launch"), "--nproc", "1", "--",
                     sbtest::runfile("examples/rpc_demo/rpc_demo"), "--quick"});
  (void)launch.read_all();
  CHECK(launch.wait() == 1);  // the launcher's status for a failed rank (2 here)
}
