// PipeAgent's dynamic groups: joining, leaving, and the members' side of
// both. See agents/pipe_agent.h ("Dynamic groups") for the protocol.
//
// Store keys, under the agent's "pipe/" prefix:
//   dyn/token      the membership token (rpc/membership_token.h)
//   dyn/members    the current members: encode_members() of (rank,
//                  announcement), written only by the token's holder
//   dyn/rank/<r>   the name of the worker that took rank r (ranks are never
//                  reused, so that a rank names one worker for the life of
//                  the group)
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/post.hpp>

#include "agents/pipe_agent_impl.h"
#include "common/check.h"
#include "common/error.h"
#include "rpc/membership_token.h"

namespace switchboard::agents {

namespace {

constexpr char kTokenKey[] = "dyn/token";
constexpr char kMembersKey[] = "dyn/members";

std::string rank_key(int rank) { return fmt::format("dyn/rank/{}", rank); }

Bytes to_bytes(const std::string& text) { return Bytes(text.begin(), text.end()); }
std::string to_string(const Bytes& bytes) { return std::string(bytes.begin(), bytes.end()); }

std::vector<Member> read_members(Store& store) {
  if (!store.check({kMembersKey})) return {};
  return decode_members(store.get(kMembersKey));
}

rpc::WorkerDevices devices_of(const WorkerAnnouncement& a) {
  return {a.name, a.device_count, a.device_maps, a.devices};
}

// What the membership steps may wait: the RPC timeout, or a minute when
// it is 0 (none), so that a wedged group still ends in an error.
std::chrono::milliseconds membership_timeout(const PipeAgentOptions& options) {
  return options.rpc_timeout.count() > 0 ? options.rpc_timeout
                                         : std::chrono::milliseconds(60'000);
}

}  // namespace

void PipeAgent::Impl::join_group() {
  listen();
  const auto timeout = membership_timeout(options);
  rpc::MembershipToken token(store, kTokenKey, name, options.membership_lease);
  token.acquire(timeout);

  std::vector<Member> members = read_members(*store);
  if (store->check({rank_key(rank)})) {
    throw std::invalid_argument(fmt::format(
        "PIPE agent \"{}\": rank {} was taken by worker \"{}\" in this dynamic group; "
        "ranks are never reused, pick another",
        name, rank, to_string(store->get(rank_key(rank)))));
  }
  const WorkerAnnouncement mine = my_announcement();
  std::vector<std::pair<std::shared_ptr<Connection>, Message>> early;
  std::vector<rpc::WorkerDevices> gathered;
  for (const Member& m : members) {
    if (m.announcement.name == name) {
      throw std::invalid_argument(fmt::format(
          "rpc worker name \"{}\" is used by rank {} in this dynamic group; names must be "
          "unique in the group",
          name, m.rank));
    }
    SB_REQUIRE(m.rank >= 0 && m.rank < capacity && m.rank != rank,
               "PIPE agent \"{}\": the group's member list holds rank {} (\"{}\")", name,
               m.rank, m.announcement.name);
    gathered.push_back(devices_of(m.announcement));
  }
  gathered.push_back(devices_of(mine));
  rpc::validate_device_maps(gathered, /*static_group=*/false);

  {
    std::lock_guard lock(mu);
    reverse_maps = rpc::reverse_device_maps(name, gathered);
    devices = rpc::default_devices(options.devices, options.device_maps, reverse_maps);
    for (const Member& m : members) {
      Peer& p = peers[m.rank];
      p.info = WorkerInfo{m.announcement.name, m.rank};
      p.announcement = m.announcement;
      p.address = m.announcement.address;
      p.port = m.announcement.port;
      p.state = PeerState::kConnecting;
    }
    peers[rank].info = WorkerInfo{name, rank};
    peers[rank].announcement = mine;
    peers[rank].state = PeerState::kUp;
    peers_ready = true;
    early.swap(early_hellos);
  }
  // Hellos that arrived before the table was ready (a stray joiner whose
  // token lease ended while this worker held it) are handled now.
  for (auto& hello : early) {
    asio::post(hello.first->strand,
               [self = shared_from_this(), connection = hello.first, frame = hello.second] {
                 if (self->on_hello(connection, frame)) connection->resume_reading();
               });
  }

  Hello hello;
  hello.kind = Hello::Kind::kJoin;
  hello.rank = rank;
  hello.name = name;
  hello.announcement = encode_announcement(mine);
  std::vector<int> reached;
  for (const Member& m : members) {
    try {
      connect_to(m.rank, hello);
      reached.push_back(m.rank);
    } catch (const ConnectionError& e) {
      // A member that died without leaving: it is no longer in the group.
      spdlog::warn("rpc agent \"{}\": member \"{}\" (rank {}) is unreachable and is dropped "
                   "from the group: {}",
                   name, m.announcement.name, m.rank, e.what());
      std::lock_guard lock(mu);
      peers[m.rank].state = PeerState::kLost;
      peers[m.rank].reason = "was unreachable when this worker joined";
    }
  }

  std::vector<std::string> refusals;
  {
    std::unique_lock lock(mu);
    auto answered = [&](int r) {
      return welcomes.count(r) > 0 || peers[r].state == PeerState::kLost;
    };
    const bool all = cv.wait_for(lock, timeout, [&] {
      return std::all_of(reached.begin(), reached.end(), answered);
    });
    if (!all) {
      std::vector<std::string> silent;
      for (int r : reached) {
        if (!answered(r)) silent.push_back(fmt::format("\"{}\"", peers[r].info.name));
      }
      throw TimeoutError(fmt::format(
          "PIPE agent \"{}\": joining the dynamic group: no answer from member(s) {} after "
          "{} ms",
          name, fmt::join(silent, ", "), timeout.count()));
    }
    for (int r : reached) {
      auto it = welcomes.find(r);
      if (it != welcomes.end() && !it->second.empty()) {
        refusals.push_back(fmt::format("\"{}\" refused: {}", peers[r].info.name, it->second));
      }
    }
  }
  if (!refusals.empty()) {
    throw std::invalid_argument(fmt::format("PIPE agent \"{}\": cannot join the dynamic group: {}",
                                            name, fmt::join(refusals, "; ")));
  }

  std::vector<Member> now;
  {
    std::lock_guard lock(mu);
    for (const Member& m : members) {
      if (peers[m.rank].state == PeerState::kUp) now.push_back(m);
    }
  }
  now.push_back({rank, mine});
  store->set(rank_key(rank), to_bytes(name));
  store->set(kMembersKey, encode_members(now));
  token.release();
  start_heartbeat();
}

bool PipeAgent::Impl::on_join_hello(const std::shared_ptr<Connection>& connection,
                                    const Hello& hello) {
  WorkerAnnouncement joiner;
  try {
    joiner = decode_announcement(hello.announcement.data(), hello.announcement.size());
  } catch (const std::exception& e) {
    connection_failed(connection, fmt::format("protocol error: {}", e.what()));
    return false;
  }
  const int r = hello.rank;
  std::string refusal;
  {
    std::lock_guard lock(mu);
    if (stopping || left) {
      refusal = fmt::format("\"{}\" is leaving the group", name);
    } else if (r < 0 || r >= capacity) {
      refusal = fmt::format("rank {} is outside [0, {})", r, capacity);
    } else if (peers[r].state != PeerState::kAbsent) {
      refusal = fmt::format("rank {} was taken by \"{}\"", r, peers[r].info.name);
    } else if (joiner.name != hello.name) {
      refusal = fmt::format("the hello names \"{}\" but the announcement \"{}\"", hello.name,
                            joiner.name);
    }
    std::vector<rpc::WorkerDevices> gathered;
    for (const Peer& p : peers) {
      if (!refusal.empty()) break;
      if (p.state != PeerState::kUp) continue;
      if (p.info.name == joiner.name) {
        refusal = fmt::format("the name \"{}\" is used by rank {}", joiner.name, p.info.id);
      }
      gathered.push_back(devices_of(p.announcement));
    }
    if (refusal.empty()) {
      gathered.push_back(devices_of(joiner));
      try {
        rpc::validate_device_maps(gathered, /*static_group=*/false);
        rpc::DeviceMaps reverse = rpc::reverse_device_maps(name, gathered);
        devices = rpc::default_devices(options.devices, options.device_maps, reverse);
        reverse_maps = std::move(reverse);
      } catch (const std::exception& e) {
        refusal = e.what();
      }
    }
    if (refusal.empty()) {
      Peer& p = peers[r];
      p.info = WorkerInfo{joiner.name, r};
      p.announcement = joiner;
      p.address = joiner.address;
      p.port = joiner.port;
      p.connection = connection;
      p.state = PeerState::kUp;
      connection->peer = r;
    }
    std::erase(unidentified, connection);
  }
  Hello welcome;
  welcome.kind = Hello::Kind::kWelcome;
  welcome.rank = rank;
  welcome.name = name;
  welcome.accepted = refusal.empty();
  welcome.reason = refusal;
  const std::vector<uint8_t> bytes = encode_hello(welcome);
  connection->enqueue_control(pipe::FrameKind::kHello, bytes.data(), bytes.size());
  if (!refusal.empty()) {
    spdlog::warn("rpc agent \"{}\": refused \"{}\" (rank {}) joining the group: {}", name,
                 hello.name, r, refusal);
    connection->close_after_flush();
    return false;
  }
  spdlog::debug("rpc agent \"{}\": \"{}\" (rank {}) joined the group", name, joiner.name, r);
  publish_change(rpc::MembershipChange::Kind::kJoined, WorkerInfo{joiner.name, r});
  return true;
}

void PipeAgent::Impl::on_welcome(const std::shared_ptr<Connection>& connection,
                                 const Hello& hello) {
  (void)connection;
  std::lock_guard lock(mu);
  welcomes[hello.rank] =
      hello.accepted ? std::string() : (hello.reason.empty() ? "refused" : hello.reason);
  cv.notify_all();
}

void PipeAgent::Impl::publish_change(rpc::MembershipChange::Kind kind,
                                     const WorkerInfo& worker) {
  if (!dynamic) return;
  rpc::MembershipListener call;
  std::string reason;
  {
    std::lock_guard lock(mu);
    call = listener;
    if (kind == rpc::MembershipChange::Kind::kLeft) reason = peers[worker.id].reason;
  }
  if (!call) return;
  rpc::MembershipChange change{kind, worker, reason};
  try {
    owner.pool()->post([call = std::move(call), change = std::move(change)] { call(change); });
  } catch (const std::exception& e) {  // the pool is shutting down
    spdlog::debug("rpc agent \"{}\": membership change of \"{}\" not reported: {}", name,
                  worker.name, e.what());
  }
}

void PipeAgent::Impl::leave_group(Timeout timeout) {
  const auto limit = timeout.count() > 0 ? timeout : membership_timeout(options);
  const auto deadline = Clock::now() + limit;
  rpc::MembershipToken token(store, kTokenKey, name, options.membership_lease);
  token.acquire(limit);
  std::vector<std::shared_ptr<Connection>> connections;
  {
    std::lock_guard lock(mu);
    left = true;
    for (const Peer& p : peers) {
      if (p.connection && p.state == PeerState::kUp) connections.push_back(p.connection);
    }
  }
  // From the goodbye on, the others fail new calls to this worker at once;
  // calls already in flight in either direction still complete.
  for (auto& c : connections) c->enqueue_control(pipe::FrameKind::kGoodbye);
  // Renew the token while waiting, so that a long drain does not lose it.
  const auto slice = std::max(Timeout(1), options.membership_lease / 2);
  bool drained = false;
  for (;;) {
    const auto idle = calls.wait_idle(std::min(deadline, Clock::now() + slice));
    drained = idle != rpc::CallTable::Idle::kTimedOut;
    if (drained || Clock::now() >= deadline) break;
    token.renew();
  }
  std::vector<Member> members = read_members(*store);
  std::erase_if(members, [&](const Member& m) { return m.rank == rank; });
  store->set(kMembersKey, encode_members(members));
  token.release();
  if (!drained) {
    const auto load = calls.load();
    throw TimeoutError(fmt::format(
        "rpc agent \"{}\" left the dynamic group with {} call(s) still in flight and {} "
        "request(s) being handled after {} ms",
        name, load.calls_in_flight, load.handling, limit.count()));
  }
}

}  // namespace switchboard::agents
