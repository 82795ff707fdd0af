// Where a worker finds its group: rank, world size and the Store, from
// init_rpc's arguments and its init_method.
//
//   env://           MASTER_ADDR and MASTER_PORT name the TcpStore; RANK and
//                    WORLD_SIZE (or SLURM_PROCID / SLURM_NTASKS, or Open
//                    MPI's OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE) fill
//                    in what init_rpc was not given. Under srun
//                    (SLURM_PROCID set) without MASTER_ADDR, the store's host
//                    is the first node of SLURM_STEP_NODELIST (else
//                    SLURM_JOB_NODELIST), where task 0 runs; without
//                    MASTER_PORT, its port is slurm_store_port(SLURM_JOB_ID).
//   tcp://host:port  the TcpStore at host:port.
//   file://path      a FileStore shared through `path` (one machine or a
//                    shared file system).
//
// Who serves the TcpStore: rank 0 starts it in-process (PyTorch's
// is_master), unless SWITCHBOARD_STORE is set (tools/launch sets it to the
// standalone store_server's tcp://host:port) — then every worker is a
// client, and the store outlives any one worker. Dynamic groups (no world
// size) always need a standalone store.
//
// Elastic jobs: a restarted group meets in a fresh round and reads nothing
// of the failed attempt, because each worker sees the store under its
// attempt's prefix "/worker/attempt_<n>" (rendezvous/rounds.h):
//  - under torchrun (TORCHELASTIC_USE_AGENT_STORE=True) every worker is a
//    client of the agent's store, and n counts the starts of the worker's
//    rank in that store ("switchboard/elastic/starts/<rank>"), the same on
//    every node (PyTorch 2.x's TORCHELASTIC_RESTART_COUNT is per node);
//  - with SWITCHBOARD_STORE, wherever TORCHELASTIC_RESTART_COUNT is set
//    (tools/launch --max-restarts sets it the same on every node), n is it.
//
// Errors: std::invalid_argument naming the missing or malformed variable or
// URL; whatever the store throws while connecting (ConnectionError,
// TimeoutError).
//
// Thread safety: the functions read the environment; call them from one
// thread at a time with respect to setenv.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <cstdint>

namespace switchboard {
class Store;
}

namespace switchboard::rendezvous {

struct Rendezvous {
  std::shared_ptr<Store> store;
  int rank = -1;
  std::optional<int> world_size;
};

// Rank and world size from the environment (RANK/WORLD_SIZE, then SLURM,
// then Open MPI); nullopt when absent. Malformed values throw
// std::invalid_argument naming the variable and value.
std::optional<int> env_rank();

// The first host name of a SLURM node list ("node[07-12,20],gpu1" gives
// "node07"; "a,b" gives "a"). std::invalid_argument naming the list when it
// is malformed (unbalanced brackets, a bracket that is not numbers).
std::string slurm_first_node(std::string_view nodelist);
// The store's port under srun without MASTER_PORT: 20000 + job id % 10000
// (below Linux's ephemeral ports, 32768 and up).
uint16_t slurm_store_port(int job_id);
std::optional<int> env_world_size();
// This worker's rank among the workers of its host: LOCAL_RANK (the
// launcher's, torchrun's), then SLURM_LOCALID, then Open MPI's
// OMPI_COMM_WORLD_LOCAL_RANK; nullopt when none is set. Malformed values
// throw std::invalid_argument naming the variable and value.
std::optional<int> env_local_rank();

// Resolves everything; `rank` < 0 and `world_size` nullopt mean "from the
// environment" (a group without a world size there is dynamic).
// `dynamic`: the caller asked for a dynamic group (rpc::kDynamicGroup), so
// no world size is read from the environment (tools/launch sets
// WORLD_SIZE for every worker) and the rank is not held to one. `timeout`
// bounds connecting to the store.
Rendezvous rendezvous(const std::string& init_method, int rank,
                      std::optional<int> world_size, std::chrono::milliseconds timeout,
                      bool dynamic = false);

}  // namespace switchboard::rendezvous
