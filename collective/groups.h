// Named collective groups: Ray's `ray.util.collective` API in C++.
//
//   init_collective_group(world_size, rank, backend, group_name, timeout)
//   create_collective_group(spec)            declarative; members join lazily
//   destroy_collective_group(group_name)
//   is_group_initialized / get_rank / get_collective_group_size
//   allreduce(tensor, group_name, op), broadcast(tensor, src_rank,
//   group_name), ... for every ProcessGroup op, and the *_multigpu ones.
//
// A process holds its groups in a CollectiveContext (Ray's GroupManager).
// The free functions use CollectiveContext::global(); the same operations
// are methods of the context, so tests can run ranks as threads of one
// process, each thread with its own context.
//
// Store. A group rendezvouses through a Store, chosen at each initialization
// (first that applies): the `store` argument; the context's default store
// (set_default_store); a new TcpStore client of the server at
// MASTER_ADDR:MASTER_PORT (PyTorch's variable names; std::invalid_argument
// naming the missing variables when there is none; one client per call,
// closed once the call returned, so no server is ever started here). Each
// group's own keys live under "collective/<group_name>/", declarative specs
// under "collective/specs/<group_name>". The GLOO backend's bind address is
// chosen by its factory (registry.h): tests set SWITCHBOARD_GLOO_HOSTNAME
// to 127.0.0.1.
//
// Generations (why destroy + init of the same name never reads stale
// keys). Every initialization of group G as rank r of a world of W adds 1 to
// the store counter "collective/G/inits/W/r" and so gets its generation n;
// the backend then rendezvouses under the fresh PrefixStore
// "collective/G/ws<W>/gen<n>". The rule: the n-th initialization of G at
// world size W by rank r meets the n-th by every other rank. It holds as
// long as every member initializes G at W as often as the others (destroy
// and re-init on all members, as Ray requires), also across process
// restarts (the count is in the store, not in the process), and a change of
// world size starts new counters. An initialization that failed (e.g. timed
// out) still counts: after one, either every member retries, or the group
// gets a new name.
//
// Declarative groups. create_collective_group(spec) writes the spec to
// "collective/specs/<group_name>" (Error(kFailedPrecondition) when a
// different spec is already there; the same spec again is a no-op). A
// process knows itself by member_name(). The first op on a group that is
// not initialized in this context reads the spec, waiting up to
// spec_wait_timeout() for it to appear (then TimeoutError naming the group
// and the spec key), and, when this member is listed, initializes the
// group with its index in the list as its rank and the spec's backend and
// timeout; when it is not listed, the op throws std::invalid_argument
//   <op>: this process (member "x") is not a member of collective group "g"
// get_rank and get_collective_group_size look the spec up too, but never
// wait for it to appear: with no spec (or no store at all) they return -1,
// as for a non-member (Ray returns -1 for any group not initialized). A
// lazy initialization is a rendezvous: it blocks until every member joined
// (or the spec's timeout passed), so members should reach their first use
// of the group at about the same time, as with init_collective_group.
//
// Destroy. destroy_collective_group(name) drops this process's group and
// returns true, or returns false when no group of that name was initialized
// here (Ray logs a warning and does nothing; we say so in the result, so
// that cleanup code may call it unconditionally). An initialization of that
// name in progress on another thread is waited for first. It never touches
// the store: the spec of a declarative group stays, and the next op on the
// name initializes the next generation. remove_collective_group_spec
// deletes a spec (then a different spec may be declared under the name).
//
// Ops. The free functions and the context's op methods are synchronous, as
// in Ray: they return once the op completed on this rank, having waited at
// most the group's timeout (TimeoutError otherwise; see work.h). For
// asynchronous use, get_group(name) returns the ProcessGroup itself, whose
// ops return a Work. Argument errors are std::invalid_argument from the
// backend (see process_group.h).
//
// Names. Group names are non-empty and contain no '/'. Member names are
// non-empty and contain no line breaks.
//
// Thread safety: every method of CollectiveContext is thread-safe. Ops on
// one group must be issued in the same order on every rank, so issue them
// from one thread per group. A group destroyed while an op on it runs in
// another thread lives until that op returned. Initializing the same name
// from two threads at once: the second explicit init_collective_group
// throws; a second lazy initialization waits for the first.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "collective/process_group.h"
#include "core/tensor.h"
#include "collective/work.h"
#include "common/mutex.h"

namespace switchboard {
class Store;
}

