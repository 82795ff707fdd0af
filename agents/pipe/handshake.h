// PipeAuth: PIPE's hello authenticated with the job secret (common/auth.h;
// docs/security.md). Internal to //agents/pipe.
//
// With a secret, a connection is authenticated in the hello before any
// other frame is read from it:
//   connector -> acceptor  its claim (kStatic or kJoin) with a fresh nonce Na
//   acceptor -> connector  kChallenge: a fresh nonce Nb and its proof,
//                          HMAC(secret, "switchboard pipe accept" | Na | Nb |
//                          connector name | 0 | acceptor name)
//   connector -> acceptor  kProof, once it checked that proof:
//                          HMAC(secret, "switchboard pipe connect" | Na | Nb |
//                          connector name | 0 | acceptor name)
// The acceptor acts on the claim (identifies the peer, admits the joiner)
// only once the proof is right; the connector counts the peer up only once
// the challenge is right. Both proofs bind both nonces and both names, so a
// hello recorded on one connection proves nothing on another. A worker
// with a secret refuses a claim without a nonce (kChallenge, refused, with
// the reason), and one without a secret refuses a claim with a nonce.
//
// The state of each handshake under way (the nonces, the name the peer
// claimed and its claim, held until its proof) is the handshake's: kept
// here per connection (by Connection::serial) from the claim until the
// handshake ends or forget(), not on the connection, which only carries
// frames and says whether its peer is trusted.
//
// Thread safety: any thread (one lock over the handshakes under way); a
// connection's handshake is used on its strand.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "agents/pipe/announcement.h"
#include "agents/pipe/transport/connection.h"
#include "common/auth.h"
#include "common/mutex.h"

namespace switchboard::agents::pipe {

class PipeAuth {
 public:
  // `secret` null: no authentication (claims carry no nonce).
  PipeAuth(std::shared_ptr<const Secret> secret, std::string self_name, int self_rank);

  bool enabled() const { return secret_ != nullptr; }

  // Connecting side: the claim's bytes, with a fresh nonce kept on
  // `connection` when enabled.
  std::vector<uint8_t> claim(transport::Connection& connection, Hello hello) const;

  // Accepting side, a claim that arrived on `connection` as `frame`: the
  // challenge to send, the claim kept on the connection until its proof;
  // or (accepted false) the refusal, when the claim does not match this
  // worker's use of a secret.
  Hello challenge(transport::Connection& connection, const Hello& claim,
                  const rpc::Message& frame) const;

  // Connecting side: "" when `challenge` proves the secret as the worker
  // `expected_name` (then *proof is what to send), else why not.
  std::string check_challenge(transport::Connection& connection, const Hello& challenge,
                              const std::string& expected_name, Hello* proof) const;

  // Accepting side: whether `proof` proves the claim kept for
  // `connection`; when it does, the handshake ends and the claim is
  // returned (its frame), else nullopt.
  std::optional<rpc::Message> check_proof(const transport::Connection& connection,
                                          const Hello& proof) const;
  // Accepting side: whether a claim arrived on `connection` and waits for
  // its proof, and the name it claimed ("" when none).
  bool has_claim(const transport::Connection& connection) const;
  std::string claimed_name(const transport::Connection& connection) const;
  // The connection is gone: its handshake with it.
  void forget(const transport::Connection& connection) const;

 private:
  struct Handshake {
    Nonce nonce{};       // this side's
    Nonce peer_nonce{};  // the other side's
    std::string peer_name;                // accepting side: the name claimed
    std::optional<rpc::Message> claim;    // accepting side: held until its proof
  };

  Mac mac(std::string_view label, const Nonce& connector_nonce, const Nonce& acceptor_nonce,
          const std::string& connector, const std::string& acceptor) const;

  const std::shared_ptr<const Secret> secret_;
  const std::string self_name_;
  const int self_rank_;
  mutable Mutex mu_;
  mutable std::unordered_map<uint64_t, Handshake> handshakes_ SB_GUARDED_BY(mu_);
};

}  // namespace switchboard::agents::pipe
