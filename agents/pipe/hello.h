// HelloHandler: the hello state machine of one PIPE worker, for every
// frame of kind kHello on every connection. Internal to //agents/pipe.
//
// The frames, by their Hello::Kind:
//   kStatic, kJoin  a claim: the connecting side names itself (and, for a
//                   join, announces itself). With a job secret (or a claim
//                   that carries a nonce) it is challenged first and waits
//                   for its proof (PipeAuth, handshake.h); then a static
//                   claim makes the connection the peer's (StaticRendezvous,
//                   static_group.h) and a join goes to the Membership
//                   (membership.h), which welcomes or refuses it.
//   kChallenge      the connecting side checks the acceptor's proof and
//                   answers with its own; the peer is then trusted.
//   kProof          the accepting side checks it and acts on the claim.
//   kWelcome        a dynamic group's answer to a join.
// A hello that arrives before the static peer table is filled is deferred
// and replayed (PeerTable::defer_hello). Anything out of order (a second
// claim, a proof without a claim, an unexpected challenge or welcome) is a
// protocol error, and a hello that does not decode one too: the connection
// fails with the reason, through the `fail` hook.
//
// Thread safety: on_hello() runs on the connection's strand; the handler
// keeps no state of its own (the handshakes under way are PipeAuth's, the
// peers the PeerTable's).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "agents/pipe/announcement.h"
#include "agents/pipe/handshake.h"
#include "agents/pipe/membership.h"
#include "agents/pipe/peer_table.h"
#include "agents/pipe/static_group.h"
#include "agents/pipe/transport/connection.h"
#include "core/message.h"

namespace switchboard::agents::pipe {

class HelloHandler {
 public:
  // Fails a connection for a reason (ConnectionEvents::connection_failed).
  using Fail = std::function<void(const std::shared_ptr<transport::Connection>&,
                                  const std::string&)>;

  // A static group's handler has `static_group` and no `membership`; a
  // dynamic group's the other way round. Each must outlive the handler.
  // `capacity`: the static world size (named in refusals).
  HelloHandler(std::string name, int capacity, const PipeAuth& auth, PeerTable& peers,
               StaticRendezvous* static_group, Membership* membership, Fail fail);

  // A kHello frame on `connection`: false when the connection is not to be
  // read on (failed, refused, or the hello deferred until the peer table
  // is filled).
  bool on_hello(const std::shared_ptr<transport::Connection>& connection,
                const rpc::Message& frame);

 private:
  bool dynamic() const { return membership_ != nullptr; }
  // The connecting side's check of a challenge, and the accepting side's
  // check of a proof.
  bool on_challenge(const std::shared_ptr<transport::Connection>& connection,
                    const Hello& hello);
  bool on_proof(const std::shared_ptr<transport::Connection>& connection,
                const Hello& hello);
  // A claim, once authenticated (or without a secret): identifies the
  // connection (static) or admits the joiner (dynamic).
  bool accept_claim(const std::shared_ptr<transport::Connection>& connection,
                    const Hello& hello);

  const std::string name_;
  const int capacity_;
  const PipeAuth& auth_;
  PeerTable& peers_;
  StaticRendezvous* const static_group_;
  Membership* const membership_;
  const Fail fail_;
};

}  // namespace switchboard::agents::pipe
