// PipeAgent's state: the owner that wires the PIPE agent's objects
// together. Each object has its own header, state and lock:
//   PeerTable        (peer_table.h)          who the peers are, their
//                                            connections and states
//   PipeTransport    (transport/transport.h) listener, connect, I/O threads,
//                                            timers (TCP: transport/tcp/)
//   StaticRendezvous (static_group.h)        a static group's setup and
//                                            barrier
//   Membership       (membership.h)          a dynamic group's joins and
//                                            leaves
//   rpc::CallTable   (rpc/call_table.h)      calls made and requests served
//   HelloHandler     (hello.h)               the hello state machine, over
//                                            PipeAuth (handshake.h)
//   Liveness         (liveness.h)            heartbeats, silence, a static
//                                            group's reconnects
// The Impl itself routes what connections report (frames, failures) to
// them, and sends calls and replies. Internal to
// //agents/pipe:agent; see agents/pipe/agent.h for the behaviour.
//
// Thread safety: the Impl has no lock of its own; its fields are set in
// the constructor (and by start_up(), before any other thread sees them),
// and each object it owns guards its own state.
// Lifetime: shared by the PipeAgent and by work in flight on the pool;
// the destructor drops the peer table's connections, then stops the
// transport (joining the I/O threads, destroying its I/O context) before
// any object the connections report to goes away.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agents/pipe/agent.h"
#include "agents/pipe/announcement.h"
#include "agents/pipe/channel/registry.h"
#include "agents/pipe/handshake.h"
#include "agents/pipe/hello.h"
#include "agents/pipe/liveness.h"
#include "agents/pipe/membership.h"
#include "agents/pipe/peer_table.h"
#include "agents/pipe/static_group.h"
#include "agents/pipe/transport/connection.h"
#include "agents/pipe/transport/transport.h"
#include "common/mutex.h"
#include "core/host_buffer_cache.h"
#include "rpc/call_table.h"

