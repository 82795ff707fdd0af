// Membership: a dynamic PIPE group's joins and leaves (world_size absent;
// agents/pipe_agent.h, "Dynamic groups"), on both sides: this worker
// joining (under the membership token: read the members, check the rank
// and name, validate the device maps, introduce itself to every member and
// wait for their welcomes, publish itself) and leaving (goodbyes, draining,
// unpublishing); a member admitting a joiner, and reporting joins and
// leaves to the membership listener. Internal to //agents.
//
// Store keys, under the agent's "pipe/" prefix:
//   dyn/token      the membership token (rpc/membership_token.h)
//   dyn/members    the current members: encode_members() of (rank,
//                  announcement), written only by the token's holder
//   dyn/rank/<r>   the name of the worker that took rank r (ranks are never
//                  reused, so that a rank names one worker for the life of
//                  the group)
//
// Thread safety: join() once, on the constructing thread; leave() on the
// owner's thread; the rest on any thread (hellos arrive on I/O threads).
// mu_ guards the welcomes, the lost members and the listener; it is never
// held while calling into the peer table, the pool or the listener.
// Ownership: shares the store; the peer table, transport, call table and
// options are the agent's and outlive this.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "agents/pipe_options.h"
#include "agents/pipe_info.h"
#include "agents/pipe_peers.h"
#include "agents/pipe_transport.h"
#include "common/mutex.h"
#include "rpc/agent.h"
#include "rpc/call_table.h"
#include "rpc/thread_pool.h"

namespace switchboard {
class Store;
}

namespace switchboard::agents {

class Membership {
 public:
  // This worker is `name`, rank `rank` of a group of at most `capacity`
  // ranks; listeners run on `pool`.
  Membership(std::shared_ptr<Store> store, std::string name, int rank, int capacity,
             const PipeAgentOptions& options, PeerTable& peers, PipeTransport& transport,
             rpc::CallTable& calls, std::shared_ptr<rpc::ThreadPool> pool);
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  // Joins the group as `mine` (see above). Throws TimeoutError (the token,
  // or members that did not answer, named), std::invalid_argument (a rank
  // taken before, a name in use, bad device maps, a member's refusal with
  // its reason).
  void join(const WorkerAnnouncement& mine) SB_EXCLUDES(mu_);
  // Leaves the group: goodbyes, then draining calls in both directions for
  // up to `timeout` (0: a minute), renewing the token. TimeoutError naming
  // what was still in flight (this worker has left anyway).
  void leave(std::chrono::milliseconds timeout) SB_EXCLUDES(mu_);

  // A member's side of a join hello on `connection` (`joiner`: its
  // announcement, decoded): admits the joiner or refuses it, answers with a
  // welcome, and reports the join. False when refused (the connection
  // closes once the welcome went out).
  bool on_join_hello(const std::shared_ptr<Connection>& connection, const Hello& hello,
                     const WorkerAnnouncement& joiner) SB_EXCLUDES(mu_);
  // The joiner's side: a member's welcome (accepted or refused).
  void on_welcome(const Hello& hello) SB_EXCLUDES(mu_);
  // The connection to `peer` failed (it counts as answered while joining).
  void on_peer_lost(int peer) SB_EXCLUDES(mu_);

  // Reports that `worker` joined or left to the listener, on the pool.
  void publish(rpc::MembershipChange::Kind kind, const rpc::WorkerInfo& worker)
      SB_EXCLUDES(mu_);
  void set_listener(rpc::MembershipListener listener) SB_EXCLUDES(mu_);

 private:
  // What the membership steps may wait.
  std::chrono::milliseconds step_timeout() const;

  const std::shared_ptr<Store> store_;
  const std::string name_;
  const int rank_;
  const int capacity_;
  const PipeAgentOptions& options_;
  PeerTable& peers_;
  PipeTransport& transport_;
  rpc::CallTable& calls_;
  const std::shared_ptr<rpc::ThreadPool> pool_;

  Mutex mu_;
  CondVar answered_;  // a welcome came, or a member was lost
  // The members' answers to this worker's join (rank → "" when accepted,
  // the reason when refused), and the members lost meanwhile.
  std::map<int, std::string> welcomes_ SB_GUARDED_BY(mu_);
  std::set<int> lost_ SB_GUARDED_BY(mu_);
  rpc::MembershipListener listener_ SB_GUARDED_BY(mu_);
};

}  // namespace switchboard::agents
