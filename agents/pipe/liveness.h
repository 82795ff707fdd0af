// Liveness: whether PIPE's peers are still there, and bringing a static
// group's lost links back. Internal to //agents/pipe.
//
// - Heartbeats. tick() runs on a transport timer every heartbeat interval:
//   it sends a heartbeat on every connection whose peer is up, and fails
//   any connection silent for longer than the heartbeat timeout. A
//   connection that never said hello gets no heartbeats, only that limit,
//   and must have its hello through (the peer identified, and
//   authenticated with a secret) by the hello deadline, however slowly it
//   keeps sending.
// - A late tick. A tick far later than its interval means this process did
//   not run (SIGSTOP, a suspended VM, starvation): the peers' silence
//   meanwhile is not theirs, and what they sent is still unread, so
//   silence counts from that tick.
// - Static reconnects. A static group's lost connection to a lower rank is
//   made again by this worker (the higher rank of the pair, as at the
//   rendezvous): lost() schedules it for the next tick, and a failed try
//   is repeated every heartbeat timeout (every hello deadline without
//   one), on the pool. So no member of a static group is lost for good,
//   and every member applies the same rule. Dynamic groups never
//   reconnect: their membership decides.
//
// Thread safety: tick() runs on one timer at a time; lost() and reconnect()
// may run on any thread (one lock over the reconnect schedule).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "agents/pipe/peer_table.h"
#include "agents/pipe/transport/connection.h"
#include "common/mutex.h"

namespace switchboard::agents::pipe {

class Liveness {
 public:
  struct Options {
    std::string agent_name;                          // for logs
    std::chrono::milliseconds heartbeat_timeout{0};  // 0: no silence check
    std::chrono::milliseconds hello_deadline{0};     // 0: none
    bool reconnects = false;  // a static group's lower ranks are connected again
  };
  // What Liveness asks of its agent.
  struct Hooks {
    // Fails `connection` for `reason` (ConnectionEvents::connection_failed).
    std::function<void(const std::shared_ptr<transport::Connection>&, const std::string&)>
        fail;
    // Runs reconnect(peer) on the agent's pool; throws when the pool is
    // shutting down.
    std::function<void(int peer)> post_reconnect;
    // Connects to `peer` again, within `limit`; throws why it could not.
    std::function<void(int peer, std::chrono::milliseconds limit)> connect_again;
  };

  Liveness(Options options, PeerTable& peers, Hooks hooks);

  // One heartbeat tick; false once the peer table is stopping (the timer
  // then stops).
  bool tick();
  // `peer` (a lower rank of a static group, up until now) lost its
  // connection for a reason other than leaving: connect again at the next
  // tick. Nothing when the group does not reconnect or `peer` is higher.
  void lost(int peer, int self_rank) SB_EXCLUDES(mu_);
  // Connects to `peer` again (posted by tick() through the hooks), and
  // reschedules it when that fails.
  void reconnect(int peer) SB_EXCLUDES(mu_);

 private:
  void schedule_reconnects(int64_t now) SB_EXCLUDES(mu_);

  const Options options_;
  PeerTable& peers_;
  const Hooks hooks_;
  // The last tick, and when silence counts from (a late tick restarts the
  // count); the timer's own.
  std::atomic<int64_t> last_tick_ns_{0};
  int64_t silence_from_ns_ = 0;
  // Lower ranks to connect to again and when (now_ns()), those being
  // connected now, and those whose failure was logged.
  Mutex mu_;
  std::map<int, int64_t> reconnect_at_ SB_GUARDED_BY(mu_);
  std::set<int> reconnecting_ SB_GUARDED_BY(mu_);
  std::set<int> reconnect_logged_ SB_GUARDED_BY(mu_);
};

}  // namespace switchboard::agents::pipe
