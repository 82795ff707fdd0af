// The rule a dynamic PIPE group decides a partition by (agents/pipe/partition.h):
// the larger side keeps the group, a tie goes to the side holding the lowest
// rank, a member whose link view stands still counts for nothing, and the
// smaller side never evicts. Pure functions: no store, no network.
#include "agents/pipe/partition.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <map>
#include <set>

#include "agents/pipe/announcement.h"
#include "common/error.h"

using namespace switchboard;
using namespace switchboard::agents;
using namespace switchboard::agents::pipe;
using namespace std::chrono_literals;

namespace {

// A group split into `sides` (every member live unless in `dead`): whether
// `self` may evict `suspect`, when every member of a side cannot reach the
// members of the other sides.
EvictionVote vote(int self, int suspect, const std::vector<std::set<int>>& sides,
                  const std::set<int>& dead = {}) {
  std::set<int> listed;
  std::map<int, int> side_of;
  for (size_t i = 0; i < sides.size(); ++i) {
    for (int r : sides[i]) {
      listed.insert(r);
      side_of[r] = static_cast<int>(i);
    }
  }
  return decide_eviction(
      self, suspect, listed,
      [&](int v) { return dead.count(suspect) || side_of[v] != side_of[suspect]; },
      [&](int v) { return !dead.count(v); });
}

}  // namespace

TEST_CASE("in a partition the larger side evicts the smaller, never the other way",
          "[pipe][partition]") {
  // Five members split {0, 1} / {2, 3, 4}.
  const std::vector<std::set<int>> sides = {{0, 1}, {2, 3, 4}};
  for (int self : {0, 1}) {
    for (int suspect : {2, 3, 4}) {
      INFO("w" << self << " about w" << suspect);
      CHECK_FALSE(vote(self, suspect, sides).evict);
    }
  }
  for (int self : {2, 3, 4}) {
    for (int suspect : {0, 1}) {
      INFO("w" << self << " about w" << suspect);
      const EvictionVote v = vote(self, suspect, sides);
      CHECK(v.evict);
      CHECK(v.against == std::vector<int>{2, 3, 4});
    }
  }
  CHECK(vote(2, 0, sides).explain() ==
        "3 that cannot reach it ([2, 3, 4]) against 2 on its side ([0, 1])");
}

TEST_CASE("a tie goes to the side holding the lowest rank", "[pipe][partition]") {
  const std::vector<std::set<int>> sides = {{0, 3}, {1, 2}};
  CHECK(vote(0, 1, sides).evict);
  CHECK(vote(3, 2, sides).evict);
  CHECK_FALSE(vote(1, 0, sides).evict);
  CHECK_FALSE(vote(2, 3, sides).evict);
  // Two members cut from each other: the lower rank keeps the group.
  CHECK(vote(0, 1, {{0}, {1}}).evict);
  CHECK_FALSE(vote(1, 0, {{0}, {1}}).evict);
}

TEST_CASE("a member whose view stands still counts for nothing: a dead member is evicted by "
          "whoever lost it, and dead members hold up no side",
          "[pipe][partition]") {
  // Two members, the lower rank dead: the survivor evicts it.
  CHECK(vote(1, 0, {{0, 1}}, {0}).evict);
  // Three members, one dead: either survivor evicts it.
  CHECK(vote(2, 0, {{0, 1, 2}}, {0}).evict);
  // {0, 1} / {2, 3, 4} with 3 and 4 dead: {0, 1} is now the larger side.
  CHECK(vote(0, 2, {{0, 1}, {2, 3, 4}}, {3, 4}).evict);
  CHECK_FALSE(vote(2, 0, {{0, 1}, {2, 3, 4}}, {3, 4}).evict);
}

TEST_CASE("a member that lost one peer on its own, while the others still reach it, does "
          "not evict it",
          "[pipe][partition]") {
  const std::set<int> listed = {0, 1, 2};
  // Only 0 cannot reach 2.
  const EvictionVote v = decide_eviction(
      0, 2, listed, [](int voter) { return voter == 0; }, [](int) { return true; });
  CHECK_FALSE(v.evict);
  CHECK(v.against == std::vector<int>{0});
  CHECK(v.with == std::vector<int>{1, 2});
}

TEST_CASE("liveness: a view counts as live while its counter moved within the window",
          "[pipe][partition]") {
  using Clock = ViewFreshness::Clock;
  ViewFreshness liveness(1000ms);
  const Clock::time_point t0 = Clock::now();
  CHECK_FALSE(liveness.live(1, t0));  // never seen
  liveness.observe(1, 7, t0);
  CHECK(liveness.live(1, t0 + 900ms));
  liveness.observe(1, 7, t0 + 900ms);  // unchanged
  CHECK_FALSE(liveness.live(1, t0 + 1100ms));
  liveness.observe(1, 8, t0 + 1200ms);  // moved on
  CHECK(liveness.live(1, t0 + 2100ms));
  liveness.observe(1, std::nullopt, t0 + 2200ms);  // its key is gone
  CHECK_FALSE(liveness.live(1, t0 + 2200ms));
}

TEST_CASE("link views round-trip through their encoding and refuse malformed bytes",
          "[pipe][partition]") {
  LinkView view;
  view.seq = 42;
  view.unreachable = {3, 5};
  const LinkView back = decode_link_view(encode_link_view(view));
  CHECK(back.seq == 42);
  CHECK(back.unreachable == std::set<int>{3, 5});
  CHECK_THROWS_AS(decode_link_view({0xc1}), ProtocolError);
}
