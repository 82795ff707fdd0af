// PeerTable: the PIPE agent's peers, by rank (static group: every worker;
// dynamic group: the ranks [0, capacity) a worker may take): who each is,
// the state of its connection, why it is down, the connections that have
// not said hello yet, hellos that came before the table was filled, and
// the device routes (reverse maps, this worker's devices) that follow from
// the members' announcements. Internal to //agents/pipe.
//
// States: kAbsent (a dynamic group's rank no worker holds) → kConnecting →
// kUp → kLost (its connection failed) or kLeft (it said goodbye). A peer's
// WorkerInfo and announcement are written once, under the lock, before the
// peer is first published (state beyond kAbsent), and never change after
// (ranks are never reused); info() reads them without the lock.
//
// Metrics: with an rpc::AgentMetrics, each peer other than this worker gets
// its rpc::PeerMetrics when it is published (in PeerInfo, write-once like
// the rest), and the table keeps their state: kConnected when the peer's
// connection is made or identified (or a joiner admitted), kClosed when it
// says goodbye or at stop(), kFailed when its connection is lost (or it
// could not be reached while joining). The agent counts bytes into them.
//
// Thread safety: every member function is thread-safe; each takes mu_ once
// and calls nothing outside the table while holding it, except
// connect()'s transport call, which runs without it, and
// AgentMetrics::peer() (a leaf lock) when a peer is published.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "agents/pipe/announcement.h"
#include "agents/pipe/handshake.h"
#include "agents/pipe/transport/connection.h"
#include "agents/pipe/transport/transport.h"
#include "common/mutex.h"
#include "core/message.h"
#include "rpc/agent.h"
#include "rpc/device_map.h"
#include "rpc/metrics.h"

namespace switchboard::agents::pipe {

class PeerTable {
 public:
  enum class State { kAbsent, kConnecting, kUp, kLost, kLeft };

  // Who a peer is (write-once; see above).
  struct PeerInfo {
    rpc::WorkerInfo info;
    WorkerAnnouncement announcement;
    // Null for this worker, and without AgentMetrics.
    std::shared_ptr<rpc::PeerMetrics> metrics;
  };

  // Where this worker's tensors go: responses along the inverse of each
  // caller's map, and the devices this worker uses.
  struct DeviceRoutes {
    rpc::DeviceMaps reverse_maps;
    std::vector<Device> devices;
  };

  // A hello deferred by defer_hello(), to replay once the table is filled.
  using EarlyHello = std::pair<std::shared_ptr<transport::Connection>, rpc::Message>;

  // What lose() found: whether `connection` was the peer's current one,
  // whether the peer was up, whether the loss is expected (stopping, or
  // the peer left) and the peer's reason for being down.
  struct Loss {
    bool current = false;
    bool was_up = false;
    bool quiet = false;
    std::string why;
  };

  // A call's way to a peer: its connection (null for this worker itself)
  // when up, else why not.
  struct Route {
    bool up = false;
    std::shared_ptr<transport::Connection> connection;
    std::string reason;
  };

  // `self_name` names this worker in errors; `capacity` ranks, each kAbsent
  // (dynamic) or kConnecting (static). `metrics` (may be null: none
  // counted) hands out each peer's counters.
  PeerTable(std::string self_name, int capacity, bool dynamic,
            std::shared_ptr<rpc::AgentMetrics> metrics = nullptr);
  PeerTable(const PeerTable&) = delete;
  PeerTable& operator=(const PeerTable&) = delete;

  // -------------------------------------------------------------- filling

  // Static groups: every rank's announcement (by rank); `self` is up. Marks
  // the table ready and replays the hellos deferred until now (each on its
  // connection's strand, which then reads on).
  void fill_static(const std::vector<WorkerAnnouncement>& all, int self, DeviceRoutes routes)
      SB_EXCLUDES(mu_);
  // Dynamic groups, when joining: the members (kConnecting) and this worker
  // (up). Marks the table ready and replays the deferred hellos.
  void fill_members(const std::vector<Member>& members, int self,
                    const WorkerAnnouncement& mine, DeviceRoutes routes) SB_EXCLUDES(mu_);
  // Keeps a hello that came before the table was ready (a faster peer
  // finished the all-gather first) and returns true; false once ready.
  bool defer_hello(const std::shared_ptr<transport::Connection>& connection,
                   const rpc::Message& frame) SB_EXCLUDES(mu_);