namespace switchboard::agents::pipe {

// This worker's channels (the built-in registry's that its options leave
// on; tensors.cc).
channel::Channels make_channels(const std::string& name, const PipeAgentOptions& options,
                                int device_count,
                                std::shared_ptr<HostBufferCache> buffers);
// A self-send's message with its own copies of the tensors, each on
// devices[i] (the device map's target) or, when `devices` is empty, on the
// CPU (tensors.cc).
rpc::Message copy_tensors(rpc::Message m, const std::vector<Device>& devices);

struct PipeAgent::Impl final : transport::ConnectionEvents,
                               std::enable_shared_from_this<PipeAgent::Impl> {
  Impl(PipeAgent& owner, std::shared_ptr<Store> store, std::string name, int rank,
       std::optional<int> world_size, const PipeAgentOptions& options);
  ~Impl() override;

  // Listens, then rendezvouses (static) or joins (dynamic), then starts the
  // heartbeat. Throws what those throw.
  void start_up();

  // ConnectionEvents (on the connection's strand).
  bool on_frame(const std::shared_ptr<transport::Connection>& connection,
                wire::InboundFrame frame) override;
  void connection_failed(const std::shared_ptr<transport::Connection>& connection,
                         const std::string& reason) override;
  // A dynamic group's member that is out of the group (the Membership's
  // DropPeer): down for `why`, its connection closed, reported as left,
  // its calls failed.
  void drop_peer(int peer, const std::string& why);
  // Fails the calls in flight to `peer` with ConnectionError naming it and
  // `why`.
  void fail_calls_to(int peer, const std::string& why);
  // A connection accepted by the transport (I/O thread).
  void on_accept(std::shared_ptr<transport::Connection> connection);
  // Calls and replies.
  // `connection`: the one the request came by (null for a self-send).
  void accept_request(int from, wire::InboundFrame request,
                      std::shared_ptr<transport::Connection> connection = nullptr);
  void deliver_reply(int to, rpc::Message reply);
  void complete(wire::InboundFrame response,
                std::shared_ptr<transport::Connection> connection);
  void complete_now(rpc::Message response);
  // The tensors of a received frame that a channel carries, until they are
  // received: those still here when it goes (the request was refused or
  // cancelled before it ran, the response came after its call ended, the
  // pool was gone) are released (channel::Channel::release), giving back
  // what they hold at the sender.
  struct Unfetched {
    Unfetched(std::weak_ptr<Impl> impl, std::shared_ptr<transport::Connection> connection,
              std::vector<wire::InboundFrame::ChannelTensor> tensors)
        : impl(std::move(impl)),
          connection(std::move(connection)),
          tensors(std::move(tensors)) {}
    // One owner: a copy would give the outboxes back twice.
    Unfetched(const Unfetched&) = delete;
    Unfetched& operator=(const Unfetched&) = delete;
    ~Unfetched();
    std::weak_ptr<Impl> impl;
    std::shared_ptr<transport::Connection> connection;
    std::vector<wire::InboundFrame::ChannelTensor> tensors;
  };
  // Receives each tensor of `m` that a channel carries (`unfetched`, which
  // is empty afterwards) or that is bound for a device other than the CPU,
  // from its channel, on the device `devices` names; on the pool. Throws
  // std::invalid_argument naming the sender, the tensor and the device when
  // this worker cannot hold it there, or what the channel throws; every
  // routed tensor is received or released all the same.
  void receive_tensors(rpc::Message& m, const std::vector<Device>& devices,
                       Unfetched& unfetched, int from) const;
  // Sends each tensor of `m` to `to` (over `connection`) by its channel
  // (channel::Channels::send). The routes (empty: every tensor's bytes in
  // the frame, none from a ChunkedSource). Throws std::invalid_argument
  // naming `to` and the tensor for one that cannot travel.
  std::vector<wire::TensorRoute> route_tensors(rpc::Message& m,
                                               const std::vector<Device>& wire, int to,
                                               transport::Connection& connection)
      SB_EXCLUDES(choices_mu);
  // Logs the channel that took a tensor of `nbytes` from `src` to `dst` of
  // `to`, and why, the first time one takes that way.
  void log_choice(int to, Device src, Device dst, size_t nbytes,
                  const channel::Channel& chosen) SB_EXCLUDES(choices_mu);
  // The device each tensor of `m` to `to` lands on (empty: all CPU).
  std::vector<Device> wire_devices(const rpc::Message& m, int to, bool reply) const;

  // Counts a call or reply frame `m` to / from a peer into its
  // rpc::PeerMetrics (PeerTable::PeerInfo::metrics; lock-free).
  void count_sent(int to, const rpc::Message& m) const;
  void count_received(int from, const rpc::Message& m) const;

  // How long an accepted connection has to get its hello through (the peer
  // identified, and authenticated with a secret): the longer of the
  // heartbeat timeout and the RPC timeout (a hello may wait for the static
  // rendezvous to fill the peer table), 60 s when both are off.
  std::chrono::milliseconds hello_deadline() const {
    const auto longest = std::max(options.heartbeat_timeout, options.rpc_timeout);
    return longest.count() > 0 ? longest : std::chrono::milliseconds(60'000);
  }
  // Reports a join or leave (dynamic groups; nothing for static ones).
  void publish_change(rpc::MembershipChange::Kind kind, const rpc::WorkerInfo& worker);

  PipeAgent& owner;
  const std::shared_ptr<Store> store;
  const std::string name;
  const int rank;
  const bool dynamic;
  // Static: the world size. Dynamic: the ranks a worker may take, [0, capacity).
  const int capacity;
  const PipeAgentOptions options;
  // CUDA devices the maps were validated against (the option, or what the
  // registered CUDA runtime sees).
  const int device_count;
  // Large received tensors come from here.
  const std::shared_ptr<HostBufferCache> buffers = HostBufferCache::create();
  // How tensors travel (what they can do is in the announcement).
  const channel::Channels channels;
  Mutex choices_mu;
  std::set<std::string> logged_choices SB_GUARDED_BY(choices_mu);

  // Proofs of the job secret in the hello (none without a secret).
  const PipeAuth auth;
  PeerTable peers;
  std::unique_ptr<transport::PipeTransport> transport;
  bool tls = false;  // whether the transport's connections are inside TLS
  std::unique_ptr<StaticRendezvous> rendezvous;  // static groups
  std::unique_ptr<Membership> membership;        // dynamic groups
  std::atomic<bool> shut_down{false};
  // join()s made so far (static groups): each meets the others under keys
  // of its own.
  std::atomic<uint64_t> join_generation{0};
  // Hellos, challenges, proofs and welcomes.
  std::unique_ptr<HelloHandler> hello;
  // Heartbeats, silence and hello deadlines, a static group's reconnects.
  std::unique_ptr<Liveness> liveness;
  // Calls made and requests served: ids, deadlines, handlers, draining.
  // Declared last: destroyed first, before the state its callbacks use.
  rpc::CallTable calls;
};

}  // namespace switchboard::agents::pipe
