// Membership: a dynamic PIPE group's joins and leaves (world_size absent;
// agents/pipe/agent.h, "Dynamic groups"), on both sides: this worker
// joining (under the membership token: read the members, check the rank
// and name, validate the device maps, introduce itself to every member and
// wait for their welcomes, publish itself) and leaving (goodbyes, draining,
// unpublishing); a member admitting a joiner, and reporting joins and
// leaves to the membership listener. Internal to //agents/pipe.
//
// Store keys, under the agent's "pipe/" prefix:
//   dyn/token      the membership token (rendezvous/membership_token.h)
//   dyn/group      the group's identity: a random id its first worker
//                  wrote; every member remembers it
//   dyn/members    the current members: encode_members() of (rank,
//                  announcement), written only by the token's holder
//   dyn/rank/<r>   the name of the worker that took rank r (ranks are never
//                  reused, so that a rank names one worker for the life of
//                  the group)
//   dyn/evicted/<r> why rank r was taken off the member list, and by whom
//   dyn/view/<r>   member r's word on its links, rewritten at each poll: a
//                  counter and the listed ranks it cannot reach
//                  (agents/pipe/partition.h)
//   dyn/probation  the id of a group founded in a store that held none,
//                  during its founder's first heartbeat timeout
//   dyn/reclaimed/<id>  why group <id> (founded on probation) lost the
//                  store to an older group, for its members to read
//
// One view of the group: the member list in the store is the group. After
// joining, a watcher thread keeps this worker's view equal to it:
//   - a member whose connection this worker lost (a socket error, or
//     silence past the heartbeat timeout) is taken off the list under the
//     token once the members' link views say that its side of the
//     partition is the smaller (decide_eviction in agents/pipe/partition.h:
//     the live members that cannot reach it outnumber it and those that
//     still do; on a tie the side holding the lowest rank wins; a member
//     whose view stands still for the heartbeat timeout is dead and does
//     not count). Until then it is asked again at every poll. So the larger
//     side of a partition keeps the group and the smaller never evicts. One
//     that said goodbye without leaving (an ungraceful shutdown) is taken
//     off at once;
//   - every poll (heartbeat_timeout / 4, between heartbeat_interval and
//     1 s) reads the list: a member that was on it and is not any more is
//     dropped here as well (calls to it fail naming why), and a list
//     without this worker means it was evicted: it drops every member,
//     refuses newcomers and reports itself as left;
//   - a store that lost the group's keys (restarted empty) gets them back
//     from this worker's view. A worker that finds no group there founds
//     one on probation: within its first heartbeat timeout, the members of
//     an older group that still run (they see the store again within it)
//     take the store back, and every member of the young group is evicted
//     with a reason naming the older group and its members, so that no
//     joiner is left silently alone beside a live group. A store that
//     holds another group's id past that is logged as an error (a second
//     group formed there), never joined.
//
// The code: joining, admitting and leaving in membership.cc, the watcher
// in membership_watch.cc, reading the records in membership_records.h.
//
// Thread safety: join() once, on the constructing thread; leave() on the
// owner's thread; the rest on any thread (hellos arrive on I/O threads).
// mu_ guards the welcomes, the lost members, the listener, the departures
// waiting for the watcher and the watcher's state; it is never held while
// calling into the peer table, the store, the pool or the listener.
// group_id_ and mine_ are written by join() before the watcher starts and
// never after. The watcher's own fields (listed_, ...) are its thread's.
// Ownership: shares the store; the peer table, transport, call table and
// options are the agent's and outlive this; stop() (or the destructor)
// joins the watcher, which may take one store call's time.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "agents/pipe/announcement.h"
#include "agents/pipe/handshake.h"
#include "agents/pipe/options.h"
#include "agents/pipe/partition.h"
#include "agents/pipe/peer_table.h"
#include "agents/pipe/transport/transport.h"
#include "common/mutex.h"
#include "rpc/agent.h"
#include "rpc/call_table.h"
#include "rpc/thread_pool.h"

namespace switchboard {
class Store;
}
namespace switchboard::rendezvous {
class MembershipToken;
}

