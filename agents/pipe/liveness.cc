#include "agents/pipe/liveness.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <exception>
#include <optional>
#include <utility>
#include <vector>

#include "agents/pipe/wire/frame.h"

namespace switchboard::agents::pipe {

namespace {

int64_t to_ns(std::chrono::milliseconds ms) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(ms).count();
}

}  // namespace

Liveness::Liveness(Options options, PeerTable& peers, Hooks hooks)
    : options_(std::move(options)), peers_(peers), hooks_(std::move(hooks)) {}

bool Liveness::tick() {
  const int64_t now = transport::now_ns();
  const int64_t limit = to_ns(options_.heartbeat_timeout);
  const std::optional<PeerTable::Watched> watched = peers_.watched();
  if (!watched) return false;  // stopping
  const int64_t last = last_tick_ns_.exchange(now);
  if (limit > 0 && last != 0 && now - last > limit / 2) {
    spdlog::warn(
        "rpc agent \"{}\": the heartbeat ran {} ms late (was this process stopped "
        "or starved?); the peers' silence is counted from now",
        options_.agent_name, (now - last) / 1'000'000);
    silence_from_ns_ = now;
  }
  auto silent = [&](const std::shared_ptr<transport::Connection>& connection) {
    return limit > 0 &&
           now - std::max(connection->last_recv_ns.load(), silence_from_ns_) > limit;
  };
  const int64_t hello_limit = to_ns(options_.hello_deadline);
  for (const auto& connection : watched->unidentified) {
    if (silent(connection)) {
      hooks_.fail(connection, fmt::format("no hello within {} ms",
                                          options_.heartbeat_timeout.count()));
    } else if (hello_limit > 0 &&
               now - std::max(connection->opened_ns, silence_from_ns_) > hello_limit) {
      hooks_.fail(connection, fmt::format("its hello was not through within {} ms of "
                                          "connecting (the hello deadline)",
                                          options_.hello_deadline.count()));
    }
  }
  for (const auto& connection : watched->up) {
    if (silent(connection)) {
      hooks_.fail(connection, fmt::format("silent for over {} ms (heartbeat timeout)",
                                          options_.heartbeat_timeout.count()));
    } else {
      connection->enqueue_control(wire::FrameKind::kHeartbeat);
    }
  }
  if (options_.reconnects) schedule_reconnects(now);
  return true;
}

void Liveness::lost(int peer, int self_rank) {
  if (!options_.reconnects || peer >= self_rank) return;
  MutexLock lock(mu_);
  reconnect_at_.emplace(peer, transport::now_ns());
}

void Liveness::schedule_reconnects(int64_t now) {
  std::vector<int> due;
  {
    MutexLock lock(mu_);
    for (const auto& [peer, at] : reconnect_at_) {
      if (at <= now && reconnecting_.insert(peer).second) due.push_back(peer);
    }
  }
  for (int peer : due) {
    try {
      hooks_.post_reconnect(peer);
    } catch (const std::exception&) {  // the pool is shutting down: so is this worker
      MutexLock lock(mu_);
      reconnecting_.erase(peer);
    }
  }
}

void Liveness::reconnect(int peer) {
  const std::chrono::milliseconds limit = options_.heartbeat_timeout.count() > 0
                                              ? options_.heartbeat_timeout
                                              : options_.hello_deadline;
  std::string failure;
  try {
    hooks_.connect_again(peer, limit);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  bool log = false;
  {
    MutexLock lock(mu_);
    reconnecting_.erase(peer);
    if (failure.empty()) {
      reconnect_at_.erase(peer);
      reconnect_logged_.erase(peer);
    } else {
      reconnect_at_[peer] = transport::now_ns() + to_ns(limit);
      log = reconnect_logged_.insert(peer).second;
    }
  }
  if (failure.empty()) {
    spdlog::info(
        "rpc agent \"{}\": connected again to worker \"{}\" (rank {}) after its "
        "connection was lost",
        options_.agent_name, peers_.name_of(peer), peer);
  } else if (log) {
    spdlog::warn(
        "rpc agent \"{}\": cannot connect again to worker \"{}\" (rank {}): {}; "
        "trying every {} ms",
        options_.agent_name, peers_.name_of(peer), peer, failure, limit.count());
  }
}

}  // namespace switchboard::agents::pipe