namespace switchboard::collective {

using GroupTimeout = std::chrono::milliseconds;

inline constexpr char kDefaultGroupName[] = "default";

// What create_collective_group declares: `members` are member names in rank
// order (members[r] gets rank r); world_size must equal members.size().
struct GroupSpec {
  std::string group_name = kDefaultGroupName;
  int world_size = 0;
  std::string backend = "GLOO";  // any case; stored upper case
  std::vector<std::string> members;
  GroupTimeout timeout = ProcessGroup::kDefaultTimeout;

  friend bool operator==(const GroupSpec&, const GroupSpec&) = default;
};

// Text encoding of a spec, as stored ("key=value" lines, members last, in
// rank order). encode checks the spec (std::invalid_argument naming the
// problem) and normalizes the backend name; decode throws
// std::invalid_argument for text it cannot read.
std::string encode_group_spec(const GroupSpec& spec);
GroupSpec decode_group_spec(std::string_view text);

class CollectiveContext {
 public:
  // member_name() starts as $SWITCHBOARD_MEMBER_NAME when set and non-empty,
  // else "<hostname>:<pid>". No default store.
  CollectiveContext();
  // Destroys every group of this context (each waits for its running op).
  ~CollectiveContext();
  CollectiveContext(const CollectiveContext&) = delete;
  CollectiveContext& operator=(const CollectiveContext&) = delete;

  // The process's context, used by the free functions below; created on
  // first use and destroyed at exit (destroy your groups before that).
  static CollectiveContext& global();

  // The store used when an init/create call passes none (nullptr: none, fall
  // back to MASTER_ADDR/MASTER_PORT). The context shares ownership.
  void set_default_store(std::shared_ptr<Store> store) SB_EXCLUDES(mu_);
  std::shared_ptr<Store> default_store() const SB_EXCLUDES(mu_);

  // This process's name in declarative specs. Throws std::invalid_argument
  // for an invalid name.
  void set_member_name(std::string name) SB_EXCLUDES(mu_);
  std::string member_name() const SB_EXCLUDES(mu_);

  // How long an op waits for the spec of a group that is not initialized
  // here (default 300 s; Store::kNoTimeout waits forever).
  void set_spec_wait_timeout(GroupTimeout timeout) SB_EXCLUDES(mu_);
  GroupTimeout spec_wait_timeout() const SB_EXCLUDES(mu_);

  // Joins group `group_name` as `rank` of `world_size` over `backend` (any
  // case) and returns when every rank joined. Throws std::invalid_argument
  // for bad arguments, when the group is already initialized here, or when
  // no store can be found (see above); RegistryError / Error for an unknown
  // or unavailable backend (checked before the store is touched); whatever
  // the backend's rendezvous throws (TimeoutError after `timeout`).
  void init_collective_group(int world_size, int rank, std::string_view backend = "GLOO",
                             const std::string& group_name = kDefaultGroupName,
                             GroupTimeout timeout = ProcessGroup::kDefaultTimeout,
                             std::shared_ptr<Store> store = nullptr);

  // Writes `spec` to the store (see above). Does not initialize anything in
  // this process, even if it is a member. Throws std::invalid_argument for
  // an invalid spec or missing store, RegistryError for an unregistered
  // backend (availability is the members' business), and
  // Error(kFailedPrecondition) when a different spec of that name exists.
  void create_collective_group(const GroupSpec& spec,
                               std::shared_ptr<Store> store = nullptr);
  // Deletes the spec of `group_name`; returns whether there was one.
  bool remove_collective_group_spec(const std::string& group_name,
                                    std::shared_ptr<Store> store = nullptr);

  // Drops the local group; false when none was initialized (see above).
  bool destroy_collective_group(const std::string& group_name = kDefaultGroupName)
      SB_EXCLUDES(mu_);
  // True once `group_name` is initialized in this context; never looks at
  // the store.
  bool is_group_initialized(const std::string& group_name = kDefaultGroupName) const
      SB_EXCLUDES(mu_);
  // Names of the groups initialized here, sorted.
  std::vector<std::string> initialized_groups() const SB_EXCLUDES(mu_);
  // This process's rank / the group's size; -1 when this process is not a
  // member (or nothing is known about the group). May initialize a
  // declarative group lazily (see above).
  int get_rank(const std::string& group_name = kDefaultGroupName);
  int get_collective_group_size(const std::string& group_name = kDefaultGroupName);

  // The group itself (initializing a declarative one lazily, like an op),
  // for asynchronous ops and backend details. Throws as an op does. The
  // caller shares ownership: a group destroyed here lives on until the last
  // holder lets go.
  std::shared_ptr<ProcessGroup> get_group(
      const std::string& group_name = kDefaultGroupName);

