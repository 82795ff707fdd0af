// RRefTable: one worker's side of the RRef protocol (rpc/rref.h): the
// values it owns and how many references to each exist, the references it
// holds as a user, and the references it sent that their receivers have not
// yet announced to the owner. Internal to the RPC layer: RpcContext makes
// one per init_rpc and routes the protocol's requests to serve().
//
// The protocol: requests to reserved functions (names begin with
// "__sb_rref_"), their arguments a msgpack array as for any call
// (docs/wire_formats.md, "RRef protocol"):
//   __sb_rref_remote  (creator, serial, type, counted, function, args, target)
//                     run `function` (on the value of `target` first, when
//                     set) and keep its result as RRef (creator, serial);
//                     answered once the value is there
//   __sb_rref_fetch   (creator, serial)            the value, as a response
//   __sb_rref_call    (creator, serial, function, args)
//                     `function` with the value first; its response
//   __sb_rref_fork    (creator, serial, parent, fork)
//                     count a new user, then tell `parent` to drop fork
//   __sb_rref_release (fork)                       to a parent: drop it
//   __sb_rref_delete  (creator, serial)            a user is gone
//
// Thread safety: thread-safe. Cores are never destroyed under mu_.
#pragma once

#include <atomic>
#include <chrono>
#include <compare>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/mutex.h"
#include "rpc/function_registry.h"
#include "rpc/future.h"
#include "core/message.h"
#include "rpc/rref.h"
#include "rpc/thread_pool.h"

namespace switchboard::rpc {
class RpcContext;
}

namespace switchboard::rpc::detail {

// An RRef's identity: the worker that created it (its id) and a number
// that worker never gives twice (a random start, then counting).
struct RRefId {
  int32_t creator = -1;
  uint64_t serial = 0;
  auto operator<=>(const RRefId&) const = default;
};

// A value this worker owns.
struct OwnerEntry {
  explicit OwnerEntry(std::shared_ptr<Executor> executor)
      : promise(std::move(executor)), value(promise.get_future()) {}

  // The function's response (kResponse, or kError when it threw).
  Promise<Message> promise;
  Future<Message> value;

  // The value now, as a response: the typed value's encoding once
  // local_value() made one (it may have changed it), else the function's
  // response, each RRef in it packed anew (a reference of its own for each
  // copy that goes out, as torch pickles the value anew each time). Throws
  // what the function's future failed with.
  Message current() const SB_EXCLUDES(typed_mu);

  mutable Mutex typed_mu;
  std::shared_ptr<void> typed SB_GUARDED_BY(typed_mu);
  std::string typed_type SB_GUARDED_BY(typed_mu);
  TypedEncoder encode SB_GUARDED_BY(typed_mu);
  // The RRefs the function's response holds, in the order they appear in
  // it: this worker's own references, kept for as long as the value lives
  // (set before `promise` completes, constant after).
  std::vector<std::shared_ptr<RRefCore>> held;
};

class RRefCore : public std::enable_shared_from_this<RRefCore> {
 public:
  // A user's reference, counted by the owner once `confirmed` succeeds.
  // `creator`: this worker's remote() made it; released even when its
  // remote() failed (the owner may have counted it, or will: a release
  // that arrives first leaves a negative count that remote() evens out).
  RRefCore(std::shared_ptr<RRefTable> table, RRefId id, WorkerInfo owner, std::string type,
           Future<void> confirmed, bool creator = false);
  // The owner's reference (already counted in `entry`).
  RRefCore(std::shared_ptr<RRefTable> table, RRefId id, WorkerInfo owner, std::string type,
           std::shared_ptr<OwnerEntry> entry);
  ~RRefCore();
  RRefCore(const RRefCore&) = delete;
  RRefCore& operator=(const RRefCore&) = delete;

  const std::shared_ptr<RRefTable> table;
  const RRefId id;
  const WorkerInfo owner;
  const std::string type;
  const std::shared_ptr<OwnerEntry> entry;  // the owner's; null on users
  const Future<void> confirmed;
  const bool creator = false;
  // Set when graceful shutdown released this reference already.
  std::atomic<bool> released{false};
};

// "creator:serial", for logs and errors.
std::string id_text(RRefId id);

// The references packed on this thread for a call's arguments (the
// innermost RRefEncodeScope's), or null.
RRefEncodeScope::Forks* encode_forks_on_this_thread();

class RRefTable : public std::enable_shared_from_this<RRefTable> {
 public:
  RRefTable(RpcContext* context, WorkerInfo self, std::shared_ptr<ThreadPool> pool,
            std::shared_ptr<FunctionRegistry> functions,
            std::chrono::milliseconds rpc_timeout);

  static bool is_protocol(std::string_view function);
  // Serves a protocol request (never fails: errors become error responses).
  Future<Message> serve(const Message& request, const WorkerInfo& from);

  // remote(): runs user_request.function on `owner` (with the value of
  // `target` first, when set), its result a new RRef of `type`.
  std::shared_ptr<RRefCore> create(const WorkerInfo& owner, Message user_request,
                                   std::string type,
                                   std::optional<std::chrono::milliseconds> timeout,
                                   const std::shared_ptr<RRefCore>& target,
                                   RRefEncodeScope* forks);

  // rref_pack / rref_unpack. `expected_type` nullopt: whatever the RRef
  // says it is.
  std::string pack(const std::shared_ptr<RRefCore>& core);
  std::shared_ptr<RRefCore> unpack(const char* data, size_t size,
                                   const std::optional<std::string>& expected_type);

