// Membership's watcher (membership.h, "One view of the group"): the thread
// that keeps this worker's view equal to the member list in the store,
// takes departed and unreachable members off it under the token, publishes
// this worker's link view, restores the group's keys in a store that lost
// them, and settles which of two groups founded in one store keeps it.
// Split from membership.cc, which joins, admits and leaves.
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

#include "agents/pipe/membership.h"
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

}  // namespace

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
        spdlog::warn(
            "rpc agent \"{}\": cannot keep the dynamic group's member list: {}; "
            "trying again every {} ms",
            name_, e.what(), every.count());
      }
      failing = true;
    }
  }
}

void Membership::remove_departed(
    const std::map<int, std::pair<Gone, std::string>>& departed) {
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
    } else if (gone.first == Gone::kLeft &&
               !(!holder.empty() && holder == peers_.name_of(rank))) {
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
    const int suspect =
        entry.first;  // named: lambdas cannot capture a structured binding
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
    removed.push_back(
        fmt::format("\"{}\" (rank {}: {})", m.announcement.name, m.rank, it->second));
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
    spdlog::warn(
        "rpc agent \"{}\": lost contact with {}; not taking them off the member list "
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
    drop_(r, fmt::format(
                 "is no longer in the dynamic group: it was taken off the member list {}",
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
  spdlog::error(
      "rpc agent \"{}\": this worker was evicted from the dynamic group {}: it is "
      "no longer on the member list ({}); calls to the members fail from now on. "
      "Shut it down; to come back, join again under a new rank",
      name_, group_id_, why);
  peers_.close_to_newcomers();
  const std::string reason = fmt::format(
      "cannot be called: this worker \"{}\" was evicted from the dynamic group "
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
    spdlog::warn(
        "rpc agent \"{}\": the store's other dynamic group ({}) has no members left; "
        "the store is this group's ({}) again",
        name_, group.empty() ? "no id" : group, group_id_);
  } else if (listed) {
    token.release();
    return;  // another member restored it first
  }
  const std::string names = write_view({});
  token.release();
  spdlog::warn(
      "rpc agent \"{}\": the store had lost dynamic group {}'s member list (was it "
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

void Membership::reclaim(const std::string& young,
                         const std::vector<Member>& young_members) {
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
  for (const Member& m : young_members)
    theirs.push_back(fmt::format("\"{}\"", m.announcement.name));
  std::vector<std::string> ours;
  for (const Member& m : view_now())
    ours.push_back(fmt::format("\"{}\"", m.announcement.name));
  const std::string why = fmt::format(
      "by \"{}\": the store was restarted empty and this worker's group {} (members {}) "
      "was "
      "founded there while dynamic group {} (members {}) was still running; that group "
      "took the "
      "store back. Join again (init_rpc) to be in it",
      name_, young, fmt::join(theirs, ", "), group_id_, fmt::join(ours, ", "));
  write_view({{Keys::reclaimed(young), to_bytes(why)}});
  store_->delete_key(kProbationKey);
  token.release();
  reported_group_.clear();
  spdlog::warn(
      "rpc agent \"{}\": the store (restarted empty?) held dynamic group {} (members "
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
  spdlog::error(
      "rpc agent \"{}\": the store now holds another dynamic group ({}) than the one "
      "this worker is in ({}): it lost this group's keys (restarted?) and a worker "
      "founded a new group there before the members restored theirs. The two groups "
      "do not see each other; this worker stays in its own",
      name_, other.empty() ? "no id" : other, group_id_);
}

}  // namespace switchboard::agents::pipe
