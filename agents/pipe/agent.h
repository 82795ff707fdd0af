// PipeAgent: the PIPE RPC backend, the default. One TCP connection (Boost.Asio)
// per pair of workers, static groups (a world size) and dynamic ones (none:
// workers join and leave while the others run), CUDA tensors along device
// maps, failure detection by socket errors and heartbeats.
//
// docs/pipe.md describes its behaviour for users (rendezvous, dynamic groups,
// failures, tensors and device maps, limits, the objects inside it);
// docs/wire_formats.md its frames; docs/thread_model.md its threads.
//
// Thread safety: as RpcAgent (rpc/agent.h). Ownership: shares the store
// (construction and join()); owns its sockets and threads.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agents/pipe/options.h"
#include "rpc/agent.h"
#include "rpc/device_map.h"

namespace switchboard {
class Store;
}

namespace switchboard::agents::pipe {

class PipeAgent final : public rpc::RpcAgent {
 public:
  // Static group: listens, exchanges every worker's address and device
  // maps through the store, validates them and connects to every worker. Dynamic group (`world_size` nullopt): takes the store's
  // membership token and introduces itself to every member. Throws
  // std::invalid_argument (a bad name or option, a duplicate name, a bad
  // device map, a rank taken, a member's refusal naming the member and its
  // reason) or TimeoutError naming the missing workers or the token's
  // holder after options.rpc_timeout.
  PipeAgent(std::shared_ptr<Store> store, std::string name, int rank,
            std::optional<int> world_size, const PipeAgentOptions& options = {});
  ~PipeAgent() override;

  void start(RequestHandler handler) override;
  // Never throws; the future fails with TimeoutError (`rpc to "w1" function
  // "add": timed out after 200 ms`), ConnectionError (the worker's
  // connection failed or it left; names it), Error(kCancelled) (this agent
  // shut down), NotFoundError (not a worker of this group) or
  // std::invalid_argument (before start(), not a request, a tensor that
  // cannot travel: a CUDA tensor without a device map entry).
  rpc::Future<rpc::Message> send(const rpc::WorkerInfo& to, rpc::Message request,
                                 Timeout timeout) override;
  rpc::WorkerInfo worker(const std::string& name) const override;
  rpc::WorkerInfo worker(int id) const override;
  std::vector<rpc::WorkerInfo> workers() const override;
  void set_membership_listener(rpc::MembershipListener listener) override;

  // Static: waits until the whole group is quiet (rendezvous/quiet_group.h, over
  // the store). Dynamic: leaves the group (docs/pipe.md, "Dynamic groups").
  // TimeoutError after `timeout` (0: none; a minute for the dynamic token)
  // naming what was still in flight, or the workers missing or busy;
  // ConnectionError naming workers that shut down or were lost first.
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

}  // namespace switchboard::agents::pipe
