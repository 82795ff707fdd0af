// A worker for the torchrun restart test (examples_test): RANK and
// WORLD_SIZE from torchrun, the attempt from TORCHELASTIC_RESTART_COUNT. On
// attempt 0, rank 1 kills itself with SIGKILL right after init_rpc (mid-job,
// as a crash would); on later attempts every worker calls "add" on the next
// and prints "worker<r> attempt <a>: <sum>". Any failure prints what failed
// and exits 1.
#include <fmt/format.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "rpc/rpc.h"

namespace rpc = switchboard::rpc;

namespace {

int env_int(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value ? std::atoi(value) : fallback;
}

}  // namespace

int main() {
  const int rank = env_int("RANK", 0);
  const int world_size = env_int("WORLD_SIZE", 1);
  const int attempt = env_int("TORCHELASTIC_RESTART_COUNT", 0);
  try {
    rpc::register_function("add", [](int64_t a, int64_t b) { return a + b; });
    rpc::init_rpc(fmt::format("worker{}", rank), rank, world_size);
    if (attempt == 0 && rank == 1) ::raise(SIGKILL);
    const std::string next = fmt::format("worker{}", (rank + 1) % world_size);
    const int64_t sum = rpc::rpc_sync<int64_t>(next, "add", int64_t{rank}, int64_t{40});
    fmt::print("worker{} attempt {}: {}\n", rank, attempt, sum);
    std::fflush(stdout);
    rpc::shutdown();
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "elastic_worker rank {} attempt {}: {}\n", rank, attempt, e.what());
    return 1;
  }
}