  // Synchronous ops on a named group; see process_group.h for each op's
  // contract.
  void allreduce(Tensor& tensor, const std::string& group_name = kDefaultGroupName,
                 ReduceOp op = ReduceOp::kSum);
  void broadcast(Tensor& tensor, int src_rank = 0,
                 const std::string& group_name = kDefaultGroupName);
  void reduce(Tensor& tensor, int dst_rank = 0,
              const std::string& group_name = kDefaultGroupName,
              ReduceOp op = ReduceOp::kSum);
  void allgather(std::vector<Tensor>& outputs, const Tensor& input,
                 const std::string& group_name = kDefaultGroupName);
  void gather(std::vector<Tensor>& outputs, const Tensor& input, int dst_rank = 0,
              const std::string& group_name = kDefaultGroupName);
  void scatter(Tensor& output, const std::vector<Tensor>& inputs, int src_rank = 0,
               const std::string& group_name = kDefaultGroupName);
  void reduce_scatter(Tensor& output, const std::vector<Tensor>& inputs,
                      const std::string& group_name = kDefaultGroupName,
                      ReduceOp op = ReduceOp::kSum);
  void alltoall(std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                const std::string& group_name = kDefaultGroupName);
  void alltoall_single(Tensor& output, const Tensor& input,
                       const std::string& group_name = kDefaultGroupName);
  void barrier(const std::string& group_name = kDefaultGroupName);
  void send(const Tensor& tensor, int dst_rank,
            const std::string& group_name = kDefaultGroupName, int tag = 0);
  void recv(Tensor& tensor, int src_rank,
            const std::string& group_name = kDefaultGroupName, int tag = 0);

  void allreduce_multigpu(std::vector<Tensor>& tensors,
                          const std::string& group_name = kDefaultGroupName,
                          ReduceOp op = ReduceOp::kSum);
  void broadcast_multigpu(std::vector<Tensor>& tensors, int src_rank = 0,
                          int src_tensor = 0,
                          const std::string& group_name = kDefaultGroupName);
  void reduce_multigpu(std::vector<Tensor>& tensors, int dst_rank = 0, int dst_tensor = 0,
                       const std::string& group_name = kDefaultGroupName,
                       ReduceOp op = ReduceOp::kSum);
  void allgather_multigpu(std::vector<std::vector<Tensor>>& outputs,
                          const std::vector<Tensor>& inputs,
                          const std::string& group_name = kDefaultGroupName);
  void reduce_scatter_multigpu(std::vector<Tensor>& outputs,
                               const std::vector<std::vector<Tensor>>& inputs,
                               const std::string& group_name = kDefaultGroupName,
                               ReduceOp op = ReduceOp::kSum);
  void send_multigpu(const Tensor& tensor, int dst_rank, int dst_gpu_index,
                     const std::string& group_name = kDefaultGroupName, int tag = 0);
  void recv_multigpu(Tensor& tensor, int src_rank, int src_gpu_index,
                     const std::string& group_name = kDefaultGroupName, int tag = 0);

 private:
  struct Slot {
    std::shared_ptr<ProcessGroup> group;  // null while initializing
  };
  enum class SpecWait { kWait, kNoWait };

  // The store to use: `explicit_store`, the default store, or a TcpStore
  // client from the environment (connect timeout `timeout`); when none and
  // not `required`, null. `what` prefixes errors.
  std::shared_ptr<Store> resolve_store(std::shared_ptr<Store> explicit_store,
                                       GroupTimeout timeout, std::string_view what,
                                       bool required) const;
  // Reserves `group_name` for an initialization in progress (throws
  // std::invalid_argument when taken); install() fills it, release() frees
  // it after a failure.
  void claim(const std::string& group_name, std::string_view what) SB_EXCLUDES(mu_);
  void install(const std::string& group_name, std::shared_ptr<ProcessGroup> group)
      SB_EXCLUDES(mu_);
  void release(const std::string& group_name) SB_EXCLUDES(mu_);
  // Counts this initialization in the store (the generation rule) and runs
  // the backend's factory under the generation's PrefixStore.
  std::shared_ptr<ProcessGroup> build(const std::string& group_name, int world_size,
                                      int rank, std::string_view backend,
                                      GroupTimeout timeout,
                                      const std::shared_ptr<Store>& store) const;
  // The spec of `group_name`, or nullopt (kNoWait only) when there is none.
  std::optional<GroupSpec> read_spec(Store& store, const std::string& group_name,
                                     SpecWait wait, GroupTimeout wait_timeout,
                                     const std::string& me, std::string_view what) const;
  // The local group, initializing a declarative one from its spec. Null
  // when this process is not a member (or, with kNoWait, nothing is known).
  std::shared_ptr<ProcessGroup> find_or_join(const std::string& group_name, SpecWait wait,
                                             std::string_view what) SB_EXCLUDES(mu_);
  // find_or_join with kWait, throwing when this process is not a member.
  std::shared_ptr<ProcessGroup> require(const std::string& group_name,
                                        std::string_view what);

