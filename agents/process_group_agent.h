// ProcessGroupAgent: the PROCESS_GROUP RPC backend. Messages travel as
// point-to-point send/recv over a GlooProcessGroup; static groups only.
// Slower than PIPE (every part of a message is its own Gloo send, and each
// peer has one sender and one listener thread); it proves that the backend
// registry is pluggable and serves as a reference agent.
//
// Construction (a rendezvous; every rank constructs at about the same time):
//   1. checks the arguments and this worker's name (1 to 128 letters,
//      digits, '_', '-' or ':'), throwing std::invalid_argument naming them;
//   2. exchanges worker names through the store ("rpc/names/<rank>"); a name
//      used by several ranks is an std::invalid_argument on every worker,
//      naming the name and its ranks; a rank that never comes is a
//      TimeoutError naming the missing ranks after options.rpc_timeout;
//   3. creates the GlooProcessGroup (group "rpc", under the store prefix
//      "rpc/pg_agent"). Its own timeout is "none": listeners wait for the
//      next message indefinitely, and Gloo closes every connection of a
//      group when one of its waits times out. So connecting the mesh is not
//      bounded either; it starts once step 2 saw every rank arrive.
// The store must be fresh for each incarnation of a group (or a fresh
// PrefixStore over a shared one): keys of an earlier group would be read.
//
// Wire format (per message, from one rank to one peer; integers little
// endian). Tag kHeaderTag carries headers, kDataTag everything else; Gloo
// keeps each (peer, tag) in order and the agent sends one message to a
// peer at a time, so the parts of a message arrive in order:
//   header (kHeaderSize = 40 bytes, tag kHeaderTag):
//     u32 magic (kMagic, "SBPG")  u8 version (kVersion)  u8 MessageType
//     u16 zero  u64 message id  u32 function length  u32 tensor count
//     u64 payload length  u64 descriptors length
//   body (tag kDataTag; omitted when empty): function name bytes, payload
//     bytes, then one descriptor per tensor: u8 DType, three zero bytes,
//     u32 ndim, ndim x i64 extents;
//   then each tensor's bytes (tag kDataTag), one Gloo send per tensor, in
//     order; tensors of zero bytes send nothing.
// A response carries its request's id. Each side keeps at most 8 parts of
// a message posted to Gloo at once (GlooProcessGroup gives every posted op
// a thread).
// A receiver allocates every tensor with Tensor::empty and receives
// straight into it. A frame it cannot parse (bad magic, version, type,
// sizes or dtypes) is a protocol error: the agent logs it, stops listening
// to that peer and fails every call to it with ConnectionError (a Gloo
// group cannot close a single connection).
//
// Tensors: CPU only. Non-contiguous tensors travel as contiguous copies; a
// CUDA or undefined tensor fails send() with std::invalid_argument naming
// its index. Sends to self go through the pool without Gloo, and the
// callee gets copies of the tensors (as from a remote worker).
//
// Handler failures: when the RequestHandler throws, returns an invalid
// future, or its future fails, the agent answers kError itself, encoded by
// rpc::encode_remote_error (rpc/remote_error.h) with this worker's name, so
// the caller sees a RemoteError as for any remote exception. So does a
// response the agent cannot send (type kRequest, a CUDA tensor).
//
// Threads: one pool (RpcAgent::pool(), num_worker_threads) runs handlers
// and every future callback; per peer one sender thread (owns the sends to
// it, one message at a time) and one listener thread (owns the recvs from
// it, hands requests to the pool and completes responses); one timer
// thread fails expired calls. start() starts them; shutdown() joins them.
// The agent's threads never run user code: futures returned by send()
// run their callbacks on the pool (inline on the completing thread only
// if the pool was shut down before the agent, which the owner must avoid).
//
// Errors of send() (all through the future; send() itself never throws):
//   TimeoutError      `rpc to "w1" function "add": timed out after 200 ms`
//   ConnectionError   the peer went away or sent bad bytes; names it
//   Error(kCancelled) `... rpc agent "w0" shut down` (and after shutdown)
//   NotFoundError     `to` is not a worker of this group
//   std::invalid_argument  before start(), a request of the wrong type, or
//                     a tensor that cannot travel
//
// Thread safety: as RpcAgent (every method from any thread; start() first,
// destructor last). Ownership: shares the store (used by the constructor
// and by join()); owns the process group and its threads.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "agents/process_group_wire.h"
#include "rpc/agent.h"

namespace switchboard {
class Store;
}

namespace switchboard::agents {

struct ProcessGroupAgentOptions {
  size_t num_worker_threads = 4;
  // Bounds the construction rendezvous (name exchange and Gloo mesh); 0
  // waits forever. Calls get their timeout from send(), not from here.
  std::chrono::milliseconds rpc_timeout{60'000};
  // The address or interface Gloo binds (see gloo_process_group.h);
  // both empty: Gloo's own choice. Tests use hostname "127.0.0.1".
  std::string hostname;
  std::string iface;
};

class ProcessGroupAgent final : public rpc::RpcAgent {
 public:
  // Rendezvouses with the other ranks (see above); blocks until they all
  // arrived or options.rpc_timeout passed. `store` must be non-null; the
  // agent shares it until destroyed.
  ProcessGroupAgent(std::shared_ptr<Store> store, std::string name, int rank,
                    int world_size, const ProcessGroupAgentOptions& options = {});
  // Calls shutdown().
  ~ProcessGroupAgent() override;

  // Starts the threads; `handler` runs on the pool for every request.
  // Throws std::invalid_argument when called twice, after shutdown() or
  // with an empty handler.
  void start(RequestHandler handler) override;

  // Queues `request` for `to` and returns at once; see above for errors.
  // The future's callbacks run on the pool. Dropping the future cancels
  // nothing; the late response is dropped.
  rpc::Future<rpc::Message> send(const rpc::WorkerInfo& to, rpc::Message request,
                                 Timeout timeout) override;

  // NotFoundError naming the name or id when there is no such worker.
  rpc::WorkerInfo worker(const std::string& name) const override;
  rpc::WorkerInfo worker(int id) const override;
  // Every worker, by rank.
  std::vector<rpc::WorkerInfo> workers() const override;

  // Waits until this agent has no call in flight and no request being
  // handled, then for every worker to reach the same join() (a barrier over
  // store keys "rpc/join/<generation>/<rank>"; every worker must call
  // join() equally often). When every worker passed its first phase, no
  // call was in flight anywhere. TimeoutError after `timeout` (0: none),
  // naming the calls still in flight or the workers that did not arrive.
  // Error(kCancelled) when the agent was shut down before or during the
  // first phase (the store wait of the second is not interrupted: it ends
  // when the others arrive or at the timeout).
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

}  // namespace switchboard::agents
