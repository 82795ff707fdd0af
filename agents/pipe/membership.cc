#include "agents/pipe/membership.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/check.h"
#include "common/error.h"
#include "rendezvous/membership_token.h"
#include "rendezvous/rounds.h"
#include "store/call_bound.h"
#include "store/store.h"

namespace switchboard::agents::pipe {

namespace {

using Clock = std::chrono::steady_clock;
using Timeout = std::chrono::milliseconds;

using Keys = rendezvous::DynamicKeys;
const std::string kTokenKey = Keys::token();
const std::string kGroupKey = Keys::group();
const std::string kMembersKey = Keys::members();
const std::string kProbationKey = Keys::probation();

std::string rank_key(int rank) { return Keys::rank(rank); }
std::string evicted_key(int rank) { return Keys::evicted(rank); }
std::string view_key(int rank) { return Keys::view(rank); }

// The link views' freshness window: the heartbeat timeout (5 s when
// heartbeats are off).
Timeout view_window(const PipeAgentOptions& options) {
  return options.heartbeat_timeout.count() > 0 ? options.heartbeat_timeout : Timeout(5'000);
}

// What `keys` hold now (nullopt for a key that is missing), with one
// request when they all exist.
std::vector<std::optional<Bytes>> read_present(Store& store,
                                               const std::vector<std::string>& keys) {
  std::vector<std::optional<Bytes>> values(keys.size());
  if (keys.empty()) return values;
  if (store.check(keys)) {
    std::vector<Bytes> got = store.multi_get(keys);
    for (size_t i = 0; i < keys.size(); ++i) values[i] = std::move(got[i]);
    return values;
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (store.check({keys[i]})) values[i] = store.get(keys[i]);
  }
  return values;
}

// The counter of a link view as stored (nullopt: none, or unreadable).
std::optional<LinkView> view_of(const std::optional<Bytes>& value) {
  if (!value) return std::nullopt;
  try {
    return decode_link_view(*value);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// A new group's id: random, so that a group founded again in a restarted
// store is told apart from the one before.
std::string new_group_id() {
  std::random_device device;
  return fmt::format("{:08x}{:08x}{:08x}{:08x}", device(), device(), device(), device());
}

std::set<int> ranks_of(const std::vector<Member>& members) {
  std::set<int> out;
  for (const Member& m : members) out.insert(m.rank);
  return out;
}

Bytes to_bytes(const std::string& text) { return Bytes(text.begin(), text.end()); }
std::string to_string(const Bytes& bytes) { return std::string(bytes.begin(), bytes.end()); }

std::vector<Member> read_members(Store& store) {
  if (!store.check({kMembersKey})) return {};
  return decode_members(store.get(kMembersKey));
}

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

// ------------------------------------------------------------------ watching

void Membership::watch() {
  const Timeout every = poll_interval();
  // Each store call of this thread ends within the heartbeat timeout, so
  // that stop() (a leave, a shutdown) waits that long at most, even for a
  // store that does not answer.
  StoreCallBound cap(view_window(options_));
  bool failing = false;  // the last round failed (logged once per streak)
  for (;;) {
    std::map<int, std::pair<Gone, std::string>> departed;
    {
      MutexLock lock(mu_);
      // After a failed round, wait a whole interval (a store that refuses
      // at once must not make this spin).
      wake_.wait_for(mu_, every, [&]() SB_REQUIRES(mu_) {
        return stopping_ || (!failing && !departed_.empty());
      });
      if (stopping_ || !evicted_.empty()) return;
      departed = departed_;
    }
    try {
      if (!departed.empty() || !suspects_.empty()) remove_departed(departed);
      {
        MutexLock lock(mu_);
        for (const auto& [rank, gone] : departed) {
          auto it = departed_.find(rank);
          if (it != departed_.end() && it->second == gone) departed_.erase(it);
        }
      }
      reconcile();
      if (failing) spdlog::info("rpc agent \"{}\": the store answers again", name_);
      failing = false;
    } catch (const std::exception& e) {
      if (stopping()) return;
      if (!failing) {
        spdlog::warn("rpc agent \"{}\": cannot keep the dynamic group's member list: {}; "
                     "trying again every {} ms",
                     name_, e.what(), every.count());
      }
      failing = true;
    }
  }
}

void Membership::remove_departed(const std::map<int, std::pair<Gone, std::string>>& departed) {
  // A member that said goodbye while holding the token is leaving the
  // proper way and takes itself off the list. One that said goodbye
  // otherwise shut down without leaving: taken off at once. A lost one is
  // a suspect until the rule decides (decide_eviction), asked again at
  // every poll.
  std::map<int, std::string> left;
  std::string holder;
  if (store_->check({kTokenKey})) {
    holder = rendezvous::MembershipToken::holder_of(to_string(store_->get(kTokenKey)));
  }
  for (const auto& [rank, gone] : departed) {
    if (gone.first == Gone::kLost) {
      suspects_[rank] = gone.second;
    } else if (gone.first == Gone::kLeft && !(!holder.empty() && holder == peers_.name_of(rank))) {
      left[rank] = "it shut down without leaving";
    }
  }
  if (left.empty() && suspects_.empty()) return;

  rendezvous::MembershipToken token(store_, kTokenKey, name_, options_.membership_lease);
  token.acquire(step_timeout(), [this] { return stopping(); });
  std::vector<Member> members = read_members(*store_);
  const std::set<int> listed = ranks_of(members);
  if (!listed.count(rank_)) {
    token.release();
    return;  // this worker is off the list itself: reconcile() finds out
  }
  // Taken off by another member meanwhile.
  std::erase_if(suspects_, [&](const auto& entry) { return !listed.count(entry.first); });
  exchange_views(listed);
  const auto now = Clock::now();
  std::map<int, std::string> remove = left;
  std::vector<std::string> undecided;
  for (const auto& entry : suspects_) {
    const int suspect = entry.first;  // named: lambdas cannot capture a structured binding
    const std::string& why = entry.second;
    const EvictionVote vote = decide_eviction(
        rank_, suspect, listed,
        [&](int v) {
          if (v == rank_) return !peers_.is_up(suspect);
          auto it = views_.find(v);
          return it != views_.end() && it->second.unreachable.count(suspect) > 0;
        },
        [&](int v) { return v == rank_ || freshness_.live(v, now); });
    if (vote.evict) {
      remove[suspect] = fmt::format("{} (members: {})", why, vote.explain());
    } else {
      undecided.push_back(fmt::format("\"{}\" (rank {}: {})", peers_.name_of(suspect),
                                      suspect, vote.explain()));
    }
  }
  std::vector<Member> kept;
  std::vector<std::string> removed;
  std::vector<std::string> keys;
  std::vector<Bytes> values;
  for (const Member& m : members) {
    auto it = remove.find(m.rank);
    if (it == remove.end()) {
      kept.push_back(m);
      continue;
    }
    keys.push_back(evicted_key(m.rank));
    values.push_back(to_bytes(fmt::format("by \"{}\": {}", name_, it->second)));
    removed.push_back(fmt::format("\"{}\" (rank {}: {})", m.announcement.name, m.rank, it->second));
  }
  if (!removed.empty()) {
    // One request: a reader never sees the record without the list (our
    // server and HashStore apply a MULTI_SET at once).
    keys.push_back(kMembersKey);
    values.push_back(encode_members(kept));
    store_->multi_set(keys, values);
  }
  token.release();
  for (const auto& [rank, why] : remove) suspects_.erase(rank);
  if (!removed.empty()) {
    spdlog::warn("rpc agent \"{}\": took {} off the dynamic group's member list", name_,
                 fmt::join(removed, ", "));
  }
  const std::string waiting = fmt::format("{}", fmt::join(undecided, ", "));
  if (!undecided.empty() && waiting != undecided_logged_) {
    spdlog::warn("rpc agent \"{}\": lost contact with {}; not taking them off the member list "
                 "yet: their side of the partition is not the smaller (this worker may be the "
                 "one cut off); asked again at every poll",
                 name_, waiting);
  }
  undecided_logged_ = waiting;
}

void Membership::exchange_views(const std::set<int>& listed) {
  LinkView mine;
  mine.seq = ++view_seq_;
  std::vector<int> others;
  std::vector<std::string> keys;
  for (int r : listed) {
    if (r == rank_) continue;
    if (!peers_.is_up(r)) mine.unreachable.insert(r);
    others.push_back(r);
    keys.push_back(view_key(r));
  }
  store_->set(view_key(rank_), encode_link_view(mine));
  const std::vector<std::optional<Bytes>> values = read_present(*store_, keys);
  const auto now = Clock::now();
  for (size_t i = 0; i < others.size(); ++i) {
    std::optional<LinkView> view = view_of(values[i]);
    freshness_.observe(others[i],
                       view ? std::optional<uint64_t>(view->seq) : std::nullopt, now);
    if (view) {
      views_[others[i]] = std::move(*view);
    } else {
      views_.erase(others[i]);
    }
  }
  std::erase_if(views_, [&](const auto& entry) { return !listed.count(entry.first); });
}

void Membership::reconcile() {
  end_probation_if_due();
  if (!store_->check({kGroupKey, kMembersKey})) {
    restore();
    return;
  }
  const std::vector<Bytes> values = store_->multi_get({kGroupKey, kMembersKey});
  const std::string group = to_string(values[0]);
  const std::vector<Member> members = decode_members(values[1]);
  if (group != group_id_) {
    // This worker's group was founded in a store restarted empty, and the
    // older group that lives on took the store back: out, told why.
    const std::string reclaimed = Keys::reclaimed(group_id_);
    if (store_->check({reclaimed})) {
      become_evicted(to_string(store_->get(reclaimed)));
      return;
    }
    // Another group formed in the emptied store: taken back while it is on
    // probation; otherwise the store is this group's again once that group
    // has no members left.
    if (members.empty()) {
      restore();
    } else if (on_probation(group)) {
      reclaim(group, members);
    } else {
      report_other_group(group);
    }
    return;
  }
  const std::set<int> now = ranks_of(members);
  if (!now.count(rank_)) {
    become_evicted(removal_reason(rank_));
    return;
  }
  exchange_views(now);
  auto drop = [&](int r) {
    drop_(r, fmt::format("is no longer in the dynamic group: it was taken off the member list {}",
                         removal_reason(r)));
  };
  for (int r : listed_) {
    // Also a member already lost here: the list says why it is gone.
    if (!now.count(r) && r != rank_) drop(r);
  }
  // A member up here that this watcher never saw on the list: a joiner
  // still joining (it holds the token until it has written the list), or
  // one taken off before this watcher looked. The token is read before
  // the list: a joiner that released it had written the list by then.
  std::vector<int> unlisted;
  for (int r : peers_.peers_up()) {
    if (!now.count(r) && !listed_.count(r)) unlisted.push_back(r);
  }
  if (!unlisted.empty()) {
    std::string holder;
    if (store_->check({kTokenKey})) {
      holder = rendezvous::MembershipToken::holder_of(to_string(store_->get(kTokenKey)));
    }
    const std::set<int> again = ranks_of(read_members(*store_));
    for (int r : unlisted) {
      if (!again.count(r) && holder != peers_.name_of(r)) drop(r);
    }
  }
  listed_ = now;
}

std::string Membership::removal_reason(int r) {
  if (store_->check({evicted_key(r)})) return to_string(store_->get(evicted_key(r)));
  return "by a worker that left it or found it gone";
}

void Membership::become_evicted(const std::string& why) {
  {
    MutexLock lock(mu_);
    if (!evicted_.empty()) return;
    evicted_ = why.empty() ? std::string("(no reason recorded)") : why;
    was_evicted_.store(true, std::memory_order_release);
  }
  spdlog::error("rpc agent \"{}\": this worker was evicted from the dynamic group {}: it is "
                "no longer on the member list ({}); calls to the members fail from now on. "
                "Shut it down; to come back, join again under a new rank",
                name_, group_id_, why);
  peers_.close_to_newcomers();
  const std::string reason =
      fmt::format("cannot be called: this worker \"{}\" was evicted from the dynamic group "
                  "({})",
                  name_, why);
  // Every member, also those already lost here: the reason is now this.
  for (int r = 0; r < capacity_; ++r) {
    if (r != rank_) drop_(r, reason);
  }
  publish(rpc::MembershipChange::Kind::kLeft, rpc::WorkerInfo{name_, rank_});
}

void Membership::restore() {
  rendezvous::MembershipToken token(store_, kTokenKey, name_, options_.membership_lease);
  token.acquire(step_timeout(), [this] { return stopping(); });
  std::string group = group_id_;
  if (store_->check({kGroupKey})) group = to_string(store_->get(kGroupKey));
  const bool listed = store_->check({kMembersKey});
  if (group != group_id_) {
    // Another group's, which keeps the store while it has members (one on
    // probation is taken back by reconcile()).
    if (listed && !read_members(*store_).empty()) {
      const bool young = on_probation(group);
      token.release();
      if (!young) report_other_group(group);
      return;
    }
    spdlog::warn("rpc agent \"{}\": the store's other dynamic group ({}) has no members left; "
                 "the store is this group's ({}) again",
                 name_, group.empty() ? "no id" : group, group_id_);
  } else if (listed) {
    token.release();
    return;  // another member restored it first
  }
  const std::string names = write_view({});
  token.release();
  spdlog::warn("rpc agent \"{}\": the store had lost dynamic group {}'s member list (was it "
               "restarted?); restored it from this worker's view: {}",
               name_, group_id_, names);
}

// This worker and every member it is connected to.
std::vector<Member> Membership::view_now() const {
  std::set<int> ranks{rank_};
  for (int r : peers_.peers_up()) ranks.insert(r);
  std::vector<Member> members;
  for (int r : ranks) {
    members.push_back({r, r == rank_ ? mine_ : peers_.info(r).announcement});
  }
  return members;
}

std::string Membership::write_view(std::vector<std::pair<std::string, Bytes>> also) {
  const std::vector<Member> members = view_now();
  std::vector<std::string> keys;
  std::vector<Bytes> values;
  for (auto& [key, value] : also) {
    keys.push_back(key);
    values.push_back(std::move(value));
  }
  keys.push_back(kGroupKey);
  values.push_back(to_bytes(group_id_));
  std::vector<std::string> names;
  for (const Member& m : members) {
    keys.push_back(rank_key(m.rank));
    values.push_back(to_bytes(m.announcement.name));
    names.push_back(fmt::format("\"{}\"", m.announcement.name));
  }
  keys.push_back(kMembersKey);  // last: a reader that sees it sees the rest
  values.push_back(encode_members(members));
  store_->multi_set(keys, values);
  listed_ = ranks_of(members);
  return fmt::format("{}", fmt::join(names, ", "));
}

bool Membership::on_probation(const std::string& group) {
  return store_->check({kProbationKey}) && to_string(store_->get(kProbationKey)) == group;
}

void Membership::reclaim(const std::string& young, const std::vector<Member>& young_members) {
  rendezvous::MembershipToken token(store_, kTokenKey, name_, options_.membership_lease);
  token.acquire(step_timeout(), [this] { return stopping(); });
  // Still that group, still on probation (its founder may have ended it,
  // or another member reclaimed the store first)?
  if (!store_->check({kGroupKey}) || to_string(store_->get(kGroupKey)) != young ||
      !on_probation(young)) {
    token.release();
    return;
  }
  std::vector<std::string> theirs;
  for (const Member& m : young_members) theirs.push_back(fmt::format("\"{}\"", m.announcement.name));
  std::vector<std::string> ours;
  for (const Member& m : view_now()) ours.push_back(fmt::format("\"{}\"", m.announcement.name));
  const std::string why = fmt::format(
      "by \"{}\": the store was restarted empty and this worker's group {} (members {}) was "
      "founded there while dynamic group {} (members {}) was still running; that group took the "
      "store back. Join again (init_rpc) to be in it",
      name_, young, fmt::join(theirs, ", "), group_id_, fmt::join(ours, ", "));
  write_view({{Keys::reclaimed(young), to_bytes(why)}});
  store_->delete_key(kProbationKey);
  token.release();
  reported_group_.clear();
  spdlog::warn("rpc agent \"{}\": the store (restarted empty?) held dynamic group {} (members "
               "{}), founded there on probation; took it back for group {}: {}; its members are "
               "told that they are out",
               name_, young, fmt::join(theirs, ", "), group_id_, fmt::join(ours, ", "));
}

void Membership::end_probation_if_due() {
  if (!probation_until_ || Clock::now() < *probation_until_) return;
  rendezvous::MembershipToken token(store_, kTokenKey, name_, options_.membership_lease);
  token.acquire(step_timeout(), [this] { return stopping(); });
  if (on_probation(group_id_)) store_->delete_key(kProbationKey);
  token.release();
  probation_until_.reset();
}

void Membership::report_other_group(const std::string& other) {
  if (other == reported_group_) return;
  reported_group_ = other;
  spdlog::error("rpc agent \"{}\": the store now holds another dynamic group ({}) than the one "
                "this worker is in ({}): it lost this group's keys (restarted?) and a worker "
                "founded a new group there before the members restored theirs. The two groups "
                "do not see each other; this worker stays in its own",
                name_, other.empty() ? "no id" : other, group_id_);
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
