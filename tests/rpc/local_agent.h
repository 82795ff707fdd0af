// LOCAL: an in-process RPC backend for tests, registered through the
// user-facing backend registry (rpc/backend_registry.h) exactly as a user
// registers their own transport.
//
//   rpc::BackendType local = testing::register_local_backend();
//   auto options = rpc::construct_rpc_backend_options(
//       local, 10s, "env://", {{"num_worker_threads", "4"}});
//   std::unique_ptr<rpc::RpcAgent> agent = rpc::init_backend(
//       local, rpc::BackendInit{store, "w0", 0, 2, options});
//
// Workers are threads of one process. They find each other through the
// store: the first to arrive publishes the id of a fresh "fabric" (a
// process-global table of live agents) under "local/fabric" with
// compare_set, the others read it; every worker publishes its name under
// "local/names/<rank>". Messages never leave the process: send() posts the
// request to the callee's pool, and the answer goes straight back to the
// caller's pending call. Tensors are deep-copied both ways (the callee never
// aliases the caller's memory, as with a real transport); CPU tensors only.
// Static groups only (world_size required).
//
// Semantics follow the RpcAgent contract (rpc/agent.h) and the PROCESS_GROUP
// agent (agents/process_group/agent.h), messages included:
//   TimeoutError      `rpc to "w1" function "add": timed out after 200 ms`
//   ConnectionError   `rpc to "w1" function "add": connection to worker "w1"
//                     lost: it shut down` (the callee shut down, before or
//                     during the call)
//   Error(kCancelled) `... rpc agent "w0" shut down` (caller shut down)
//   NotFoundError     `to` is not a worker of this group
//   std::invalid_argument  before start(), a message that is not a request,
//                     a negative timeout, an undefined or non-CPU tensor
// A handler that throws, returns an invalid future or whose future fails is
// answered with kError (rpc::encode_remote_error naming the callee).
// Requests that reach a worker before its start() wait for it.
// join(): drains this agent's calls and handlers, then a barrier of every
// worker of the group (in the fabric; no store traffic).
//
// Construction errors (init_backend): std::invalid_argument for a dynamic
// group, a null store, a bad rank/world size/name, duplicate names (on every
// worker, naming the name and its ranks), two workers with one rank, or a
// fabric that lives in another process; TimeoutError naming the ranks that
// never came within options.rpc_timeout (0: wait forever);
// Error(kFailedPrecondition) when the store names a fabric that is gone (a
// store reused from an earlier group: use a fresh store or PrefixStore).
//
// Metrics: the call table counts calls and requests (rpc/metrics.h); the
// "transport" reports every other worker as a peer (rpc::PeerMetrics from
// RpcAgent::metrics()): connected once the group formed, closed when it or
// this worker shut down, and the bytes a wire would carry (function name,
// body and tensor bytes) and messages, both ways. Self-sends are not
// counted as peer traffic.
//
// Threads: per agent, one pool (RpcAgent::pool()) runs handlers and the
// callbacks of the futures send() returns, and one timer thread fails
// expired calls. Both are joined by shutdown().
//
// Thread safety: register_local_backend() and every agent method may be
// called from any thread (start() first, the destructor last, as for every
// RpcAgent). Ownership: an agent shares the store only while it is being
// constructed, and shares the fabric with the other agents of its group.
#pragma once

#include <memory>

#include "rpc/agent.h"
#include "rpc/backend_registry.h"

namespace switchboard::testing {

inline constexpr const char* kLocalBackendName = "LOCAL";

// The options of LOCAL: the common fields only. Extras: "num_worker_threads"
// (an integer in [1, 4096]); any other key is refused, naming it.
struct LocalBackendOptions : rpc::RpcBackendOptions {};

// Registers "LOCAL" on the first call and returns its BackendType; later
// calls (from any thread) return the same BackendType. Throws RegistryError
// when someone else registered another backend under that name first.
rpc::BackendType register_local_backend();

// The init handler register_local_backend() installs: constructs one LOCAL
// agent for `init` (see above for the rendezvous and its errors). Blocks
// until every worker of the group arrived. `init.options` may be any
// RpcBackendOptions (null: the defaults); only the common fields are used.
std::unique_ptr<rpc::RpcAgent> make_local_agent(const rpc::BackendInit& init);

}  // namespace switchboard::testing
