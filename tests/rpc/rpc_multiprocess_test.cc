// The public RPC API as a user runs it: real worker processes started by
// tools/launch (`launch --nproc 3 -- <this binary> --sb-child NAME`), each
// finding its group through init_method "env://" (RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT and SWITCHBOARD_STORE from the launcher, so every
// worker is a client of the launcher's store server) and serving over the
// PROCESS_GROUP backend on 127.0.0.1.
//
// The test reads the launcher's merged output ("[rank N] " before each
// worker line) under a guard and checks lines and the exit status. Nothing
// sleeps hoping for an order: workers wait on RPCs, the shutdown barrier or
// signals, and every one of those waits is bounded.
#include <fmt/format.h>
#include <signal.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <filesystem>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/remote_error.h"
#include "rpc/rpc.h"
#include "tests/util/subprocess.h"

namespace rpc = switchboard::rpc;
using namespace std::chrono_literals;
using sbtest::Subprocess;

namespace {

// Bounds every wait of a worker and of the test; only a broken run gets near.
constexpr std::chrono::seconds kGuard{60};

// ---- run by the launcher as workers -------------------------------------------

int env_int(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) throw std::runtime_error(fmt::format("{} is not set", name));
  return std::stoi(value);
}

std::string worker_name(int rank) { return fmt::format("worker{}", rank); }

void say(const std::string& line) {
  fmt::print("{}\n", line);
  std::fflush(stdout);
}

// What every worker serves.
void register_functions(int rank) {
  rpc::register_function("add", [](int64_t a, int64_t b) { return a + b; });
  rpc::register_function("hello", [rank](std::string from) {
    return fmt::format("{} greets {}", worker_name(rank), from);
  });
  // The nested call: this worker asks `to` for hello, naming itself.
  rpc::register_function("relay", [rank](std::string to) {
    return fmt::format("{}>{}", worker_name(rank),
                       rpc::rpc_sync<std::string>(to, "hello", worker_name(rank)));
  });
  rpc::register_function("bad_batch", [](int64_t batch) -> int64_t {
    throw std::runtime_error(fmt::format("bad batch {}", batch));
  });
}

// init_rpc as a user writes it: rank and world size from the environment.
int init_from_env() {
  const int rank = env_int("RANK");
  register_functions(rank);
  auto options = rpc::construct_rpc_backend_options(
      rpc::backend_type("PROCESS_GROUP"), 30s, "env://", {{"hostname", "127.0.0.1"}});
  rpc::init_rpc(worker_name(rank), "PROCESS_GROUP", -1, std::nullopt, options);
  return rank;
}

// Waits (at most kGuard) for the launcher's SIGTERM; returns 4 when none came.
int await_sigterm() {
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  ::pthread_sigmask(SIG_BLOCK, &term, nullptr);
  timespec guard{kGuard.count(), 0};
  if (::sigtimedwait(&term, nullptr, &guard) == SIGTERM) return 128 + SIGTERM;
  return 4;
}

}  // namespace

// Each worker calls its ring successor, every worker (itself included)
// asynchronously, and the worker after next through its successor; then
// checks the group and shuts down gracefully.
SB_CHILD_MAIN(ring) {
  const int rank = init_from_env();
  const int world_size = env_int("WORLD_SIZE");
  const std::string me = worker_name(rank);
  const std::string next = worker_name((rank + 1) % world_size);
  const std::string after_next = worker_name((rank + 2) % world_size);

  const auto sum = rpc::rpc_sync<int64_t>(next, "add", int64_t{rank}, int64_t{100});

  std::vector<rpc::Future<std::string>> greetings;
  for (int id = 0; id < world_size; ++id) {
    // By id, by name and by WorkerInfo, in turn.
    if (id % 3 == 0) {
      greetings.push_back(rpc::rpc_async<std::string>(id, "hello", me));
    } else if (id % 3 == 1) {
      greetings.push_back(rpc::rpc_async<std::string>(worker_name(id), "hello", me));
    } else {
      greetings.push_back(rpc::rpc_async<std::string>(
          rpc::get_worker_info(worker_name(id)), "hello", me));
    }
  }
  std::vector<std::string> hellos;
  for (auto& greeting : greetings) {
    if (!greeting.wait_for(kGuard)) throw std::runtime_error("hello: no answer");
    hellos.push_back(greeting.value());
  }

  const auto nested =
      rpc::rpc_sync<std::string>(next, "relay", rpc::with_timeout(kGuard), after_next);

  std::vector<std::string> infos;
  for (const rpc::WorkerInfo& info : rpc::get_worker_infos()) {
    infos.push_back(fmt::format("{}:{}", info.id, info.name));
  }
  const rpc::WorkerInfo self = rpc::get_worker_info();

  say(fmt::format("{} ok self={}:{} add={} hello=[{}] nested={} infos=[{}]", me, self.id,
                  self.name, sum, fmt::join(hellos, "|"), nested, fmt::join(infos, ",")));
  rpc::shutdown(true, kGuard);
  return 0;
}

// Worker 0 calls a function on worker 1 that throws; everyone shuts down
// gracefully.
SB_CHILD_MAIN(remote_error) {
  const int rank = init_from_env();
  if (rank == 0) {
    try {
      rpc::rpc_sync<int64_t>("worker1", "bad_batch", int64_t{7});
      say("worker0 got no error");
    } catch (const rpc::RemoteError& e) {
      say(fmt::format("worker0 caught worker={} type={} message={}", e.worker(),
                      e.type_name(), e.remote_message()));
    }
  }
  rpc::shutdown(true, kGuard);
  return 0;
}

