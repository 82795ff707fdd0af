// PipeAgent: the PIPE RPC backend (the default), a TensorPipe-style
// transport on Boost.Asio, for static groups (world_size given) and dynamic
// ones (no world_size; see "Dynamic groups" below).
//
// Construction of a static group (a rendezvous; every rank constructs at
// about the same time):
//   1. checks the name (rpc::validate_worker_name) and options, and starts
//      listening on the listen address (agents/pipe_address.h), port 0;
//   2. creates a GlooProcessGroup "pipe" over the store and all-gathers every
//      worker's (name, address, port, device count, device maps, devices);
//      a duplicate name is std::invalid_argument on every worker, naming the
//      name and its ranks; device maps are validated on every worker
//      (rpc/device_map.h: the same rules PyTorch enforces, errors naming the
//      worker and the map), and the reverse maps are built;
//   3. connects eagerly: rank i connects to every rank j < i and sends a
//      hello frame naming itself; one connection per pair of workers, used
//      in both directions. The constructor returns once this worker has a
//      connection to every other worker, or throws TimeoutError naming the
//      missing ones after options.rpc_timeout.
//
// Wire format: agents/pipe_frame.h (a 32-byte header, the function name and
// msgpack payload, tensor descriptors, then each tensor's bytes out of
// band). Everything queued for a peer while a write is in progress goes out
// in the next write, as one gather write (headers and bodies packed into
// one buffer, tensor bytes straight from the tensors); reads land in a
// 64 KiB buffer that holds many small frames, and tensor bytes are read
// straight into the receiving tensor. TCP_NODELAY on every socket.
//
// Threads: `num_io_threads` run the Asio io_context (every socket
// operation); the pool (RpcAgent::pool(), num_worker_threads) runs handlers
// and every future callback; no user code ever runs on an I/O thread. The
// I/O threads complete response futures; their callbacks are posted to the
// pool.
//
// Failure detection: a connection that fails (the peer's process died: the
// kernel closes its sockets), sends bytes that are not a valid frame
// (logged with the reason), or stays silent for options.heartbeat_timeout
// (every connection carries a heartbeat every heartbeat_interval) is
// closed; the calls pending on it fail at once with ConnectionError naming
// the worker, and later calls to that worker fail at once too. The agent
// keeps serving the other workers. A worker that shuts down says goodbye
// first, so its peers fail calls to it as "left" rather than "lost".
//
// Dynamic groups (world_size nullopt): workers join and leave while the
// others run. Joins and leaves are serialized by a membership token in the
// store (rpc/membership_token.h: a lease of options.membership_lease; a
// worker killed while holding it holds the group up for at most that long,
// then the next one takes it over). The store keeps the member list and
// which ranks were taken (pipe/dyn/...; agents/pipe_dynamic.cc).
//   Joining (the constructor): take the token (TimeoutError after
//   rpc_timeout naming the holder); read the members; refuse a rank that
//   was ever taken or a name in use (std::invalid_argument); validate the
//   device maps of the members plus this worker (rpc/device_map.h, dynamic
//   rules: targets that are not members are allowed); connect to every
//   member and introduce this worker (name, address, device maps); each
//   member validates it again and answers. A refusal fails the join, naming
//   the member and its reason; a member that cannot be reached (it died
//   without leaving) is dropped from the list. Then the list gains this
//   worker and the token is released.
//   Members: add the joiner (reverse maps included) and report it to the
//   membership listener (on the pool).
//   Leaving (join(), i.e. graceful shutdown): take the token, say goodbye to
//   every member (from then on they fail new calls to this worker at once
//   with ConnectionError "... "w1" left the group"), finish the calls in
//   flight in both directions and the requests being handled (renewing the
//   token meanwhile; TimeoutError after the timeout), remove this worker
//   from the list, release the token. Any member may leave, rank 0 too.
//   A member whose connection fails is reported as left too (lost).
//   Ranks are in [0, options.max_dynamic_ranks) and never reused; a name
//   may come back under a new rank once its worker left.
//   join()'s barrier and the Gloo group exist for static groups only.
//
// Tensors: CPU tensors of every dtype (non-contiguous ones travel as
// contiguous copies). A CUDA tensor needs a device map entry for its
// device towards the worker it goes to (std::invalid_argument naming both
// otherwise); it must be contiguous. It is staged: the sender copies it to
// the CPU on the calling thread (a request) or the pool thread that
// finished the handler (a response), the bytes travel like a CPU tensor's,
// and the receiver copies them to the mapped device on an RPC pool thread
// before the handler runs or the caller's future completes. A response
// travels back along the inverse of the caller's map. The copies go
// through the CUDA runtime registered with collective/tensor.h, which
// linking //collective:cuda_allocator installs; without it (or without a
// GPU) device_count is 0, so maps naming CUDA devices fail validation at
// construction, and a frame naming a device this worker lacks fails that
// call with std::invalid_argument naming the device, never a crash.
//
// Errors of send() (through the future; send() itself never throws):
//   TimeoutError      `rpc to "w1" function "add": timed out after 200 ms`
//   ConnectionError   the worker's connection failed or it left; names it
//   Error(kCancelled) `... rpc agent "w0" shut down`
//   NotFoundError     `to` is not a worker of this group
//   std::invalid_argument  before start(), a request of the wrong type, or
//                     a tensor that cannot travel
//
// Thread safety: as RpcAgent. Ownership: shares the store (construction
// and join()); owns sockets, threads and the Gloo group.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agents/pipe_options.h"
#include "rpc/agent.h"
#include "rpc/device_map.h"

namespace switchboard {
class Store;
}

namespace switchboard::agents {

class PipeAgent final : public rpc::RpcAgent {
 public:
  // Rendezvous (static) or joins (dynamic, `world_size` nullopt) as
  // described above.
  PipeAgent(std::shared_ptr<Store> store, std::string name, int rank,
            std::optional<int> world_size, const PipeAgentOptions& options = {});
  ~PipeAgent() override;

  void start(RequestHandler handler) override;
  rpc::Future<rpc::Message> send(const rpc::WorkerInfo& to, rpc::Message request,
                                 Timeout timeout) override;
  rpc::WorkerInfo worker(const std::string& name) const override;
  rpc::WorkerInfo worker(int id) const override;
  std::vector<rpc::WorkerInfo> workers() const override;
  void set_membership_listener(rpc::MembershipListener listener) override;

  // Static: waits until this agent has no call in flight and no request
  // being handled, then meets every worker at a Gloo barrier. Dynamic:
  // leaves the group (above). TimeoutError after `timeout` (0: none; a
  // minute for the dynamic token) naming what was still in flight or the
  // barrier.
  void join(Timeout timeout) override;
  // Fails pending calls with Error(kCancelled), says goodbye to every peer,
  // closes the sockets, joins the I/O threads and the pool. Idempotent;
  // waits for handlers that are running.
  void shutdown() override;

  // The address and port this worker listens on.
  std::string listen_address() const;
  int listen_port() const;
  // The device maps responses to each caller travel along (the inverse of
  // the caller's map to this worker).
  rpc::DeviceMaps reverse_device_maps() const;
  std::vector<Device> devices() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace switchboard::agents