  Future<Message> fetch(const std::shared_ptr<RRefCore>& core,
                        std::optional<std::chrono::milliseconds> timeout);
  Future<Message> call(const std::shared_ptr<RRefCore>& core, Message request,
                       std::optional<std::chrono::milliseconds> timeout);

  // Graceful shutdown, before the group's quiet rounds (until `deadline`
  // at most): waits for the references this worker sent in calls to be
  // announced (not those whose call failed, nor those of owners that left)
  // and for what is queued to go out, then releases every reference it
  // holds as a user (once confirmed), except those still sent and not
  // announced (released when the owner tells, as at any time).
  void release_users(std::chrono::steady_clock::time_point deadline) SB_EXCLUDES(mu_);
  // After the last call: nothing is sent any more, owned values are let go
  // (a warning counts those that still had users), RRef calls fail.
  void close() SB_EXCLUDES(mu_);
  // After the agent stopped: fails the values still being made.
  void abandon() SB_EXCLUDES(mu_);

  // torch's _rref_context_get_debug_info: num_owner_rrefs, num_user_rrefs,
  // num_pending_users (not yet confirmed), num_forks (sent, not yet
  // announced to their owner).
  std::map<std::string, int64_t> debug_info() const SB_EXCLUDES(mu_);

  const WorkerInfo& self() const { return self_; }
  // Throws Error(kFailedPrecondition) after close().
  void check_open(std::string_view what) const SB_EXCLUDES(mu_);

  // The call that carried these forks failed: graceful shutdown no longer
  // waits for their announcement (they stay held: a leak, never an early
  // free).
  void orphan(const std::vector<uint64_t>& forks) SB_EXCLUDES(mu_);

  // For RRefCore.
  void add_user(RRefCore* core) SB_EXCLUDES(mu_);
  void drop_user(RRefCore* core) SB_EXCLUDES(mu_);
  void drop_owner_reference(RRefId id) SB_EXCLUDES(mu_);

 private:
  std::shared_ptr<OwnerEntry> owner_entry(RRefId id, bool count_user) SB_EXCLUDES(mu_);
  std::shared_ptr<OwnerEntry> owner_entry_locked(RRefId id) SB_REQUIRES(mu_);
  // Takes the value out when no reference is left and its remote() came;
  // the caller drops it after unlocking.
  std::shared_ptr<OwnerEntry> free_if_unused_locked(RRefId id) SB_REQUIRES(mu_);
  void drop_users_of(RRefId id, int64_t n, std::string_view why) SB_EXCLUDES(mu_);
  // Sends the release of a user's reference once the owner confirmed it.
  void release(const RRefCore& core) SB_EXCLUDES(mu_);
  void release_fork(uint64_t fork) SB_EXCLUDES(mu_);

  // Sends now (on this thread) / later (on the pool); nothing once closed.
  // `to.id` (when >= 0) is the incarnation meant: a worker of that name
  // with another id is a newcomer that never held the value, and the
  // message fails with ConnectionError naming the one that is gone.
  Future<Message> send_now(const WorkerInfo& to, Message request,
                           std::optional<std::chrono::milliseconds> timeout)
      SB_EXCLUDES(mu_);
  void send_later(WorkerInfo to, Message request) SB_EXCLUDES(mu_);
  void owe(int n) SB_EXCLUDES(mu_);
  Future<void> confirm_later(WorkerInfo to, Message request) SB_EXCLUDES(mu_);
  // The function's response `made` becomes the value of `entry`: the RRefs
  // in it become references this worker holds for the value (entry->held).
  void settle(const std::shared_ptr<OwnerEntry>& entry, const Message& made);

  Future<Message> serve_remote(const Message& request, const WorkerInfo& from);
  Future<Message> serve_fetch(const Message& request);
  Future<Message> serve_call(const Message& request, const WorkerInfo& from);
  Message serve_fork(const Message& request);
  Message serve_release(const Message& request);
  Message serve_delete(const Message& request);
  // The owner's value, then `function` called with it first.
  Future<Message> call_on_value(const std::shared_ptr<OwnerEntry>& entry, Message inner,
                                const WorkerInfo& from);

  RpcContext* const context_;
  const WorkerInfo self_;
  const std::shared_ptr<ThreadPool> pool_;
  const std::shared_ptr<FunctionRegistry> functions_;
  const std::chrono::milliseconds rpc_timeout_;

  mutable Mutex mu_;
  CondVar changed_;
  bool closed_ SB_GUARDED_BY(mu_) = false;
  int sending_ SB_GUARDED_BY(mu_) = 0;
  // Messages queued on the pool and not yet sent.
  int owed_ SB_GUARDED_BY(mu_) = 0;
  uint64_t next_serial_ SB_GUARDED_BY(mu_);
  uint64_t next_fork_ SB_GUARDED_BY(mu_);
  std::map<RRefId, std::shared_ptr<OwnerEntry>> owners_ SB_GUARDED_BY(mu_);
  // Per owned value: the references counted, and whether its remote() came.
  struct Count {
    int64_t users = 0;
    bool created = false;
  };
  std::map<RRefId, Count> counts_ SB_GUARDED_BY(mu_);
  std::map<uint64_t, std::shared_ptr<RRefCore>> forks_ SB_GUARDED_BY(mu_);
  std::set<uint64_t> orphans_ SB_GUARDED_BY(mu_);  // of forks_
  std::map<RRefId, std::shared_ptr<OwnerEntry>> closed_owners_ SB_GUARDED_BY(mu_);
  std::set<RRefCore*> users_ SB_GUARDED_BY(mu_);
};

}  // namespace switchboard::rpc::detail
