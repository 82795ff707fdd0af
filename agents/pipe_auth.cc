#include "agents/pipe_auth.h"

#include <fmt/format.h>

#include <algorithm>

namespace switchboard::agents {

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

std::vector<uint8_t> PipeAuth::claim(Connection& connection, Hello hello) const {
  if (enabled()) {
    connection.auth_nonce = random_nonce();
    hello.nonce.assign(connection.auth_nonce.begin(), connection.auth_nonce.end());
  }
  return encode_hello(hello);
}

Hello PipeAuth::challenge(Connection& connection, const Hello& claim,
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
  if (!to_nonce(claim.nonce, &connection.auth_peer_nonce)) {
    answer.accepted = false;
    answer.reason = fmt::format(
        "worker \"{}\" requires the job secret, and \"{}\" did not offer to prove it (it has "
        "no SWITCHBOARD_SECRET_FILE)",
        self_name_, claim.name);
    return answer;
  }
  connection.auth_nonce = random_nonce();
  connection.auth_peer_name = claim.name;
  connection.auth_claim = frame;
  const Mac proof =
      mac(kAcceptLabel, connection.auth_peer_nonce, connection.auth_nonce, claim.name,
          self_name_);
  answer.nonce.assign(connection.auth_nonce.begin(), connection.auth_nonce.end());
  answer.proof.assign(proof.begin(), proof.end());
  return answer;
}

std::string PipeAuth::check_challenge(Connection& connection, const Hello& challenge,
                                      const std::string& expected_name, Hello* proof) const {
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
  Nonce theirs{};
  if (!to_nonce(challenge.nonce, &theirs) ||
      !same_mac(challenge.proof,
                mac(kAcceptLabel, connection.auth_nonce, theirs, self_name_, expected_name))) {
    return fmt::format(
        "worker \"{}\"'s proof does not match this worker's job secret (it has another "
        "secret); not talking to it",
        expected_name);
  }
  connection.auth_peer_nonce = theirs;
  const Mac mine = mac(kConnectLabel, connection.auth_nonce, theirs, self_name_, expected_name);
  proof->kind = Hello::Kind::kProof;
  proof->rank = self_rank_;
  proof->name = self_name_;
  proof->proof.assign(mine.begin(), mine.end());
  return std::string();
}

bool PipeAuth::check_proof(const Connection& connection, const Hello& proof) const {
  if (!enabled() || !connection.auth_claim) return false;
  return proof.name == connection.auth_peer_name &&
         same_mac(proof.proof, mac(kConnectLabel, connection.auth_peer_nonce,
                                   connection.auth_nonce, connection.auth_peer_name,
                                   self_name_));
}

}  // namespace switchboard::agents