namespace switchboard::agents::pipe {

class Membership {
 public:
  // What the agent does to a member that is out of the group: marks it
  // down with `why` (calls to it fail with ConnectionError naming it and
  // `why`), closes its connection and reports it as left.
  using DropPeer = std::function<void(int peer, const std::string& why)>;

  // How a member's connection ended, for on_peer_lost().
  enum class Gone {
    kQuiet,  // this worker is stopping, or the member had left
    kLost,   // a socket error or the heartbeat timeout
    kLeft,   // it said goodbye
  };

  // This worker is `name`, rank `rank` of a group of at most `capacity`
  // ranks; listeners run on `pool`; `drop` as above.
  Membership(std::shared_ptr<Store> store, std::string name, int rank, int capacity,
             const PipeAgentOptions& options, PeerTable& peers,
             transport::PipeTransport& transport, const PipeAuth& auth,
             rpc::CallTable& calls, std::shared_ptr<rpc::ThreadPool> pool, DropPeer drop);
  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  // Joins the group as `mine` (see above), founding it when the store
  // holds none, and starts the watcher, within one step timeout in all. A
  // member this worker cannot reach is taken off the list with the join
  // when it is dead (its link view stands still for the heartbeat
  // timeout); one that is alive means a partition, and the join fails,
  // changing nothing. Throws TimeoutError (the token, or members that did
  // not answer, named), ConnectionError (members alive but unreachable, or
  // the token taken over while joining), std::invalid_argument (a rank
  // taken before, a name in use, bad device maps, a member's refusal with
  // its reason).
  void join(const WorkerAnnouncement& mine) SB_EXCLUDES(mu_);
  // Leaves the group: stops the watcher, goodbyes, then draining calls in
  // both directions for up to `timeout` (0: a minute), renewing the token.
  // TimeoutError naming what was still in flight (this worker has left
  // anyway). A worker that was evicted only drains.
  void leave(std::chrono::milliseconds timeout) SB_EXCLUDES(mu_);
  // Stops the watcher and waits for it. Idempotent.
  void stop() SB_EXCLUDES(mu_);
  // Whether the group evicted this worker, and why ("" while a member).
  std::string evicted() const SB_EXCLUDES(mu_);
  // Whether it was evicted: one atomic load, for the send path.
  bool was_evicted() const { return was_evicted_.load(std::memory_order_acquire); }

  // A member's side of a join hello on `connection` (`joiner`: its
  // announcement, decoded): admits the joiner or refuses it, answers with a
  // welcome, and reports the join. False when refused (the connection
  // closes once the welcome went out).
  bool on_join_hello(const std::shared_ptr<transport::Connection>& connection,
                     const Hello& hello, const WorkerAnnouncement& joiner)
      SB_EXCLUDES(mu_);
  // The joiner's side: a member's welcome (accepted or refused).
  void on_welcome(const Hello& hello) SB_EXCLUDES(mu_);
  // The connection to `peer` ended (`how`, `why`): it counts as answered
  // while joining; after joining, a member lost or gone without leaving is
  // taken off the member list by the watcher (see above).
  void on_peer_lost(int peer, Gone how, const std::string& why) SB_EXCLUDES(mu_);

  // Reports that `worker` joined or left to the listener, on the pool.
  void publish(rpc::MembershipChange::Kind kind, const rpc::WorkerInfo& worker)
      SB_EXCLUDES(mu_);
  void set_listener(rpc::MembershipListener listener) SB_EXCLUDES(mu_);

 private:
  // What the membership steps may wait.
  std::chrono::milliseconds step_timeout() const;
  bool stopping() const SB_EXCLUDES(mu_);
  // How often the watcher reads the member list.
  std::chrono::milliseconds poll_interval() const;