// Worker 2 exits with status 3 right after init_rpc. Worker 0 calls worker
// 2, then both 0 and 1 enter a graceful shutdown, whose barrier waits for
// worker 2 (at most kGuard): only the launcher can end them in time. They
// never exit on their own before that: an error (the call, or even their
// own init_rpc when worker 2 leaves while they still connect to it) is
// printed, then they wait for the launcher's SIGTERM; so the launcher's
// first failure is always rank 2.
SB_CHILD_MAIN(fail) {
  const int rank = env_int("RANK");
  // A send to worker 2 after it exited must fail the call, not raise
  // SIGPIPE: the first Gloo group ignores SIGPIPE (gloo_process_group.h).
  ::signal(SIGPIPE, SIG_DFL);
  try {
    init_from_env();
    if (rank == 2) std::exit(3);
    if (rank == 0) {
      try {
        rpc::rpc_sync<int64_t>("worker2", "add", rpc::with_timeout(kGuard), int64_t{1},
                               int64_t{2});
      } catch (const std::exception& e) {
        say(fmt::format("worker0: call to worker2 failed: {}", e.what()));
      }
    }
    say(fmt::format("{} shutting down", worker_name(rank)));
    rpc::shutdown(true, kGuard);
    say(fmt::format("{} shut down", worker_name(rank)));
  } catch (const std::exception& e) {
    say(fmt::format("{} failed: {}", worker_name(rank), e.what()));
  }
  return await_sigterm();
}

namespace {

// ---- the test side --------------------------------------------------------------

std::string self_path() {
  return std::filesystem::read_symlink("/proc/self/exe").string();
}

struct Finished {
  int status;
  std::string output;
  std::chrono::milliseconds took;
};

// Runs `launch FLAGS -- <this binary> --sb-child NAME`, stderr merged into
// stdout, and collects everything under the guard.
Finished run_launch(const std::string& child,
                    const std::vector<std::string>& flags = {}) {
  std::vector<std::string> argv = {
      "/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1", sbtest::runfile("tools/launch/launch"),
      "--nproc", "3"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(), {"--", self_path(), "--sb-child", child});
  const auto start = std::chrono::steady_clock::now();
  Subprocess launch(argv);
  std::string output = launch.read_all(kGuard + 30s);
  int status = launch.wait();
  auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  return {status, output, took};
}

// Output lines of one rank ("[rank R] " stripped).
std::vector<std::string> rank_lines(const std::string& output, int rank) {
  std::vector<std::string> lines;
  std::string prefix = fmt::format("[rank {}] ", rank);
  std::istringstream stream(output);
  for (std::string line; std::getline(stream, line);) {
    if (line.rfind(prefix, 0) == 0) lines.push_back(line.substr(prefix.size()));
  }
  return lines;
}

bool has_line(const std::vector<std::string>& lines, const std::string& wanted) {
  return std::find(lines.begin(), lines.end(), wanted) != lines.end();
}

}  // namespace

TEST_CASE("three launched workers call around a ring, to all, nested, and shut down",
          "[rpc][multiprocess]") {
  Finished run = run_launch("ring");
  INFO(run.output);
  INFO("took " << run.took.count() << " ms");
  CHECK(run.status == 0);
  for (int i = 0; i < 3; ++i) {
    std::string expected = fmt::format(
        "worker{0} ok self={0}:worker{0} add={1} "
        "hello=[worker0 greets worker{0}|worker1 greets worker{0}|worker2 greets "
        "worker{0}] nested=worker{2}>worker{3} greets worker{2} "
        "infos=[0:worker0,1:worker1,2:worker2]",
        i, 100 + i, (i + 1) % 3, (i + 2) % 3);
    INFO("rank " << i);
    CHECK(has_line(rank_lines(run.output, i), expected));
  }
}

TEST_CASE("a remote exception reaches the caller of another process as RemoteError",
          "[rpc][multiprocess]") {
  Finished run = run_launch("remote_error");
  INFO(run.output);
  INFO("took " << run.took.count() << " ms");
  CHECK(run.status == 0);
  CHECK(has_line(rank_lines(run.output, 0),
                 "worker0 caught worker=worker1 type=std::runtime_error "
                 "message=bad batch 7"));
}

TEST_CASE("a rank that exits after init_rpc stops the job, which names it",
          "[rpc][multiprocess]") {
  // The others wait up to kGuard in their shutdown barrier; the launcher
  // must end them long before that.
  Finished run = run_launch("fail", {"--timeout-stop", "2"});
  INFO(run.output);
  INFO("took " << run.took.count() << " ms");
  CHECK(run.status == 1);
  CHECK(std::regex_search(
      run.output, std::regex(R"(launch: rank 2 \(pid \d+\) exited with status 3)")));
  // Ranks 0 and 1 were still running (blocked, not crashed), and SIGTERM
  // was enough to end them.
  CHECK(run.output.find("launch: stopping 2 running workers: SIGTERM (15) now, SIGKILL "
                        "after 2 s") != std::string::npos);
  CHECK(run.output.find("still running after") == std::string::npos);
  CHECK(run.took < kGuard / 2);
  for (int rank = 0; rank < 2; ++rank) {
    CHECK_FALSE(
        has_line(rank_lines(run.output, rank), fmt::format("worker{} shut down", rank)));
  }
}
