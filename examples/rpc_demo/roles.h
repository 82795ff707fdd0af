// The two roles of the RPC demo and what they share. main.cc picks the role
// from RANK: 0 runs run_ps(), every other rank run_trainer().
//
// The RPC functions the ps serves (registered before init_rpc):
//   push_grad(int64 trainer, Tensor grad) -> int64   async handler: the reply
//       (the version of the update that applied the gradient) goes out when
//       the batch holding it is applied (parameter_server.h's rule)
//   get_params() -> Tensor                           the current parameters
//   done(int64 trainer) -> Tensor                    async handler: replies
//       with the final parameters once every trainer has called done
//   join_training(int64 trainer)                     the late trainer starts
//   retire(int64 trainer)                            a trainer that leaves is
//       done, without waiting for the others
//
// All workers form a dynamic group (init_rpc with rpc::kDynamicGroup); the
// late trainer joins it mid-run and the leaver leaves it early.
//
// Thread safety: run_ps() and run_trainer() own the process's RPC worker
// (RpcContext::global()); call one of them, once, from main.
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "examples/rpc_demo/flags.h"
#include "rpc/backend_registry.h"

namespace switchboard::rpc_demo {

// The store key the ps sets when the late trainer may join.
inline constexpr char kLateJoinKey[] = "rpc_demo/late_join";

// Every RPC and the trainers' Gloo group wait at most this long; see ps.cc
// for the one call that waits longer (done, bounded by the ps instead).
inline constexpr std::chrono::seconds kRpcTimeout{60};
// Standard deviation of the label noise; the best possible held-out loss is
// about kNoise^2 / 2.
inline constexpr float kNoise = 0.1f;

// Seeds: w* from --seed; the held-out set (k = 0) and trainer k's shard and
// minibatches from seeds derived from it, so every process can rebuild them.
inline uint64_t data_seed(const DemoFlags& flags, int k) {
  return static_cast<uint64_t>(flags.seed) * 1000003u + 1000u + static_cast<uint64_t>(k);
}
inline uint64_t minibatch_seed(const DemoFlags& flags, int k) {
  return data_seed(flags, k) ^ 0x5eed5eed5eed5eedull;
}

// PIPE over env:// (the launcher's store), bound to --listen-address; the
// metrics endpoint of worker `rank` as --metrics-port says.
std::shared_ptr<rpc::RpcBackendOptions> demo_rpc_options(const DemoFlags& flags, int rank);

// Prints what this worker's metrics say (rpc::get_metrics_snapshot()): per
// function, the calls it sent (count, p50, p99, failures) and the requests
// it served; its pool and its store client. Call before shutdown.
void report_metrics(const std::string& who);
// With the endpoint on: scrapes it over HTTP and prints the samples of
// `metric` from the page, as Prometheus would read them.
void print_scrape(const std::string& who, const std::string& metric);

// Prints "<who>: <text>" as one line and flushes it (the launcher relays
// whole lines, prefixed "[rank N] "). Thread-safe.
void say_line(const std::string& who, const std::string& text);
template <typename... Args>
void say(const std::string& who, fmt::format_string<Args...> format, Args&&... args) {
  say_line(who, fmt::format(format, std::forward<Args>(args)...));
}

double seconds_since(std::chrono::steady_clock::time_point start);

// The ps (rank 0) and trainer `rank` (1..world_size-1). They return the
// process's exit status and throw what failed.
int run_ps(const DemoFlags& flags, int world_size);
int run_trainer(const DemoFlags& flags, int rank, int world_size);

}  // namespace switchboard::rpc_demo
