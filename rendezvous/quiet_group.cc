#include "rendezvous/quiet_group.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/error.h"
#include "store/call_bound.h"

namespace switchboard::rendezvous {

namespace {

using Clock = std::chrono::steady_clock;

// How long one store wait lasts before `gone` is asked again.
constexpr std::chrono::milliseconds kGoneCheckInterval{100};

std::string quoted_names(const QuietGroup& group, const std::vector<int>& ranks) {
  std::vector<std::string> names;
  for (int r : ranks) names.push_back(fmt::format("\"{}\"", group.names[r]));
  return fmt::format("[{}]", fmt::join(names, ", "));
}

uint64_t parse_count(const Bytes& bytes, const std::string& key) {
  uint64_t value = 0;
  const char* begin = reinterpret_cast<const char*>(bytes.data());
  const auto [end, error] = std::from_chars(begin, begin + bytes.size(), value);
  if (error != std::errc() || end != begin + bytes.size()) {
    throw ProtocolError(fmt::format("store key \"{}\" holds \"{}\", not a count", key,
                                    std::string(begin, bytes.size())));
  }
  return value;
}

// The ranks a wait has found gone, and how, kept across its rounds: the
// others go on without them, and the wait fails naming them once the rest
// of the group is quiet (quiet_group.h).
struct Gone {
  explicit Gone(size_t world) : out(world, false) {}
  std::vector<bool> out;          // by rank
  std::vector<int> ranks;         // in the order they were found
  std::vector<std::string> how;   // "\"w2\" shut down", ...
  bool all_shut_down = true;

  bool any() const { return !ranks.empty(); }
  std::vector<std::string> live_keys(const std::vector<std::string>& keys) const {
    std::vector<std::string> live;
    for (size_t r = 0; r < keys.size(); ++r) {
      if (!out[r]) live.push_back(keys[r]);
    }
    return live;
  }
};

// Waits until the key of every rank not gone is in the store; a missing
// rank that `group.gone` reports gone joins `gone` instead. Throws as the
// header says when the deadline passes or this worker shut down.
void wait_for_round(const QuietGroup& group, const std::vector<std::string>& keys,
                    std::optional<Clock::time_point> deadline, Gone& gone) {
  for (;;) {
    auto slice = kGoneCheckInterval;
    if (deadline) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          *deadline - Clock::now());
      slice = std::clamp(left, std::chrono::milliseconds(1), slice);
    }
    try {
      group.store->wait(gone.live_keys(keys), slice);
      return;
    } catch (const TimeoutError&) {
    }
    std::vector<int> missing;
    for (size_t r = 0; r < keys.size(); ++r) {
      if (!gone.out[r] && !group.store->check({keys[r]})) missing.push_back(static_cast<int>(r));
    }
    if (missing.empty()) return;
    if (group.calls->closed()) {
      throw Error(ErrorCode::kCancelled,
                  fmt::format("{}: rpc agent \"{}\" shut down", group.who,
                              group.calls->agent_name()));
    }
    if (group.gone) {
      std::vector<int> still;
      for (int r : missing) {
        if (std::optional<std::string> h = group.gone(r)) {
          gone.out[r] = true;
          gone.ranks.push_back(r);
          gone.how.push_back(fmt::format("\"{}\" {}", group.names[r], *h));
          gone.all_shut_down &= *h == "shut down";
        } else {
          still.push_back(r);
        }
      }
      if (still.empty()) return;
      missing = std::move(still);
    }
    if (deadline && Clock::now() >= *deadline) {
      throw TimeoutError(fmt::format("{}: timed out after {} ms waiting for workers {} to join",
                                     group.who, group.timeout.count(),
                                     quoted_names(group, missing)));
    }
  }
}

