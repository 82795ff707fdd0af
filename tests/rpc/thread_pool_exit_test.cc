// A process that exits while a thread its pool abandoned still runs (past
// the pool's shutdown deadline): the pool's state must outlive the static
// objects' destruction, the process-wide reaper's included, because that
// thread goes back into the pool's code after its task returns.
//
// This binary and //rpc:future_asan are built with AddressSanitizer, so a
// use of the freed state is a report and a non-zero exit, not a silent
// read of freed memory.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>

#include "rpc/thread_pool.h"
#include "tests/util/subprocess.h"

namespace {

using switchboard::rpc::ThreadPool;

// Trivially destructible, so that they stay usable while the static objects
// are destroyed.
std::atomic<int> task_started{0};
std::atomic<int> task_released{0};
std::atomic<int> thread_ended{0};

void signal(std::atomic<int>& flag) {
  flag.store(1);
  flag.notify_all();
}

// Ends the abandoned task at static destruction, after the reaper was
// destroyed (it was made first, so it is destroyed last), and waits until
// the task's thread has ended, i.e. has run the pool's code that follows
// the task: with the state freed, AddressSanitizer reports that code.
struct ReleaseAtExit {
  ~ReleaseAtExit() {
    signal(task_released);
    thread_ended.wait(0);
    fmt::print("the abandoned thread ended after the static objects were destroyed\n");
    std::fflush(stdout);
  }
};

// Its destructor runs when the pool thread that made it ends.
struct SignalThreadEnd {
  ~SignalThreadEnd() { signal(thread_ended); }
};

}  // namespace

// Makes a pool whose one task runs until the process exits, shuts the pool
// down with a deadline already past (its thread is abandoned and its state
// handed to the reaper), and returns from main.
SB_CHILD_MAIN(abandon_and_exit) {
  static ReleaseAtExit release_at_exit;
  auto pool = std::make_unique<ThreadPool>(1, "abandoned");
  pool->post([] {
    thread_local SignalThreadEnd on_end;
    signal(task_started);
    task_released.wait(0);
  });
  task_started.wait(0);
  pool->set_shutdown_deadline(std::chrono::steady_clock::now());
  pool.reset();  // shutdown() gives up at once: the thread is left running
  fmt::print("exiting with the pool's thread still running\n");
  std::fflush(stdout);
  return 0;
}

TEST_CASE("a process exits cleanly while a thread its pool abandoned still runs, and that "
          "thread finds the pool's state intact (regression: the reaper freed it at static "
          "destruction)",
          "[thread_pool][asan]") {
  sbtest::Subprocess child = sbtest::spawn_child("abandon_and_exit");
  // (The pool's warning about the abandoned thread comes first.)
  const std::string out = child.read_all();
  CHECK_THAT(out, Catch::EndsWith("exiting with the pool's thread still running\n"
                                  "the abandoned thread ended after the static objects were "
                                  "destroyed\n"));
  // AddressSanitizer's report, if any, is on stderr, in the test's log.
  CHECK(child.wait() == 0);
}
