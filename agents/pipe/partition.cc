#include "agents/pipe/partition.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace switchboard::agents::pipe {

void ViewFreshness::observe(int r, std::optional<uint64_t> seq, Clock::time_point now) {
  if (!seq) {
    seen_.erase(r);
    return;
  }
  auto [it, added] = seen_.try_emplace(r, Seen{*seq, now});
  if (!added && it->second.seq != *seq) it->second = Seen{*seq, now};
}

bool ViewFreshness::live(int r, Clock::time_point now) const {
  auto it = seen_.find(r);
  return it != seen_.end() && now - it->second.moved <= window_;
}

std::string EvictionVote::explain() const {
  return fmt::format("{} that cannot reach it ([{}]) against {} on its side ([{}])",
                     against.size(), fmt::join(against, ", "), with.size(),
                     fmt::join(with, ", "));
}

EvictionVote decide_eviction(int self, int suspect, const std::set<int>& listed,
                             const std::function<bool(int)>& lost_by,
                             const std::function<bool(int)>& live) {
  EvictionVote vote;
  for (int v : listed) {
    if (v == suspect) continue;
    if (v != self && !live(v)) continue;  // its word counts for nothing
    (lost_by(v) ? vote.against : vote.with).push_back(v);
  }
  if (live(suspect)) vote.with.push_back(suspect);
  std::sort(vote.with.begin(), vote.with.end());
  const size_t a = vote.against.size();
  const size_t w = vote.with.size();
  // `against` holds at least `self` whenever self lost the suspect.
  vote.evict = a > w || (a == w && a > 0 && vote.against.front() < vote.with.front());
  return vote;
}

}  // namespace switchboard::agents::pipe
