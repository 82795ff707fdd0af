// GlooProcessGroup: the CPU ProcessGroup, over Gloo's TCP transport.
//
// Construction rendezvouses through `store` (every rank publishes its
// address under a PrefixStore of "<group name>/gloo/" and connects a full
// mesh) and blocks until every rank arrived or `timeout` passed (then
// TimeoutError naming the group, the rank and the ranks still missing).
//
// Network interface (first that applies):
//   1. GlooOptions::iface / GlooOptions::hostname when set;
//   2. the rule every listener of a worker follows (common/listen_address.h):
//      SWITCHBOARD_IFNAME; then the older SWITCHBOARD_GLOO_SOCKET_IFNAME,
//      GLOO_SOCKET_IFNAME (PyTorch's name) and SWITCHBOARD_GLOO_HOSTNAME;
//      then the local address that routes to the store (MASTER_ADDR),
//      this host's name, the first interface that is up, 127.0.0.1.
// Tests pass hostname = "127.0.0.1".

// Same host: when every rank runs on this host (the same kernel, and
// network, IPC and PID namespaces) and the group has at most 1024 ranks,
// allreduce, reduce, reduce_scatter, broadcast, allgather and barrier move
// their bytes through a memory segment the ranks share, at memcpy speed,
// instead of through the loopback (collective/gloo_same_host.h). It takes
// 16 MiB of shared memory per group of up to 32 ranks, 512 KiB per rank
// beyond. The other ops (gather, scatter, alltoall, send, recv), and groups
// that span hosts, use Gloo's TCP. GlooOptions::same_host_memory = false
// or SWITCHBOARD_GLOO_SHM=0 on any rank keeps the whole group on TCP. The
// errors below keep their types; a peer process that exits mid-op is named
// with its pid, at once (its pid is watched while waiting).
//
// Every op of ProcessGroup is supported on CPU tensors of every dtype
// (reductions run Switchboard's element-wise kernels, so float16, bfloat16
// and bool reduce too). Collectives run one at a time, in issue order, on
// the group's own thread; send/recv are posted at once and driven by
// Work::wait(), so a rank may post a send before its recv without
// deadlock. Allreduces of up to 1 MiB run Gloo's BCUBE algorithm (few
// whole-chunk steps), larger ones its RING (pipelined segments).
// reduce_scatter is an allreduce of the concatenated inputs (Gloo has no
// unbound-buffer reduce-scatter); alltoall (list form) packs into one
// buffer when the tensors are not already adjacent.
//
// Errors: a peer that closes its connection fails the op with
// ConnectionError, one that stays silent with TimeoutError after the
// group's timeout; both name the op, the group, the rank and the timeout.
// Ranks that disagree on a collective (its op, dtype, element count, root
// or reduction) fail it at once on every rank with Error(kFailedPrecondition)
// naming each side, instead of ending the process in Gloo
// (collective/gloo_signature.h). After any of these errors the group is
// unusable: destroy it and create a new one.
//
// SIGPIPE: Gloo writes to its sockets without MSG_NOSIGNAL, so a write to
// a peer that exited would raise SIGPIPE and kill the process. The first
// GlooProcessGroup therefore sets SIGPIPE to SIG_IGN, process-wide, when
// its disposition is still the default (a handler the program installed
// is left alone); the write then fails and the op fails with
// ConnectionError.
//
// Thread safety: as ProcessGroup. The destructor waits for the op that is
// running and fails queued ones with Error(kCancelled).
#pragma once

#include <memory>
#include <string>

#include "collective/process_group.h"

namespace switchboard {
class Store;
}

namespace switchboard::collective {

struct GlooOptions {
  std::string group_name = "default";
  ProcessGroup::Timeout timeout = ProcessGroup::kDefaultTimeout;
  std::string hostname;  // address or host name to bind; see above
  std::string iface;     // interface name to bind; see above
  // Allreduce, reduce, reduce_scatter, broadcast, allgather and barrier
  // through shared memory when every rank of the group runs on this host
  // (see above). Off when false here, or SWITCHBOARD_GLOO_SHM=0, on any
  // rank.
  bool same_host_memory = true;
};

class GlooProcessGroup final : public ProcessGroup {
 public:
  // `store` is used during construction only (the caller keeps ownership).
  GlooProcessGroup(Store& store, int rank, int size, GlooOptions options = {});
  ~GlooProcessGroup() override;

  std::string backend_name() const override { return "GLOO"; }

  Work allreduce(Tensor& tensor, ReduceOp op = ReduceOp::kSum) override;
  Work broadcast(Tensor& tensor, int src_rank) override;
  Work reduce(Tensor& tensor, int dst_rank, ReduceOp op = ReduceOp::kSum) override;
  Work allgather(std::vector<Tensor>& outputs, const Tensor& input) override;
  Work gather(std::vector<Tensor>& outputs, const Tensor& input, int dst_rank) override;
  Work scatter(Tensor& output, const std::vector<Tensor>& inputs, int src_rank) override;
  Work reduce_scatter(Tensor& output, const std::vector<Tensor>& inputs,
                      ReduceOp op = ReduceOp::kSum) override;
  Work alltoall(std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs) override;
  Work alltoall_single(Tensor& output, const Tensor& input) override;
  Work barrier() override;
  // A barrier bounded by `timeout` (> 0) instead of the group's timeout: it
  // fails with TimeoutError after `timeout`, and the group's thread is free
  // again then (a Work::wait() that gives up earlier leaves the op running
  // until its own timeout, and the destructor waits for it).
  Work barrier(std::chrono::milliseconds timeout);
  Work monitored_barrier(std::chrono::milliseconds timeout,
                         bool wait_all_ranks = false) override;
  Work send(const Tensor& tensor, int dst_rank, int tag = 0) override;
  Work recv(Tensor& tensor, int src_rank, int tag = 0) override;
  Work recv_any(Tensor& tensor, int tag = 0) override;

  // The address Gloo bound, e.g. "127.0.0.1" (for logs and tests).
  std::string device_description() const;
  // Whether allreduce, reduce, reduce_scatter, broadcast, allgather and
  // barrier run through shared memory (every rank on this host, none
  // turned it off).
  bool same_host_memory() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace switchboard::collective