  // -------------------------------------------------------------- connections

  // An accepted connection that has not said hello; false (the caller
  // drops it) once stop() ran.
  bool add_unidentified(const std::shared_ptr<transport::Connection>& connection)
      SB_EXCLUDES(mu_);
  // Connects to `peer` through `transport`, sends `hello` (a claim:
  // kStatic or kJoin) sealed by `auth` and makes the connection the peer's,
  // reading. Without a secret the peer is up at once; with one, it is up
  // once the agent found its challenge right (authenticated()). Waits
  // `timeout` at most for both. Throws ConnectionError naming this worker,
  // the peer and its address, or AuthenticationError (the peer refused,
  // or did not prove the secret: refused()).
  void connect(int peer, transport::PipeTransport& transport, const PipeAuth& auth,
               const Hello& hello, std::chrono::milliseconds timeout) SB_EXCLUDES(mu_);
  // The connecting side's authentication of `peer` over `connection`
  // succeeded: the peer is up.
  void authenticated(int peer, const std::shared_ptr<transport::Connection>& connection)
      SB_EXCLUDES(mu_);
  // ... or failed (`why`): the peer is lost, and connect() throws
  // AuthenticationError with `why`.
  void refused(int peer, const std::shared_ptr<transport::Connection>& connection,
               const std::string& why) SB_EXCLUDES(mu_);
  // Makes `connection` (which said hello as `peer`) the peer's, up; false,
  // changing nothing, when the peer has a connection already.
  bool identify(int peer, const std::shared_ptr<transport::Connection>& connection)
      SB_EXCLUDES(mu_);
  // A dynamic group's member side: admits the worker that said hello as
  // `hello_name`, rank `r`, over `connection`, when the table is open to
  // newcomers, the rank free, the announcement names the same worker, its
  // name is unused among the members up, and `routes_with(members up +
  // joiner)` accepts its device maps (it throws otherwise; it runs under
  // the table's lock and must not call into the table). Returns "" when
  // admitted (the peer is up), else the refusal. Either way `connection`
  // is no longer unidentified.
  using RouteRule =
      std::function<DeviceRoutes(const std::vector<rpc::WorkerDevices>& members)>;
  std::string admit(int r, const std::string& hello_name,
                    const WorkerAnnouncement& joiner,
                    const std::shared_ptr<transport::Connection>& connection,
                    const RouteRule& routes_with) SB_EXCLUDES(mu_);
  // The peer whose connection was `connection` lost it (`reason`): marks
  // it kLost (unless it left) and forgets an unidentified connection.
  Loss lose(const std::shared_ptr<transport::Connection>& connection,
            const std::string& reason) SB_EXCLUDES(mu_);
  // A peer that was up said goodbye: marks it kLeft; returns whether it
  // was up.
  bool mark_left(int peer) SB_EXCLUDES(mu_);
  // A member that could not be reached while joining: kLost with `reason`.
  void mark_lost(int peer, const std::string& reason) SB_EXCLUDES(mu_);
  // A dynamic group's member that is out of the group by the store's
  // member list (evicted, or this worker was): kLost with `why` as its
  // reason, unless it is this worker, absent, or said goodbye. What it
  // was, and its connection, which the caller closes.
  struct Dropped {
    bool changed = false;
    bool was_up = false;
    std::shared_ptr<transport::Connection> connection;
  };
  Dropped drop(int peer, const std::string& why) SB_EXCLUDES(mu_);

  // Refuses newcomers from now on (admit()) and returns the connections of
  // the peers up (to say goodbye to).
  std::vector<std::shared_ptr<transport::Connection>> close_to_newcomers()
      SB_EXCLUDES(mu_);
  // Marks the table stopping (losses are quiet, accepts refused, waits
  // woken) and returns every connection, identified or not.
  std::vector<std::shared_ptr<transport::Connection>> stop() SB_EXCLUDES(mu_);
  // Forgets every connection it holds (the peers', the unidentified ones,
  // those of deferred hellos) and returns them. The owner drops them before
  // the transport that made them: each holds objects of that transport's
  // I/O context (a socket, a strand), which must not outlive it.
  std::vector<std::shared_ptr<transport::Connection>> release_connections()
      SB_EXCLUDES(mu_);