  // The watcher thread's loop, and its steps (each may throw what the
  // store throws; the loop logs it and tries again next round).
  void watch() SB_EXCLUDES(mu_);
  void remove_departed(const std::map<int, std::pair<Gone, std::string>>& departed)
      SB_EXCLUDES(mu_);
  void reconcile() SB_EXCLUDES(mu_);
  // Writes this worker's link view for the list `listed` and reads the
  // other listed members' (views_, freshness_).
  void exchange_views(const std::set<int>& listed);
  // At join: which of `unreachable` (members this worker could not reach)
  // are alive, judged by their link views (`first_views`, as read at
  // `first_read`) moving on within the heartbeat timeout; those that could
  // not be judged by `deadline` count as alive. `token` is renewed
  // meanwhile.
  std::set<int> alive_among(const std::vector<int>& unreachable,
                            const std::map<int, uint64_t>& first_views,
                            std::chrono::steady_clock::time_point first_read,
                            std::chrono::steady_clock::time_point deadline,
                            rendezvous::MembershipToken& token);
  void restore() SB_EXCLUDES(mu_);
  // This worker and the members it is connected to.
  std::vector<Member> view_now() const;
  // Writes view_now() as the group's member list (with the group's id and
  // the members' rank keys), and the pairs in `also`, in one request; the
  // token is held. Returns the members' names, for logs.
  std::string write_view(std::vector<std::pair<std::string, std::vector<uint8_t>>> also);
  // Whether group `group` is on probation (founded in a store that held no
  // group, within its founder's first heartbeat timeout).
  bool on_probation(const std::string& group);
  // Takes the store back from group `young` (on probation; its members
  // `young_members`) for this one, recording why for its members.
  void reclaim(const std::string& young, const std::vector<Member>& young_members)
      SB_EXCLUDES(mu_);
  // The founder's probation ends: its key goes (under the token).
  void end_probation_if_due() SB_EXCLUDES(mu_);
  // This worker is off the list: drops every member, refuses newcomers.
  void become_evicted(const std::string& why) SB_EXCLUDES(mu_);
  // Why rank `r` is off the list, as its evicted/<r> key says (or a
  // generic reason).
  std::string removal_reason(int r);
  // Logs, once per id, that the store holds another group.
  void report_other_group(const std::string& other);

  const std::shared_ptr<Store> store_;
  const std::string name_;
  const int rank_;
  const int capacity_;
  const PipeAgentOptions& options_;
  PeerTable& peers_;
  transport::PipeTransport& transport_;
  const PipeAuth& auth_;
  rpc::CallTable& calls_;
  const std::shared_ptr<rpc::ThreadPool> pool_;
  const DropPeer drop_;

  // Set by join() before the watcher starts; read-only after.
  std::string group_id_;
  WorkerAnnouncement mine_;

  // The watcher thread's own: the ranks on the list at its last read, and
  // the other group it last reported; its link view's counter, the other
  // members' latest views and how fresh they are, and the members it lost
  // that are not decided yet (rank → why), with what it last logged of
  // them.
  std::set<int> listed_;
  std::string reported_group_;
  uint64_t view_seq_ = 0;
  std::map<int, LinkView> views_;
  ViewFreshness freshness_;
  std::map<int, std::string> suspects_;
  std::string undecided_logged_;
  // When this worker's probation as the founder of the group ends (none
  // when it did not found it, or once it has ended). Set by join().
  std::optional<std::chrono::steady_clock::time_point> probation_until_;

  std::thread watcher_;
  std::atomic<bool> was_evicted_{false};  // evicted_ is set

  mutable Mutex mu_;
  CondVar wake_;  // a departure to record, or stopping
  // Members gone, for the watcher to take off the list (rank → how, why).
  std::map<int, std::pair<Gone, std::string>> departed_ SB_GUARDED_BY(mu_);
  bool watching_ SB_GUARDED_BY(mu_) = false;
  bool stopping_ SB_GUARDED_BY(mu_) = false;
  std::string evicted_ SB_GUARDED_BY(mu_);
  CondVar answered_;  // a welcome came, or a member was lost
  // The members' answers to this worker's join (rank → "" when accepted,
  // the reason when refused), and the members lost meanwhile.
  std::map<int, std::string> welcomes_ SB_GUARDED_BY(mu_);
  std::set<int> lost_ SB_GUARDED_BY(mu_);
  rpc::MembershipListener listener_ SB_GUARDED_BY(mu_);
};

}  // namespace switchboard::agents::pipe