  mutable Mutex mu_;
  CondVar slots_changed_;
  std::map<std::string, Slot> slots_ SB_GUARDED_BY(mu_);
  std::shared_ptr<Store> default_store_ SB_GUARDED_BY(mu_);
  std::string member_name_ SB_GUARDED_BY(mu_);
  GroupTimeout spec_wait_timeout_ SB_GUARDED_BY(mu_) = ProcessGroup::kDefaultTimeout;
};

// The free functions: CollectiveContext::global()'s methods of the same name.
void init_collective_group(int world_size, int rank, std::string_view backend = "GLOO",
                           const std::string& group_name = kDefaultGroupName,
                           GroupTimeout timeout = ProcessGroup::kDefaultTimeout,
                           std::shared_ptr<Store> store = nullptr);
void create_collective_group(const GroupSpec& spec,
                             std::shared_ptr<Store> store = nullptr);
bool destroy_collective_group(const std::string& group_name = kDefaultGroupName);
bool is_group_initialized(const std::string& group_name = kDefaultGroupName);
int get_rank(const std::string& group_name = kDefaultGroupName);
int get_collective_group_size(const std::string& group_name = kDefaultGroupName);

void allreduce(Tensor& tensor, const std::string& group_name = kDefaultGroupName,
               ReduceOp op = ReduceOp::kSum);
void broadcast(Tensor& tensor, int src_rank = 0,
               const std::string& group_name = kDefaultGroupName);
void reduce(Tensor& tensor, int dst_rank = 0,
            const std::string& group_name = kDefaultGroupName,
            ReduceOp op = ReduceOp::kSum);
void allgather(std::vector<Tensor>& outputs, const Tensor& input,
               const std::string& group_name = kDefaultGroupName);
void gather(std::vector<Tensor>& outputs, const Tensor& input, int dst_rank = 0,
            const std::string& group_name = kDefaultGroupName);
void scatter(Tensor& output, const std::vector<Tensor>& inputs, int src_rank = 0,
             const std::string& group_name = kDefaultGroupName);
void reduce_scatter(Tensor& output, const std::vector<Tensor>& inputs,
                    const std::string& group_name = kDefaultGroupName,
                    ReduceOp op = ReduceOp::kSum);
void alltoall(std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
              const std::string& group_name = kDefaultGroupName);
void alltoall_single(Tensor& output, const Tensor& input,
                     const std::string& group_name = kDefaultGroupName);
void barrier(const std::string& group_name = kDefaultGroupName);
void send(const Tensor& tensor, int dst_rank,
          const std::string& group_name = kDefaultGroupName, int tag = 0);
void recv(Tensor& tensor, int src_rank, const std::string& group_name = kDefaultGroupName,
          int tag = 0);

void allreduce_multigpu(std::vector<Tensor>& tensors,
                        const std::string& group_name = kDefaultGroupName,
                        ReduceOp op = ReduceOp::kSum);
void broadcast_multigpu(std::vector<Tensor>& tensors, int src_rank = 0,
                        int src_tensor = 0,
                        const std::string& group_name = kDefaultGroupName);
void reduce_multigpu(std::vector<Tensor>& tensors, int dst_rank = 0, int dst_tensor = 0,
                     const std::string& group_name = kDefaultGroupName,
                     ReduceOp op = ReduceOp::kSum);
void allgather_multigpu(std::vector<std::vector<Tensor>>& outputs,
                        const std::vector<Tensor>& inputs,
                        const std::string& group_name = kDefaultGroupName);
void reduce_scatter_multigpu(std::vector<Tensor>& outputs,
                             const std::vector<std::vector<Tensor>>& inputs,
                             const std::string& group_name = kDefaultGroupName,
                             ReduceOp op = ReduceOp::kSum);
void send_multigpu(const Tensor& tensor, int dst_rank, int dst_gpu_index,
                   const std::string& group_name = kDefaultGroupName, int tag = 0);
void recv_multigpu(Tensor& tensor, int src_rank, int src_gpu_index,
                   const std::string& group_name = kDefaultGroupName, int tag = 0);

}  // namespace switchboard::collective
