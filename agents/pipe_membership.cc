#include "agents/pipe_membership.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "common/check.h"
#include "common/error.h"
#include "rpc/membership_token.h"
#include "store/store.h"

namespace switchboard::agents {

namespace {

using Clock = std::chrono::steady_clock;
using Timeout = std::chrono::milliseconds;

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

}  // namespace

Membership::Membership(std::shared_ptr<Store> store, std::string name, int rank,
                       int capacity, const PipeAgentOptions& options, PeerTable& peers,
                       PipeTransport& transport, rpc::CallTable& calls,
                       std::shared_ptr<rpc::ThreadPool> pool)
    : store_(std::move(store)),
      name_(std::move(name)),
      rank_(rank),
      capacity_(capacity),
      options_(options),
      peers_(peers),
      transport_(transport),
      calls_(calls),
      pool_(std::move(pool)) {}

// The RPC timeout, or a minute when it is 0 (none), so that a wedged group
// still ends in an error.
Timeout Membership::step_timeout() const {
  return options_.rpc_timeout.count() > 0 ? options_.rpc_timeout : Timeout(60'000);
}

// ------------------------------------------------------------------ joining

void Membership::join(const WorkerAnnouncement& mine) {
  const auto timeout = step_timeout();
  rpc::MembershipToken token(store_, kTokenKey, name_, options_.membership_lease);
  token.acquire(timeout);

  std::vector<Member> members = read_members(*store_);
  if (store_->check({rank_key(rank_)})) {
    throw std::invalid_argument(fmt::format(
        "PIPE agent \"{}\": rank {} was taken by worker \"{}\" in this dynamic group; "
        "ranks are never reused, pick another",
        name_, rank_, to_string(store_->get(rank_key(rank_)))));
  }
  std::vector<rpc::WorkerDevices> gathered;
  for (const Member& m : members) {
    if (m.announcement.name == name_) {
      throw std::invalid_argument(fmt::format(
          "rpc worker name \"{}\" is used by rank {} in this dynamic group; names must be "
          "unique in the group",
          name_, m.rank));
    }
    SB_REQUIRE(m.rank >= 0 && m.rank < capacity_ && m.rank != rank_,
               "PIPE agent \"{}\": the group's member list holds rank {} (\"{}\")", name_,
               m.rank, m.announcement.name);
    gathered.push_back(devices_of(m.announcement));
  }
  gathered.push_back(devices_of(mine));
  rpc::validate_device_maps(gathered, /*static_group=*/false);
  PeerTable::DeviceRoutes routes;
  routes.reverse_maps = rpc::reverse_device_maps(name_, gathered);
  routes.devices =
      rpc::default_devices(options_.devices, options_.device_maps, routes.reverse_maps);
  peers_.fill_members(members, rank_, mine, std::move(routes));

  Hello hello;
  hello.kind = Hello::Kind::kJoin;
  hello.rank = rank_;
  hello.name = name_;
  hello.announcement = encode_announcement(mine);
  const std::vector<uint8_t> bytes = encode_hello(hello);
  // Every member at once, each connect bounded by the step's timeout: one
  // member behind a cut link must not hold up the others (nor the
  // heartbeats on the connections already made, which run on the I/O
  // threads meanwhile).
  std::vector<int> reached;
  {
    std::vector<std::string> failures(members.size());
    std::vector<std::thread> connecting;
    connecting.reserve(members.size());
    for (size_t i = 0; i < members.size(); ++i) {
      connecting.emplace_back([&, i] {
        try {
          peers_.connect(members[i].rank, transport_, bytes, timeout);
        } catch (const ConnectionError& e) {
          failures[i] = e.what();
        }
      });
    }
    for (std::thread& t : connecting) t.join();
    for (size_t i = 0; i < members.size(); ++i) {
      const Member& m = members[i];
      if (failures[i].empty()) {
        reached.push_back(m.rank);
        continue;
      }
      // A member that died without leaving: it is no longer in the group.
      spdlog::warn("rpc agent \"{}\": member \"{}\" (rank {}) is unreachable and is dropped "
                   "from the group: {}",
                   name_, m.announcement.name, m.rank, failures[i]);
      peers_.mark_lost(m.rank, "was unreachable when this worker joined");
    }
  }

  std::vector<std::string> refusals;
  {
    MutexLock lock(mu_);
    auto answered = [&](int r) SB_REQUIRES(mu_) {
      return welcomes_.count(r) > 0 || lost_.count(r) > 0;
    };
    const bool all = answered_.wait_for(mu_, timeout, [&]() SB_REQUIRES(mu_) {
      return std::all_of(reached.begin(), reached.end(), answered);
    });
    if (!all) {
      std::vector<std::string> silent;
      for (int r : reached) {
        if (!answered(r)) silent.push_back(fmt::format("\"{}\"", peers_.name_of(r)));
      }
      throw TimeoutError(fmt::format(
          "PIPE agent \"{}\": joining the dynamic group: no answer from member(s) {} after "
          "{} ms",
          name_, fmt::join(silent, ", "), timeout.count()));
    }
    for (int r : reached) {
      auto it = welcomes_.find(r);
      if (it != welcomes_.end() && !it->second.empty()) {
        refusals.push_back(fmt::format("\"{}\" refused: {}", peers_.name_of(r), it->second));
      }
    }
  }
  if (!refusals.empty()) {
    throw std::invalid_argument(fmt::format("PIPE agent \"{}\": cannot join the dynamic group: {}",
                                            name_, fmt::join(refusals, "; ")));
  }

  std::vector<Member> now;
  for (const Member& m : members) {
    if (peers_.is_up(m.rank)) now.push_back(m);
  }
  now.push_back({rank_, mine});
  store_->set(rank_key(rank_), to_bytes(name_));
  store_->set(kMembersKey, encode_members(now));
  token.release();
}

void Membership::on_welcome(const Hello& hello) {
  MutexLock lock(mu_);
  welcomes_[hello.rank] =
      hello.accepted ? std::string() : (hello.reason.empty() ? "refused" : hello.reason);
  answered_.notify_all();
}

void Membership::on_peer_lost(int peer) {
  MutexLock lock(mu_);
  lost_.insert(peer);
  answered_.notify_all();
}

// ------------------------------------------------------------------ members

bool Membership::on_join_hello(const std::shared_ptr<Connection>& connection,
                               const Hello& hello, const WorkerAnnouncement& joiner) {
  const int r = hello.rank;
  const std::string refusal = peers_.admit(
      r, hello.name, joiner, connection,
      [this](const std::vector<rpc::WorkerDevices>& gathered) {
        rpc::validate_device_maps(gathered, /*static_group=*/false);
        PeerTable::DeviceRoutes routes;
        routes.reverse_maps = rpc::reverse_device_maps(name_, gathered);
        routes.devices = rpc::default_devices(options_.devices, options_.device_maps,
                                              routes.reverse_maps);
        return routes;
      });
  Hello welcome;
  welcome.kind = Hello::Kind::kWelcome;
  welcome.rank = rank_;
  welcome.name = name_;
  welcome.accepted = refusal.empty();
  welcome.reason = refusal;
  const std::vector<uint8_t> bytes = encode_hello(welcome);
  connection->enqueue_control(pipe::FrameKind::kHello, bytes.data(), bytes.size());
  if (!refusal.empty()) {
    spdlog::warn("rpc agent \"{}\": refused \"{}\" (rank {}) joining the group: {}", name_,
                 hello.name, r, refusal);
    connection->close_after_flush();
    return false;
  }
  spdlog::debug("rpc agent \"{}\": \"{}\" (rank {}) joined the group", name_, joiner.name, r);
  publish(rpc::MembershipChange::Kind::kJoined, rpc::WorkerInfo{joiner.name, r});
  return true;
}

void Membership::publish(rpc::MembershipChange::Kind kind, const rpc::WorkerInfo& worker) {
  rpc::MembershipListener call;
  {
    MutexLock lock(mu_);
    call = listener_;
  }
  if (!call) return;
  std::string reason;
  if (kind == rpc::MembershipChange::Kind::kLeft) reason = peers_.reason(worker.id);
  rpc::MembershipChange change{kind, worker, reason};
  try {
    pool_->post([call = std::move(call), change = std::move(change)] { call(change); });
  } catch (const std::exception& e) {  // the pool is shutting down
    spdlog::debug("rpc agent \"{}\": membership change of \"{}\" not reported: {}", name_,
                  worker.name, e.what());
  }
}

void Membership::set_listener(rpc::MembershipListener listener) {
  MutexLock lock(mu_);
  listener_ = std::move(listener);
}

// ------------------------------------------------------------------ leaving

void Membership::leave(Timeout timeout) {
  const auto limit = timeout.count() > 0 ? timeout : step_timeout();
  const auto deadline = Clock::now() + limit;
  rpc::MembershipToken token(store_, kTokenKey, name_, options_.membership_lease);
  token.acquire(limit);
  // From the goodbye on, the others fail new calls to this worker at once;
  // calls already in flight in either direction still complete.
  for (auto& c : peers_.close_to_newcomers()) c->enqueue_control(pipe::FrameKind::kGoodbye);
  // Renew the token while waiting, so that a long drain does not lose it.
  const auto slice = std::max(Timeout(1), options_.membership_lease / 2);
  bool drained = false;
  for (;;) {
    const auto idle = calls_.wait_idle(std::min(deadline, Clock::now() + slice));
    drained = idle != rpc::CallTable::Idle::kTimedOut;
    if (drained || Clock::now() >= deadline) break;
    token.renew();
  }
  std::vector<Member> members = read_members(*store_);
  std::erase_if(members, [&](const Member& m) { return m.rank == rank_; });
  store_->set(kMembersKey, encode_members(members));
  token.release();
  if (!drained) {
    const auto load = calls_.load();
    throw TimeoutError(fmt::format(
        "rpc agent \"{}\" left the dynamic group with {} call(s) still in flight and {} "
        "request(s) being handled after {} ms",
        name_, load.calls_in_flight, load.handling, limit.count()));
  }
}

}  // namespace switchboard::agents
