// ProcessGroupAgent: the PROCESS_GROUP RPC backend. Every part of a message
// is a Gloo point-to-point send over a GlooProcessGroup "rpc"; static groups
// and CPU tensors only; no heartbeats (a hung peer shows as call timeouts).
// Slower than PIPE; it shows that the backend registry is pluggable and
// serves as a reference agent. Inside: a PeerSender and a PeerListener per
// peer over one ProcessGroupLink (sender.h, listener.h, link.h).
//
// Per-peer metrics (rpc/metrics.h): bytes and messages each way, counted by
// the sender and listener; the state is connected once the group formed,
// failed when the link to the peer failed (a peer that shut down closed its
// Gloo group, so it reads failed), closed at this worker's shutdown.
//
// docs/pipe.md ("PROCESS_GROUP") describes its behaviour for users,
// docs/wire_formats.md its frames, docs/thread_model.md its threads.
//
// Thread safety: as RpcAgent (rpc/agent.h). Ownership: shares the store
// (construction and join()); owns the process group and its threads.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "agents/process_group/wire.h"
#include "rpc/agent.h"
#include "rpc/backend_registry.h"

namespace switchboard {
class Store;
}

namespace switchboard::agents::process_group {

struct ProcessGroupAgentOptions {
  size_t num_worker_threads = rpc::kDefaultNumWorkerThreads;
  // Bounds the construction rendezvous (name exchange and Gloo mesh); 0
  // waits forever. Calls get their timeout from send(), not from here.
  std::chrono::milliseconds rpc_timeout = rpc::kDefaultRpcTimeout;
  // The address or interface Gloo binds (see gloo_process_group.h);
  // both empty: Gloo's own choice. Tests use hostname "127.0.0.1".
  std::string hostname;
  std::string iface;
};

class ProcessGroupAgent final : public rpc::RpcAgent {
 public:
  // Exchanges names through the store ("rpc/names/<rank>"), then connects
  // the Gloo mesh (unbounded: the Gloo group has no timeout). Throws
  // std::invalid_argument for a bad argument or a name used by several
  // ranks (naming it and its ranks), TimeoutError naming the ranks that did
  // not come within options.rpc_timeout. `store` must be non-null; the
  // agent shares it until destroyed. The store must be fresh for each
  // incarnation of a group (or a fresh PrefixStore over a shared one).
  ProcessGroupAgent(std::shared_ptr<Store> store, std::string name, int rank,
                    int world_size, const ProcessGroupAgentOptions& options = {});
  // Calls shutdown().
  ~ProcessGroupAgent() override;

  // Starts the threads; `handler` runs on the pool for every request.
  // Throws std::invalid_argument when called twice, after shutdown() or
  // with an empty handler.
  void start(RequestHandler handler) override;

  // Queues `request` for `to` and returns at once; never throws. The
  // future fails with TimeoutError, ConnectionError (the peer went away or
  // sent bad bytes), Error(kCancelled) (shut down), NotFoundError, or
  // std::invalid_argument (before start(), not a request, a CUDA or
  // undefined tensor, naming its index).
  // The future's callbacks run on the pool. Dropping the future cancels
  // nothing; the late response is dropped.
  rpc::Future<rpc::Message> send(const rpc::WorkerInfo& to, rpc::Message request,
                                 Timeout timeout) override;

  // NotFoundError naming the name or id when there is no such worker.
  rpc::WorkerInfo worker(const std::string& name) const override;
  rpc::WorkerInfo worker(int id) const override;
  // Every worker, by rank.
  std::vector<rpc::WorkerInfo> workers() const override;

  // Waits until the whole group is quiet (rendezvous/quiet_group.h: rounds over
  // store keys "rpc/join/<generation>/<round>/<rank>"; every worker must
  // call join() equally often). TimeoutError after `timeout` (0: none),
  // naming the calls still in flight here, or the workers that did not
  // arrive or were still busy. Error(kCancelled) when the agent was shut
  // down meanwhile.
  void join(Timeout timeout) override;

  // Fails pending calls with Error(kCancelled), stops the listeners and
  // senders (destroying the process group aborts their Gloo waits), shuts
  // the pool down (it finishes the tasks already queued; requests not yet
  // handled are dropped) and joins every thread. Idempotent: a second call
  // returns at once. It waits for handlers that are running, so a handler
  // that never returns blocks it.
  void shutdown() override;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace switchboard::agents::process_group
