// A dynamic group's records in the store (their keys are listed in
// membership.h): reading them, shared by the two halves of Membership
// (membership.cc: joining, admitting and leaving; membership_watch.cc:
// keeping this worker's view equal to the member list). Internal to
// //agents/pipe:membership.
//
// Errors: what the store throws, but where a function says otherwise.
// Thread safety: pure functions over the store passed in.
#pragma once

#include <chrono>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agents/pipe/announcement.h"
#include "agents/pipe/options.h"
#include "rendezvous/rounds.h"
#include "store/store.h"

namespace switchboard::agents::pipe::membership_records {

using Keys = rendezvous::DynamicKeys;
inline const std::string kTokenKey = Keys::token();
inline const std::string kGroupKey = Keys::group();
inline const std::string kMembersKey = Keys::members();
inline const std::string kProbationKey = Keys::probation();

inline std::string rank_key(int rank) { return Keys::rank(rank); }
inline std::string evicted_key(int rank) { return Keys::evicted(rank); }
inline std::string view_key(int rank) { return Keys::view(rank); }

// The link views' freshness window: the heartbeat timeout (5 s when
// heartbeats are off).
std::chrono::milliseconds view_window(const PipeAgentOptions& options);

// What `keys` hold now (nullopt for a key that is missing), with one
// request when they all exist.
std::vector<std::optional<Bytes>> read_present(Store& store,
                                               const std::vector<std::string>& keys);

// The counter of a link view as stored (nullopt: none, or unreadable).
std::optional<LinkView> view_of(const std::optional<Bytes>& value);

// A new group's id: random, so that a group founded again in a restarted
// store is told apart from the one before.
std::string new_group_id();

std::set<int> ranks_of(const std::vector<Member>& members);

inline Bytes to_bytes(const std::string& text) { return Bytes(text.begin(), text.end()); }
inline std::string to_string(const Bytes& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

// The member list (empty when there is none yet).
std::vector<Member> read_members(Store& store);

}  // namespace switchboard::agents::pipe::membership_records