  // For the heartbeat: the connections of the peers up and the
  // unidentified ones; nullopt once stopping.
  struct Watched {
    std::vector<std::shared_ptr<transport::Connection>> up;
    std::vector<std::shared_ptr<transport::Connection>> unidentified;
  };
  std::optional<Watched> watched() const SB_EXCLUDES(mu_);

  // Blocks until every peer is up, or `timeout` (0: none) passed; returns
  // the names of the peers still not up (empty: all up).
  std::vector<std::string> wait_all_up(std::chrono::milliseconds timeout) SB_EXCLUDES(mu_);

  // -------------------------------------------------------------- lookup

  // The peer's route for a call or a reply.
  Route route(int peer) const SB_EXCLUDES(mu_);
  // The peer's connection (null when none); replies go there.
  std::shared_ptr<transport::Connection> connection(int peer) const SB_EXCLUDES(mu_);
  bool is_up(int peer) const SB_EXCLUDES(mu_);
  // Why the peer is down ("" while up).
  std::string reason(int peer) const SB_EXCLUDES(mu_);
  // How a peer is gone, when it is: "shut down" (it said goodbye) or "was
  // lost (<reason>)"; nullopt while it is up, connecting or absent.
  std::optional<std::string> gone(int peer) const SB_EXCLUDES(mu_);
  // Who the peer is (published peers only; see above).
  const PeerInfo& info(int peer) const { return infos_[peer]; }
  const std::string& name_of(int peer) const { return infos_[peer].info.name; }
  int capacity() const { return static_cast<int>(infos_.size()); }

  // The worker named `name`: the one up, else the latest. NotFoundError
  // naming it (`dynamic` words the error for a dynamic group).
  rpc::WorkerInfo find(const std::string& name) const SB_EXCLUDES(mu_);
  // NotFoundError for an id out of range or not taken.
  rpc::WorkerInfo find(int id) const SB_EXCLUDES(mu_);
  // Static: every worker. Dynamic: the members up now.
  std::vector<rpc::WorkerInfo> workers() const SB_EXCLUDES(mu_);
  // The ranks other than this worker that are up.
  std::vector<int> peers_up() const SB_EXCLUDES(mu_);
  // The device routes now (a dynamic group's change as workers join).
  rpc::DeviceMaps reverse_maps() const SB_EXCLUDES(mu_);
  std::vector<Device> devices() const SB_EXCLUDES(mu_);

 private:
  struct Status {
    std::shared_ptr<transport::Connection> connection;
    State state = State::kConnecting;
    std::string reason;  // why it is down
    bool refused = false;  // down because authentication failed
  };

  // Who `rank` (`info`, `announcement`) is, with its counters unless it is
  // this worker (`self`).
  PeerInfo publish_locked(int rank, const std::string& name,
                          const WorkerAnnouncement& announcement, bool self)
      SB_REQUIRES(mu_);
  // Sets the state of `peer`'s counters, when it has them.
  void set_metrics_state(int peer, rpc::ConnectionState state) const SB_REQUIRES(mu_);

  // Marks the table ready; returns the deferred hellos.
  std::vector<EarlyHello> ready_locked() SB_REQUIRES(mu_);
  static void replay(std::vector<EarlyHello> early);

  const std::string self_name_;
  const bool dynamic_;
  const std::shared_ptr<rpc::AgentMetrics> metrics_;
  std::vector<PeerInfo> infos_;  // sized at construction; write-once entries

  mutable Mutex mu_;
  CondVar changed_;  // a peer came up, or stopping
  std::vector<Status> status_ SB_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<transport::Connection>> unidentified_ SB_GUARDED_BY(mu_);
  bool ready_ SB_GUARDED_BY(mu_) = false;
  int self_ SB_GUARDED_BY(mu_) = -1;  // this worker's rank, once filled
  std::vector<EarlyHello> early_hellos_ SB_GUARDED_BY(mu_);
  bool stopping_ SB_GUARDED_BY(mu_) = false;
  bool closed_to_newcomers_ SB_GUARDED_BY(mu_) = false;
  DeviceRoutes routes_ SB_GUARDED_BY(mu_);
};

}  // namespace switchboard::agents::pipe
