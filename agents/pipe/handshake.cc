#include "agents/pipe/handshake.h"

#include <fmt/format.h>

#include <algorithm>

namespace switchboard::agents::pipe {

namespace {

constexpr std::string_view kAcceptLabel = "switchboard pipe accept";
constexpr std::string_view kConnectLabel = "switchboard pipe connect";

bool to_nonce(const std::vector<uint8_t>& bytes, Nonce* out) {
  if (bytes.size() != out->size()) return false;
  std::copy(bytes.begin(), bytes.end(), out->begin());
  return true;
}

}  // namespace

PipeAuth::PipeAuth(std::shared_ptr<const Secret> secret, std::string self_name, int self_rank)
    : secret_(std::move(secret)), self_name_(std::move(self_name)), self_rank_(self_rank) {}

Mac PipeAuth::mac(std::string_view label, const Nonce& connector_nonce,
                  const Nonce& acceptor_nonce, const std::string& connector,
                  const std::string& acceptor) const {
  static constexpr uint8_t kSeparator[1] = {0};
  return secret_->mac({bytes_of(label), connector_nonce, acceptor_nonce, bytes_of(connector),
                       kSeparator, bytes_of(acceptor)});
}

std::vector<uint8_t> PipeAuth::claim(transport::Connection& connection,
                                     Hello hello) const {
  if (enabled()) {
    const Nonce nonce = random_nonce();
    {
      MutexLock lock(mu_);
      handshakes_[connection.serial] = Handshake{nonce, {}, {}, std::nullopt};
    }
    hello.nonce.assign(nonce.begin(), nonce.end());
  }
  return encode_hello(hello);
}

bool PipeAuth::has_claim(const transport::Connection& connection) const {
  MutexLock lock(mu_);
  auto it = handshakes_.find(connection.serial);
  return it != handshakes_.end() && it->second.claim.has_value();
}

std::string PipeAuth::claimed_name(const transport::Connection& connection) const {
  MutexLock lock(mu_);
  auto it = handshakes_.find(connection.serial);
  return it == handshakes_.end() ? std::string() : it->second.peer_name;
}

void PipeAuth::forget(const transport::Connection& connection) const {
  MutexLock lock(mu_);
  handshakes_.erase(connection.serial);
}

Hello PipeAuth::challenge(transport::Connection& connection, const Hello& claim,
                          const rpc::Message& frame) const {
  Hello answer;
  answer.kind = Hello::Kind::kChallenge;
  answer.rank = self_rank_;
  answer.name = self_name_;
  if (!enabled()) {
    answer.accepted = false;
    answer.reason = fmt::format(
        "worker \"{}\" has no job secret and does not authenticate (give every worker the "
        "same SWITCHBOARD_SECRET_FILE)",
        self_name_);
    return answer;
  }
  Handshake handshake;
  if (!to_nonce(claim.nonce, &handshake.peer_nonce)) {
    answer.accepted = false;
    answer.reason = fmt::format(
        "worker \"{}\" requires the job secret, and \"{}\" did not offer to prove it (it has "
        "no SWITCHBOARD_SECRET_FILE)",
        self_name_, claim.name);
    return answer;
  }
  handshake.nonce = random_nonce();
  handshake.peer_name = claim.name;
  handshake.claim = frame;
  const Mac proof =
      mac(kAcceptLabel, handshake.peer_nonce, handshake.nonce, claim.name, self_name_);
  answer.nonce.assign(handshake.nonce.begin(), handshake.nonce.end());
  answer.proof.assign(proof.begin(), proof.end());
  MutexLock lock(mu_);
  handshakes_[connection.serial] = std::move(handshake);
  return answer;
}

std::string PipeAuth::check_challenge(transport::Connection& connection,
                                      const Hello& challenge,
                                      const std::string& expected_name,
                                      Hello* proof) const {
  if (!challenge.accepted) {
    return fmt::format("worker \"{}\" refused the connection: {}", challenge.name,
                       challenge.reason);
  }
  if (!enabled()) {
    return fmt::format(
        "worker \"{}\" requires the job secret, and this worker \"{}\" has none (set "
        "SWITCHBOARD_SECRET_FILE)",
        challenge.name, self_name_);
  }
  if (challenge.name != expected_name) {
    return fmt::format("the worker that answered is \"{}\", not \"{}\"", challenge.name,
                       expected_name);
  }
  Nonce mine{};
  {
    MutexLock lock(mu_);
    auto it = handshakes_.find(connection.serial);
    if (it == handshakes_.end()) return "a challenge without a claim of this worker's";
    mine = it->second.nonce;
  }
  Nonce theirs{};
  if (!to_nonce(challenge.nonce, &theirs) ||
      !same_mac(challenge.proof,
                mac(kAcceptLabel, mine, theirs, self_name_, expected_name))) {
    return fmt::format(
        "worker \"{}\"'s proof does not match this worker's job secret (it has another "
        "secret); not talking to it",
        expected_name);
  }
  const Mac answer = mac(kConnectLabel, mine, theirs, self_name_, expected_name);
  proof->kind = Hello::Kind::kProof;
  proof->rank = self_rank_;
  proof->name = self_name_;
  proof->proof.assign(answer.begin(), answer.end());
  forget(connection);  // this side's handshake is over
  return std::string();
}

std::optional<rpc::Message> PipeAuth::check_proof(const transport::Connection& connection,
                                                  const Hello& proof) const {
  if (!enabled()) return std::nullopt;
  Handshake handshake;
  {
    MutexLock lock(mu_);
    auto it = handshakes_.find(connection.serial);
    if (it == handshakes_.end() || !it->second.claim) return std::nullopt;
    handshake = it->second;
  }
  if (proof.name != handshake.peer_name ||
      !same_mac(proof.proof, mac(kConnectLabel, handshake.peer_nonce, handshake.nonce,
                                 handshake.peer_name, self_name_))) {
    return std::nullopt;
  }
  forget(connection);  // the handshake is over
  return std::move(handshake.claim);
}

}  // namespace switchboard::agents::pipe
