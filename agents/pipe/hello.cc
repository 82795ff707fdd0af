#include "agents/pipe/hello.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <exception>
#include <optional>
#include <utility>
#include <vector>

#include "agents/pipe/wire/frame.h"

namespace switchboard::agents::pipe {

using rpc::Message;

HelloHandler::HelloHandler(std::string name, int capacity, const PipeAuth& auth,
                           PeerTable& peers, StaticRendezvous* static_group,
                           Membership* membership, Fail fail)
    : name_(std::move(name)),
      capacity_(capacity),
      auth_(auth),
      peers_(peers),
      static_group_(static_group),
      membership_(membership),
      fail_(std::move(fail)) {}

bool HelloHandler::on_hello(const std::shared_ptr<transport::Connection>& connection,
                            const Message& frame) {
  if (peers_.defer_hello(connection, frame)) return false;  // replayed once filled
  Hello hello;
  try {
    hello = decode_hello(frame.payload);
  } catch (const std::exception& e) {
    fail_(connection, fmt::format("protocol error: {}", e.what()));
    return false;
  }
  switch (hello.kind) {
    case Hello::Kind::kChallenge:
      return on_challenge(connection, hello);
    case Hello::Kind::kProof:
      return on_proof(connection, hello);
    case Hello::Kind::kWelcome:
      if (!dynamic() || connection->peer < 0 || hello.rank != connection->peer ||
          !connection->trusted) {
        fail_(connection, fmt::format("protocol error: an unexpected welcome "
                                      "from rank {}",
                                      hello.rank));
        return false;
      }
      membership_->on_welcome(hello);
      return true;
    case Hello::Kind::kStatic:
    case Hello::Kind::kJoin:
      break;
  }
  if (connection->peer >= 0 || auth_.has_claim(*connection)) {
    fail_(connection, "protocol error: a second hello");
    return false;
  }
  // A claim with a nonce asks to authenticate; so does this worker with a
  // secret. Either way the claim waits for its proof (or is refused).
  if (auth_.enabled() || !hello.nonce.empty()) {
    const Hello answer = auth_.challenge(*connection, hello, frame);
    const std::vector<uint8_t> bytes = encode_hello(answer);
    connection->enqueue_control(wire::FrameKind::kHello, bytes.data(), bytes.size());
    if (answer.accepted) return true;
    spdlog::warn("rpc agent \"{}\": refused the connection of \"{}\" (rank {}): {}",
                 name_, hello.name, hello.rank, answer.reason);
    connection->close_after_flush();
    return false;
  }
  return accept_claim(connection, hello);
}

bool HelloHandler::on_proof(const std::shared_ptr<transport::Connection>& connection,
                            const Hello& hello) {
  if (!auth_.has_claim(*connection) || connection->peer >= 0) {
    fail_(connection, "protocol error: a proof without a claim");
    return false;
  }
  const std::optional<Message> claimed = auth_.check_proof(*connection, hello);
  if (!claimed) {
    spdlog::warn(
        "rpc agent \"{}\": refused the connection of \"{}\": its proof does not "
        "match this worker's job secret",
        name_, auth_.claimed_name(*connection));
    fail_(connection, "its proof of the job secret is wrong");
    return false;
  }
  const Hello claim = decode_hello(claimed->payload);  // decoded before
  return accept_claim(connection, claim);
}

bool HelloHandler::on_challenge(const std::shared_ptr<transport::Connection>& connection,
                                const Hello& hello) {
  const int peer = connection->peer;
  // With a secret, a connecting side is trusted once its peer's challenge
  // checked: a second challenge is a protocol error.
  if (peer < 0 || (auth_.enabled() && connection->trusted)) {
    fail_(connection, "protocol error: an unexpected challenge");
    return false;
  }
  Hello proof;
  const std::string problem =
      auth_.check_challenge(*connection, hello, peers_.name_of(peer), &proof);
  if (!problem.empty()) {
    // A joiner without the secret learns it as a refusal of its join.
    if (!auth_.enabled() && dynamic() && !hello.accepted) {
      Hello refusal = hello;
      refusal.kind = Hello::Kind::kWelcome;
      refusal.rank = peer;
      refusal.reason = problem;
      membership_->on_welcome(refusal);
    }
    // Logged once, by connection_failed(), as the peer's reason.
    peers_.refused(peer, connection, "failed the authentication: " + problem);
    fail_(connection, problem);
    return false;
  }
  const std::vector<uint8_t> bytes = encode_hello(proof);
  connection->enqueue_control(wire::FrameKind::kHello, bytes.data(), bytes.size());
  connection->trusted = true;
  peers_.authenticated(peer, connection);
  return true;
}

bool HelloHandler::accept_claim(const std::shared_ptr<transport::Connection>& connection,
                                const Hello& hello) {
  std::string problem;
  if (hello.kind == Hello::Kind::kJoin) {
    if (!dynamic()) {
      problem = fmt::format(
          "worker \"{}\" (rank {}) tried to join as a member of a dynamic group, but "
          "this "
          "is a static group (world_size {})",
          hello.name, hello.rank, capacity_);
    } else {
      WorkerAnnouncement joiner;
      try {
        joiner =
            decode_announcement(hello.announcement.data(), hello.announcement.size());
      } catch (const std::exception& e) {
        fail_(connection, fmt::format("protocol error: {}", e.what()));
        return false;
      }
      return membership_->on_join_hello(connection, hello, joiner);
    }
  } else if (dynamic()) {
    problem = fmt::format(
        "worker \"{}\" (rank {}) said hello as a member of a static group, but this is a "
        "dynamic group",
        hello.name, hello.rank);
  } else {
    problem = static_group_->accept_hello(hello, connection);
  }
  if (problem.empty()) return true;
  fail_(connection, "protocol error: " + problem);
  return false;
}

}  // namespace switchboard::agents::pipe