// After the quiet round `round`: every rank says it has read it, and rank 0
// returns only once all have (or one is gone, or the deadline passed).
// Rank 0 may host the store (an in-process TcpStore server): leaving
// first, it would fail the others' last reads of the round. The others'
// key here is their last store call of the join.
void leave_after_all_read(const QuietGroup& group, int round,
                          std::optional<Clock::time_point> deadline, Gone& gone) {
  const int world = static_cast<int>(group.names.size());
  if (world == 1) return;
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) {
    keys.push_back(fmt::format("{}{}/read/{}", group.prefix, round, r));
  }
  group.store->set(keys[group.rank], "1");
  if (group.rank != 0) return;
  try {
    wait_for_round(group, keys, deadline, gone);
  } catch (const std::exception& e) {
    // The group was quiet: this is only about leaving last.
    spdlog::debug("{}: not every worker said it read the last round: {}", group.who, e.what());
  }
}

}  // namespace

int wait_for_quiet_group(const QuietGroup& group) {
  SB_REQUIRE(group.calls != nullptr && group.store != nullptr,
             "{}: wait_for_quiet_group needs a call table and a store", group.who);
  SB_REQUIRE(group.timeout.count() >= 0, "{}: negative timeout {} ms", group.who,
             group.timeout.count());
  const int world = static_cast<int>(group.names.size());
  std::optional<Clock::time_point> deadline;
  // Every store call of the wait ends by its deadline too: a store whose
  // server went away is given up on then, not after the store's timeout.
  std::optional<StoreCallBound> bound;
  if (group.timeout.count() > 0) {
    deadline = Clock::now() + group.timeout;
    bound.emplace(*deadline);
  }
  Gone gone(group.names.size());
  uint64_t reported_started = group.calls->activity().started;
  for (int round = 1;; ++round) {
    // This worker first: its own calls and requests.
    switch (group.calls->wait_idle(deadline)) {
      case LocalCalls::Idle::kIdle:
        break;
      case LocalCalls::Idle::kTimedOut: {
        const LocalCalls::Activity now = group.calls->activity();
        throw TimeoutError(fmt::format(
            "{}: timed out after {} ms with {} calls in flight and {} requests being handled",
            group.who, group.timeout.count(), now.in_flight, now.handling));
      }
      case LocalCalls::Idle::kClosed:
        throw Error(ErrorCode::kCancelled, fmt::format("{}: rpc agent \"{}\" shut down",
                                                       group.who, group.calls->agent_name()));
    }
    const LocalCalls::Activity load = group.calls->activity();
    const uint64_t activity = load.in_flight + load.handling + (load.started - reported_started);
    reported_started = load.started;
    std::vector<std::string> keys;
    for (int r = 0; r < world; ++r) keys.push_back(fmt::format("{}{}/{}", group.prefix, round, r));
    group.store->set(keys[group.rank], std::to_string(activity));
    wait_for_round(group, keys, deadline, gone);
    // Every rank has read the previous round before writing this one.
    if (round > 1) {
      group.store->delete_key(fmt::format("{}{}/{}", group.prefix, round - 1, group.rank));
    }
    std::vector<int> live;
    for (int r = 0; r < world; ++r) {
      if (!gone.out[r]) live.push_back(r);
    }
    const std::vector<Bytes> values = group.store->multi_get(gone.live_keys(keys));
    std::vector<int> busy;
    for (size_t i = 0; i < live.size(); ++i) {
      if (parse_count(values[i], keys[live[i]]) > 0) busy.push_back(live[i]);
    }
    if (busy.empty()) {
      leave_after_all_read(group, round, deadline, gone);
      if (gone.any()) {
        // The rest of the group is quiet and may stop: now say who is missing.
        throw ConnectionError(
            gone.all_shut_down
                ? fmt::format("{}: workers {} shut down without joining", group.who,
                              quoted_names(group, gone.ranks))
                : fmt::format("{}: workers {} are gone without joining ({})", group.who,
                              quoted_names(group, gone.ranks), fmt::join(gone.how, "; ")));
      }
      return round;
    }
    if (deadline && Clock::now() >= *deadline) {
      throw TimeoutError(fmt::format(
          "{}: timed out after {} ms: the group was not quiet after {} rounds (workers {} "
          "were still making or serving calls)",
          group.who, group.timeout.count(), round, quoted_names(group, busy)));
    }
  }
}

}  // namespace switchboard::rendezvous
