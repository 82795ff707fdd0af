// How a dynamic PIPE group decides a partition (agents/pipe/membership.h):
// what each member says about its links, kept in the store, how long a
// member's word stays fresh, and the rule that decides from them whether a
// lost member is taken off the list. Internal to //agents/pipe; pure code, no
// store and no threads.
//
// Every member writes its link view under dyn/view/<rank> at each poll of
// the member list: a counter that it moves on at each write, and the ranks
// on the list it cannot reach. A member whose counter has not moved for the
// heartbeat timeout, by the reader's own clock, is not live as far as the
// store can tell (it died, is stopped, or lost the store too); its word
// counts for nothing.
//
// The rule (decide_eviction): to take lost member X off the list, the live
// members that cannot reach X (the evictor among them) must outnumber X's
// side: X itself when it is live, and the live members that still reach it.
// On a tie, the side holding the lowest rank wins. So in a partition where
// both halves still reach the store, the larger half keeps the group and
// takes the smaller off, one member at a time or all at once, and the
// smaller half never evicts anyone; a dead member (not live) is taken off by
// whoever lost it. A member that cannot decide yet (the others' views lag
// behind) asks again at its next poll.
//
// Thread safety: none; each object belongs to one thread (the watcher's).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agents/pipe/announcement.h"  // LinkView

namespace switchboard::agents::pipe {

// Which members' views moved on within `window`, by this worker's clock.
class ViewFreshness {
 public:
  using Clock = std::chrono::steady_clock;
  explicit ViewFreshness(std::chrono::milliseconds window) : window_(window) {}

  // What rank `r`'s view key held at `now` (nullopt: no key). A counter
  // seen for the first time counts as moved now.
  void observe(int r, std::optional<uint64_t> seq, Clock::time_point now);
  // Whether `r`'s view moved on within the window before `now`. False for a
  // rank never seen with a view.
  bool live(int r, Clock::time_point now) const;
  void forget(int r) { seen_.erase(r); }

 private:
  struct Seen {
    uint64_t seq = 0;
    Clock::time_point moved;
  };
  std::chrono::milliseconds window_;
  std::map<int, Seen> seen_;
};

struct EvictionVote {
  bool evict = false;
  std::vector<int> against;  // live members that cannot reach the suspect
  std::vector<int> with;     // the suspect's side: itself when live, and who reaches it
  // "2 that cannot reach it ([0, 1]) against 3 on its side ([2, 3, 4])".
  std::string explain() const;
};

// Whether `self` may take `suspect` off the list `listed`: `lost_by(v)`
// tells whether member v cannot reach the suspect (called for `self` too),
// `live(v)` whether v's word counts (`self` always does).
EvictionVote decide_eviction(int self, int suspect, const std::set<int>& listed,
                             const std::function<bool(int)>& lost_by,
                             const std::function<bool(int)>& live);

}  // namespace switchboard::agents::pipe
