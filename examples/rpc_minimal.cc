// The minimal RPC program: every worker serves "add" and "scale", calls its
// neighbour, and shuts down gracefully. Run two workers with the launcher:
//
//   bazel build //examples:rpc_minimal //tools/launch
//   bazel-bin/tools/launch/launch --nproc 2 -- bazel-bin/examples/rpc_minimal
//
// The launcher sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, which
// init_rpc's default init_method ("env://") reads.
#include <fmt/format.h>

#include <cstdlib>

#include "core/tensor.h"
#include "common/logging.h"
#include "rendezvous/init_method.h"
#include "rpc/rpc.h"

namespace rpc = switchboard::rpc;
using switchboard::DType;
using switchboard::Tensor;

int run() {
  // RANK and WORLD_SIZE (the launcher's, torchrun's), else SLURM's
  // SLURM_PROCID and SLURM_NTASKS (srun), else Open MPI's.
  const int rank = switchboard::rendezvous::env_rank().value_or(0);
  const int world_size = switchboard::rendezvous::env_world_size().value_or(1);

  // Functions first: requests may arrive as soon as init_rpc returns.
  rpc::register_function("add", [](int64_t a, int64_t b) { return a + b; });
  rpc::register_function("scale", [](Tensor t, float factor) {
    Tensor out = Tensor::empty(t.shape(), DType::kFloat32);
    for (int64_t i = 0; i < t.numel(); ++i) {
      out.data_as<float>()[i] = t.data_as<float>()[i] * factor;
    }
    return out;
  });

  // The default backend (PIPE), rendezvous through env:// (the launcher's
  // store). No address is given: each worker listens on the address it
  // reaches the store from (loopback when the store is on loopback), so the
  // same binary runs on one host and on many. SWITCHBOARD_IFNAME overrides.
  rpc::init_rpc(fmt::format("worker{}", rank), rank, world_size);

  const std::string next = fmt::format("worker{}", (rank + 1) % world_size);
  const int64_t sum = rpc::rpc_sync<int64_t>(next, "add", int64_t{rank}, int64_t{40});

  Tensor ones = Tensor::from_vector(std::vector<float>(4, 1.0f));
  rpc::Future<Tensor> scaled = rpc::rpc_async<Tensor>(next, "scale", ones, 2.5f);
  const float first = scaled.value().data_as<float>()[0];

  fmt::print("worker{}: add on {} gave {}, scale gave {}\n", rank, next, sum, first);
  rpc::shutdown();  // waits until every worker is done
  return 0;
}

int main() {
  switchboard::init_logging("rpc_minimal");
  try {
    return run();
  } catch (const std::exception& e) {
    // Every failure (a store that cannot be reached, a peer that died, a
    // timeout) says what failed, and the exit status says it failed.
    fmt::print(stderr, "rpc_minimal: {}\n", e.what());
    return 1;
  }
}
