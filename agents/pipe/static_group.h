// StaticRendezvous: how the workers of a static PIPE group (world_size
// given) find each other (agents/pipe/agent.h, "Construction of a static
// group"): the exchange of every worker's announcement through the group's
// round of the store, the name and device-map checks, connecting the mesh (rank i
// connects to every rank below it) and waiting until every peer is
// connected; then the hellos of the higher ranks, also those that
// reconnect after a connection was lost (the higher rank of a pair makes
// it again: reconnect()). (join() waits for the group to be quiet over the
// store: rendezvous/quiet_group.h.) Internal to //agents/pipe.
//
// Thread safety: run() once, on the constructing thread; check_hello() on
// any thread (it reads what run() published in the peer table).
// Ownership: shares everything (the store, peer table and transport are
// the agent's and outlive this).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "agents/pipe/announcement.h"
#include "agents/pipe/handshake.h"
#include "agents/pipe/options.h"
#include "agents/pipe/peer_table.h"
#include "agents/pipe/transport/transport.h"

namespace switchboard {
class Store;
}

namespace switchboard::agents::pipe {

class StaticRendezvous {
 public:
  // This worker is `name`, rank `rank` of `world_size`.
  StaticRendezvous(std::string name, int rank, int world_size,
                   const PipeAgentOptions& options, PeerTable& peers,
                   transport::PipeTransport& transport, const PipeAuth& auth);
  ~StaticRendezvous();
  StaticRendezvous(const StaticRendezvous&) = delete;
  StaticRendezvous& operator=(const StaticRendezvous&) = delete;

  // All-gathers `mine` over a Gloo group on `store`, validates the names
  // and device maps, fills the peer table, connects to the lower ranks and
  // waits for every peer. Throws std::invalid_argument (a duplicate name,
  // bad device maps), ConnectionError (a peer that cannot be reached) or
  // TimeoutError naming the workers missing after options.rpc_timeout.
  void run(Store& store, const WorkerAnnouncement& mine);

  // A static hello on `connection` from a higher rank: makes the
  // connection that peer's and returns "", or returns what is wrong with
  // it (the protocol error to close the connection with).
  std::string accept_hello(const Hello& hello,
                           const std::shared_ptr<transport::Connection>& connection);

  // Connects again to `peer` (a lower rank, whose connection was lost), as
  // run() did: the hello, and the proof of the secret within `timeout`.
  // Throws what PeerTable::connect throws. After run(), on any thread.
  void reconnect(int peer, std::chrono::milliseconds timeout);

 private:
  const std::string name_;
  const int rank_;
  const int world_size_;
  const PipeAgentOptions& options_;
  PeerTable& peers_;
  transport::PipeTransport& transport_;
  const PipeAuth& auth_;
  Hello hello_;  // this worker's static hello, set by run()
};

}  // namespace switchboard::agents::pipe
