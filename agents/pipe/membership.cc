#include "agents/pipe/membership.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "agents/pipe/membership_records.h"
#include "common/check.h"
#include "common/error.h"
#include "rendezvous/membership_token.h"
#include "rendezvous/rounds.h"
#include "store/call_bound.h"
#include "store/store.h"

namespace switchboard::agents::pipe {

using namespace membership_records;

namespace {

using Clock = std::chrono::steady_clock;
using Timeout = std::chrono::milliseconds;

// A leave's store step failed with `e` within the leave's `limit`: the
// worker has left locally (goodbyes sent) all the same. Throws the same
// kind of error, saying so.
[[noreturn]] void rethrow_left_locally(const std::string& name, const Error& e, Timeout limit) {
  const std::string what = fmt::format(
      "rpc agent \"{}\" left the dynamic group without taking itself off the member list: "
      "the store did not let it within the leave's {} ms ({}); the members saw its goodbye "
      "and take it off the list themselves once the store answers",
      name, limit.count(), e.what());
  if (dynamic_cast<const TimeoutError*>(&e)) throw TimeoutError(what);
  if (dynamic_cast<const ConnectionError*>(&e)) throw ConnectionError(what);
  throw Error(e.code(), what);
}

rpc::WorkerDevices devices_of(const WorkerAnnouncement& a) {
  return {a.name, a.device_count, a.device_maps, a.devices};
}

}  // namespace

Membership::Membership(std::shared_ptr<Store> store, std::string name, int rank,
                       int capacity, const PipeAgentOptions& options, PeerTable& peers,
                       transport::PipeTransport& transport, const PipeAuth& auth,
                       rpc::CallTable& calls, std::shared_ptr<rpc::ThreadPool> pool,
                       DropPeer drop)
    : store_(std::move(store)),
      name_(std::move(name)),
      rank_(rank),
      capacity_(capacity),
      options_(options),
      peers_(peers),
      transport_(transport),
      auth_(auth),
      calls_(calls),
      pool_(std::move(pool)),
      drop_(std::move(drop)),
      freshness_(view_window(options)) {}

Membership::~Membership() { stop(); }

// The RPC timeout, or a minute when it is 0 (none), so that a wedged group
// still ends in an error.
Timeout Membership::step_timeout() const {
  return options_.rpc_timeout.count() > 0 ? options_.rpc_timeout : Timeout(60'000);
}

Timeout Membership::poll_interval() const {
  return std::max(options_.heartbeat_interval,
                  std::min(options_.heartbeat_timeout / 4, Timeout(1'000)));
}

// ------------------------------------------------------------------ joining

void Membership::join(const WorkerAnnouncement& mine) {
  const auto timeout = step_timeout();
  // One bound for the whole join, every store call included.
  const auto deadline = Clock::now() + timeout;
  StoreCallBound bound(deadline);
  auto left = [&] {
    return std::max(Timeout(1), std::chrono::duration_cast<Timeout>(deadline - Clock::now()));
  };
  rendezvous::MembershipToken token(store_, kTokenKey, name_, options_.membership_lease);
  token.acquire(timeout);

  bool founded = false;
  if (store_->check({kGroupKey})) {
    group_id_ = to_string(store_->get(kGroupKey));
  } else {
    // No group in this store (or one from before group ids): found one, on
    // probation (see reclaim()): the store may have been restarted empty
    // under a live group whose members have not restored it yet.
    group_id_ = new_group_id();
    store_->multi_set({kGroupKey, kProbationKey}, {to_bytes(group_id_), to_bytes(group_id_)});
    founded = true;
    spdlog::info("rpc agent \"{}\": founded dynamic group {} (the store holds no group)",
                 name_, group_id_);
  }
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
      throw DuplicateNameError(fmt::format(
          "rpc worker name \"{}\" is used by rank {} in this dynamic group; names must be "
          "unique in the group",
          name_, m.rank));
    }
    check_same_tls(mine, m.announcement, "cannot join the dynamic group");
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
  // Every member at once, each connect bounded by the join's time left
  // (and by half a lease, so that the token is renewed in time): one member
  // behind a cut link must not hold up the others (nor the heartbeats on
  // the connections already made, which run on the I/O threads meanwhile).
  const Timeout connect_limit =
      std::min(left() / 2, std::max(Timeout(1), options_.membership_lease / 2));
  // The members' link views now: one that cannot be reached is judged by
  // whether its view moves on from here (alive_among).
  const auto views_read = Clock::now();
  std::map<int, uint64_t> first_views;
  {
    std::vector<std::string> keys;
    for (const Member& m : members) keys.push_back(view_key(m.rank));
    const std::vector<std::optional<Bytes>> values = read_present(*store_, keys);
    for (size_t i = 0; i < members.size(); ++i) {
      if (auto v = view_of(values[i])) first_views[members[i].rank] = v->seq;
    }
  }
  std::vector<int> reached;
  std::vector<int> unreachable;
  std::vector<std::string> evicted_keys;
  std::vector<Bytes> evicted_why;
  {
    std::vector<std::string> failures(members.size());
    // A member that refused this worker's proof of the secret (or failed to
    // prove its own) is no reason to drop it: the join fails.
    std::vector<std::string> refusals(members.size());
    std::vector<std::thread> connecting;
    connecting.reserve(members.size());
    for (size_t i = 0; i < members.size(); ++i) {
      connecting.emplace_back([&, i] {
        try {
          peers_.connect(members[i].rank, transport_, auth_, hello, connect_limit);
        } catch (const ConnectionError& e) {
          failures[i] = e.what();
        } catch (const AuthenticationError& e) {
          refusals[i] = e.what();
        }
      });
    }
    for (std::thread& t : connecting) t.join();
    for (const std::string& refusal : refusals) {
      if (!refusal.empty()) {
        throw AuthenticationError(fmt::format(
            "PIPE agent \"{}\": cannot join the dynamic group: {}", name_, refusal));
      }
    }
    token.renew();
    for (size_t i = 0; i < members.size(); ++i) {
      (failures[i].empty() ? reached : unreachable).push_back(members[i].rank);
    }
    // A member this worker cannot reach is dead when its link view stands
    // still; one that is alive is behind a partition from this worker, and
    // the join fails, changing nothing.
    const std::set<int> alive =
        alive_among(unreachable, first_views, views_read, deadline, token);
    if (!alive.empty()) {
      std::vector<std::string> named;
      for (size_t i = 0; i < members.size(); ++i) {
        if (!alive.count(members[i].rank)) continue;
        named.push_back(fmt::format("\"{}\" (rank {}: {})", members[i].announcement.name,
                                    members[i].rank, failures[i]));
      }
      throw ConnectionError(fmt::format(
          "PIPE agent \"{}\": cannot join the dynamic group: member(s) {} cannot be reached "
          "from this worker, and are alive (their link views move on in the store) or could "
          "not be judged within the join's {} ms: this worker is cut off from them. Nothing "
          "was changed; join again once the link is back or the group has taken them off",
          name_, fmt::join(named, ", "), timeout.count()));
    }
    for (size_t i = 0; i < members.size(); ++i) {
      const Member& m = members[i];
      if (failures[i].empty()) continue;
      // A member that died without leaving: it is no longer in the group.
      spdlog::warn("rpc agent \"{}\": member \"{}\" (rank {}) is unreachable and its link "
                   "view stands still: it is dropped from the group: {}",
                   name_, m.announcement.name, m.rank, failures[i]);
      peers_.mark_lost(m.rank, "was unreachable when this worker joined");
      evicted_keys.push_back(evicted_key(m.rank));
      evicted_why.push_back(
          to_bytes(fmt::format("by \"{}\": it was unreachable when \"{}\" joined ({})", name_,
                               name_, failures[i])));
    }
  }

  std::vector<std::string> refusals;
  {
    MutexLock lock(mu_);
    auto answered = [&](int r) SB_REQUIRES(mu_) {
      return welcomes_.count(r) > 0 || lost_.count(r) > 0;
    };
    auto all_answered = [&]() SB_REQUIRES(mu_) {
      return std::all_of(reached.begin(), reached.end(), answered);
    };
    // Within the join's time left, renewing the token at every third of a
    // lease.
    const Timeout slice = std::max(Timeout(1), options_.membership_lease / 3);
    bool all = all_answered();
    while (!all && Clock::now() < deadline) {
      all = answered_.wait_for(mu_, std::min(left(), slice), all_answered);
      if (!all) {
        lock.unlock();
        token.renew();
        lock.lock();
      }
    }
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
  // Still the holder (else the token's renew() throws, naming who took it
  // over): the list is written from what this join read under it, and
  // nothing before this was written.
  token.renew();
  std::vector<std::string> keys = std::move(evicted_keys);
  std::vector<Bytes> values = std::move(evicted_why);
  keys.push_back(rank_key(rank_));
  values.push_back(to_bytes(name_));
  LinkView view;
  view.seq = ++view_seq_;
  keys.push_back(view_key(rank_));
  values.push_back(encode_link_view(view));
  keys.push_back(kMembersKey);  // last: a reader that sees it sees the rest
  values.push_back(encode_members(now));
  store_->multi_set(keys, values);
  token.release();

  mine_ = mine;
  listed_ = ranks_of(now);
  // On probation for one heartbeat timeout: an older group's members see
  // the store again within it (they poll it several times per heartbeat
  // timeout).
  if (founded) probation_until_ = Clock::now() + view_window(options_);
  MutexLock lock(mu_);
  watching_ = true;
  watcher_ = std::thread([this] { watch(); });
}

std::set<int> Membership::alive_among(const std::vector<int>& unreachable,
                                      const std::map<int, uint64_t>& first_views,
                                      Clock::time_point first_read, Clock::time_point deadline,
                                      rendezvous::MembershipToken& token) {
  // A member without a view (it never wrote one) is dead; one whose view
  // moves on is alive; one that is not judged by the deadline counts as
  // alive (the join must not take off a member it knows nothing of).
  std::set<int> alive;
  std::vector<int> judged;
  for (int r : unreachable) {
    if (first_views.count(r)) judged.push_back(r);
  }
  if (judged.empty()) return alive;
  std::vector<std::string> keys;
  for (int r : judged) keys.push_back(view_key(r));
  const auto verdict_at = first_read + view_window(options_);
  const Timeout slice = std::max(Timeout(1), std::min(poll_interval(), options_.membership_lease / 3));
  std::set<int> moved;
  for (;;) {
    const std::vector<std::optional<Bytes>> values = read_present(*store_, keys);
    for (size_t i = 0; i < judged.size(); ++i) {
      const std::optional<LinkView> v = view_of(values[i]);
      if (v && v->seq != first_views.at(judged[i])) moved.insert(judged[i]);
    }
    const auto now = Clock::now();
    if (moved.size() == judged.size() || now >= verdict_at) break;
    if (now >= deadline) {
      for (int r : judged) alive.insert(r);  // not judged in time
      return alive;
    }
    std::this_thread::sleep_for(std::min({slice, std::chrono::duration_cast<Timeout>(
                                                      std::min(verdict_at, deadline) - now)}));
    token.renew();
  }
  return moved;
}

void Membership::on_welcome(const Hello& hello) {
  MutexLock lock(mu_);
  welcomes_[hello.rank] =
      hello.accepted ? std::string() : (hello.reason.empty() ? "refused" : hello.reason);
  answered_.notify_all();
}

void Membership::on_peer_lost(int peer, Gone how, const std::string& why) {
  MutexLock lock(mu_);
  lost_.insert(peer);
  answered_.notify_all();
  if (how == Gone::kQuiet || !watching_ || stopping_ || !evicted_.empty()) return;
  departed_[peer] = {how, why};
  wake_.notify_all();
}

bool Membership::stopping() const {
  MutexLock lock(mu_);
  return stopping_;
}

std::string Membership::evicted() const {
  MutexLock lock(mu_);
  return evicted_;
}

void Membership::stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    wake_.notify_all();
  }
  // From the watcher itself (a call it failed ran a callback that shut the
  // agent down): it ends after this step; the destructor joins it.
  if (watcher_.joinable() && watcher_.get_id() != std::this_thread::get_id()) watcher_.join();
}

// ------------------------------------------------------------------ members

bool Membership::on_join_hello(const std::shared_ptr<transport::Connection>& connection,
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
  connection->enqueue_control(wire::FrameKind::kHello, bytes.data(), bytes.size());
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
  // One bound for the whole leave, the watcher's last store call and every
  // store call here included.
  const auto limit = timeout.count() > 0 ? timeout : step_timeout();
  const auto deadline = Clock::now() + limit;
  StoreCallBound bound(deadline);
  stop();
  if (!evicted().empty()) {
    // Off the list already: nothing to unpublish, only the calls to drain.
    peers_.close_to_newcomers();
    calls_.drain(limit, fmt::format("leave on rpc worker \"{}\"", name_));
    return;
  }
  rendezvous::MembershipToken token(store_, kTokenKey, name_, options_.membership_lease);
  bool goodbyes_sent = false;
  // From the goodbye on, the others fail new calls to this worker at once;
  // calls already in flight in either direction still complete.
  auto say_goodbye = [&] {
    if (goodbyes_sent) return;
    goodbyes_sent = true;
    for (auto& c : peers_.close_to_newcomers())
      c->enqueue_control(wire::FrameKind::kGoodbye);
  };
  try {
    token.acquire(limit);
  } catch (const Error& e) {
    // The store cannot be reached (or the token stays taken) within the
    // bound: this worker leaves all the same. The members see its goodbye
    // and take it off the list themselves once the store answers.
    say_goodbye();
    rethrow_left_locally(name_, e, limit);
  }
  say_goodbye();
  // Renew the token while waiting, so that a long drain does not lose it.
  const auto slice = std::max(Timeout(1), options_.membership_lease / 2);
  bool drained = false;
  for (;;) {
    const auto idle = calls_.wait_idle(std::min(deadline, Clock::now() + slice));
    drained = idle != rpc::CallTable::Idle::kTimedOut;
    if (drained || Clock::now() >= deadline) break;
    token.renew();
  }
  try {
    std::vector<Member> members = read_members(*store_);
    std::erase_if(members, [&](const Member& m) { return m.rank == rank_; });
    store_->set(kMembersKey, encode_members(members));
    token.release();
  } catch (const Error& e) {
    rethrow_left_locally(name_, e, limit);
  }
  if (!drained) {
    const auto load = calls_.load();
    throw TimeoutError(fmt::format(
        "rpc agent \"{}\" left the dynamic group with {} call(s) still in flight and {} "
        "request(s) being handled after {} ms",
        name_, load.calls_in_flight, load.handling, limit.count()));
  }
}

}  // namespace switchboard::agents::pipe
