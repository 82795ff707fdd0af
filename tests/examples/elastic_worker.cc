// A worker for the restart cases under torchrun and tools/launch
// --max-restarts (examples_test, torchrun_test, launch tests): RANK and
// WORLD_SIZE from the environment, the attempt from
// TORCHELASTIC_RESTART_COUNT. On attempt 0, rank 1 joins the group, makes
// no call, and kills itself with SIGKILL when it is first called, before
// answering (mid-job, as a crash would); on later attempts every worker calls "add" on the next and prints
// "worker<r> attempt <a>: <sum>". Any failure prints what failed and exits
// 1.
//
// `elastic_worker --dynamic`: the same in a dynamic PIPE group (no world
// size given to init_rpc). Each worker waits until the group has WORLD_SIZE
// members. On attempt 0 the others then tell rank 1 so, and it kills
// itself once all have; they call it until a call fails, print "worker<r>
// attempt 0: lost worker1" and exit 1, so that every node's agent restarts. On later attempts each worker also prints
// the members it saw, tells every other worker it is done, and leaves once
// every other one has told it so, so that no worker leaves before all have
// seen the whole group.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <unistd.h>


#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>

#include "common/logging.h"
#include "rpc/rpc.h"

namespace rpc = switchboard::rpc;

namespace {

int env_int(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value ? std::atoi(value) : fallback;
}

constexpr auto kBound = std::chrono::seconds(120);

// The dynamic group as this worker sees it, fed by on_join and on_leave.
struct Group {
  std::mutex mu;
  std::condition_variable changed;
  std::set<std::string> members;
  int served = 0;    // "add" calls served
  int finished = 0;  // "finished" calls served
  int ready = 0;     // "ready" calls served (attempt 0)
};

int run_dynamic(int rank, int world_size, int attempt) {
  static Group group;
  rpc::register_function("add", [](int64_t a, int64_t b) {
    std::lock_guard<std::mutex> lock(group.mu);
    ++group.served;
    group.changed.notify_all();
    return a + b;
  });
  rpc::register_function("ready", [] {
    std::lock_guard<std::mutex> lock(group.mu);
    ++group.ready;
    group.changed.notify_all();
  });
  rpc::register_function("finished", [] {
    std::lock_guard<std::mutex> lock(group.mu);
    ++group.finished;
    group.changed.notify_all();
  });
  rpc::on_join([](const rpc::WorkerInfo& w) {
    std::lock_guard<std::mutex> lock(group.mu);
    group.members.insert(w.name);
    group.changed.notify_all();
  });
  rpc::on_leave([](const rpc::WorkerInfo& w) {
    std::lock_guard<std::mutex> lock(group.mu);
    group.members.erase(w.name);
    group.changed.notify_all();
  });
  const std::string me = fmt::format("worker{}", rank);
  rpc::init_rpc(me, rank, rpc::kDynamicGroup);
  std::unique_lock<std::mutex> lock(group.mu);
  for (const rpc::WorkerInfo& w : rpc::get_worker_infos()) group.members.insert(w.name);
  if (!group.changed.wait_for(lock, kBound, [&] {
        return static_cast<int>(group.members.size()) >= world_size;
      })) {
    throw std::runtime_error(fmt::format("{} members after {} s: {}", group.members.size(),
                                         kBound.count(), fmt::join(group.members, ", ")));
  }
  const std::string seen = fmt::format("{}", fmt::join(group.members, ","));
  lock.unlock();
  if (attempt == 0) {
    // Every worker saw the whole group (nobody left before: rank 1 dies
    // only once the others told it they saw it), then rank 1 dies. The
    // others call it until a call fails: its connection is gone at once,
    // which does not wait for the group to take it off the member list
    // (when half of a group dies at once, as when torchrun stops a node's
    // workers, the survivors cannot tell a partition from deaths quickly).
    if (rank == 1) {
      lock.lock();
      if (!group.changed.wait_for(lock, kBound,
                                  [&] { return group.ready >= world_size - 1; })) {
        throw std::runtime_error(fmt::format("{} workers ready", group.ready));
      }
      ::raise(SIGKILL);
    }
    try {
      // (Rank 1 may die before it answered the last "ready".)
      rpc::rpc_sync("worker1", "ready");
      for (;;) rpc::rpc_sync<int64_t>("worker1", "add", int64_t{rank}, int64_t{0});
    } catch (const std::exception&) {
    }
    fmt::print("worker{} attempt 0: lost worker1\n", rank);
    std::fflush(stdout);
    rpc::shutdown(/*graceful=*/false);
    return 1;
  }
  const std::string next = fmt::format("worker{}", (rank + 1) % world_size);
  const int64_t sum = rpc::rpc_sync<int64_t>(next, "add", int64_t{rank}, int64_t{40});
  fmt::print("worker{} attempt {}: {} (members {})\n", rank, attempt, sum, seen);
  std::fflush(stdout);
  // Nobody leaves before every worker is done: each tells every other one,
  // and leaves once all have told it.
  for (int r = 0; r < world_size; ++r) {
    if (r != rank) rpc::rpc_sync(fmt::format("worker{}", r), "finished");
  }
  lock.lock();
  if (!group.changed.wait_for(lock, kBound, [&] {
        return group.served >= 1 && group.finished >= world_size - 1;
      })) {
    throw std::runtime_error(fmt::format("served {} calls, {} workers finished", group.served,
                                         group.finished));
  }
  lock.unlock();
  rpc::shutdown();
  return 0;
}

int run_static(int rank, int world_size, int attempt) {
  // Rank 1 of attempt 0 dies serving its first call, before it answers:
  // nothing of attempt 0 can complete through it, whatever the order in
  // which its pool and the others run (it used to die right after
  // init_rpc, and a call served before that line let attempt 0 complete).
  const bool doomed = attempt == 0 && rank == 1;
  rpc::register_function("add", [doomed](int64_t a, int64_t b) {
    if (doomed) ::raise(SIGKILL);
    return a + b;
  });
  rpc::init_rpc(fmt::format("worker{}", rank), rank, world_size);
  if (doomed) {
    for (;;) ::pause();  // until a call kills it, or the launcher stops it
  }
  const std::string next = fmt::format("worker{}", (rank + 1) % world_size);
  const int64_t sum = rpc::rpc_sync<int64_t>(next, "add", int64_t{rank}, int64_t{40});
  fmt::print("worker{} attempt {}: {}\n", rank, attempt, sum);
  std::fflush(stdout);
  rpc::shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  switchboard::init_logging("elastic_worker");
  const int rank = env_int("RANK", 0);
  const int world_size = env_int("WORLD_SIZE", 1);
  const int attempt = env_int("TORCHELASTIC_RESTART_COUNT", 0);
  const bool dynamic = argc > 1 && std::string(argv[1]) == "--dynamic";
  try {
    return dynamic ? run_dynamic(rank, world_size, attempt)
                   : run_static(rank, world_size, attempt);
  } catch (const std::exception& e) {
    fmt::print(stderr, "elastic_worker rank {} attempt {}: {}\n", rank, attempt, e.what());
    return 1;
  }
}
