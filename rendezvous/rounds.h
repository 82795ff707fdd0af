// The one key scheme: every key a Switchboard group writes in its store is
// named here, and every kind of group meets in rounds of its own.
//
// A job's store (init_method.h resolves it) holds, for one job:
//
//   rpc/group_kind                 "static" or "dynamic": the first init_rpc
//                                  over the store says which (claim_group_kind)
//   rpc/gen/...                    the static init rounds (join_static_round)
//   rpc/<g>/...                    static round g's own keys: the agent's
//                                  (PIPE's under agent_store "pipe/": the
//                                  workers' announce/<r> and the quiet
//                                  rounds of its joins, quiet_rounds;
//                                  PROCESS_GROUP's
//                                  names rpc/names/<r>, its Gloo group under
//                                  rpc/pg_agent/ and its joins' rounds under
//                                  rpc/join/, agents/process_group/wire.h)
//   pipe/dyn/...                   a dynamic PIPE group's membership
//                                  (DynamicKeys: the token, the members)
//   collective/specs/<name>        a declared collective group's spec
//   collective/<name>/...          its rounds (join_collective_round)
//   launch/<job id>/...            the launchers of a multi-node job
//   switchboard/torch_rpc/join/<n> the torch backend's join(shutdown=False)
//
// Under torchrun the whole job's store is a prefix of the elastic agent's,
// "/worker/attempt_<n>" (init_method.h): an elastic restart is the next
// round, and nothing a failed attempt wrote can be read by the next one.
//
// Rounds of one kind on one store: a run that fails, or ends, leaves its
// keys; the next run of the same group opens the next round, so it never
// reads them. How each kind tells its round apart is documented at its
// function.
//
// Errors: what the store throws (ConnectionError, TimeoutError, ...);
// claim_group_kind throws GroupKindMismatchError (common/error.h, a
// std::invalid_argument) as documented there.
// Thread safety: the functions are safe to call from any thread; they
// share nothing but the store (which serializes its own requests).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace switchboard {
class Store;
}

namespace switchboard::rendezvous {

// One incarnation of a group: its number, and a store of its own (a
// PrefixStore over the job's).
struct Round {
  int64_t number = 0;
  std::shared_ptr<Store> store;
};

// --- init_rpc -------------------------------------------------------------

// One store hosts one kind of group: the first init_rpc over it records
// "static" or "dynamic" (compare_set, so racing workers agree); a worker of
// the other kind gets GroupKindMismatchError naming `worker` and both kinds.
void claim_group_kind(Store& store, const std::string& worker, std::optional<int> world_size);

// The static group's round on a store that may host many runs, of any world
// sizes, one after the other (and runs that failed). Keys under "rpc/gen/":
//   open           the round being formed (an integer; 0 at first)
//   <g>/world      its world size (the first worker's, compare_set)
//   <g>/rank/<r>   a counter: 1 for the worker that claimed rank r
//   <g>/count      the workers that claimed a rank
//   <g>/failed     set by a worker whose init failed there: the run is over
// A worker claims its rank in the open round. When that round failed, has
// another world size, or has its rank taken already, it belongs to another
// run: the worker opens the next one (compare_set, so racing workers open it
// once) and tries there. The worker that completes a round opens the next,
// for the run after. The round's store is "rpc/<g>/".
//
// What it cannot tell apart: a run whose workers were killed before they
// completed their round (so nobody marked it failed) and the missing worker
// of that run arriving late. A worker of the next run with that rank that
// arrives before any of its peers joins the dead round and times out; its
// peers then form the next one without it. (Under torchrun every attempt
// has a store of its own, so this cannot happen there.)
Round join_static_round(const std::shared_ptr<Store>& store, int rank, int world_size);

// Marks static round `round` failed, so that later workers of the same
// ranks form the next one instead of waiting for this run. Best effort:
// logs and returns when the store cannot be reached.
void mark_static_round_failed(Store& store, int64_t round, const std::string& why);

// --- agents ---------------------------------------------------------------

// Where a backend keeps its keys within a group's store: "<backend>/"
// ("pipe", "rpc/pg_agent").
std::shared_ptr<Store> agent_store(std::string_view backend, std::shared_ptr<Store> group);

// The prefix of the n-th quiet-group wait (rendezvous/quiet_group.h) of a
// group, within the store it is given: "<scope>join/<n>/".
std::string quiet_rounds(std::string_view scope, uint64_t n);

// A dynamic group's membership, in the agent's store.
struct DynamicKeys {
  static std::string token() { return "dyn/token"; }      // membership_token.h
  static std::string group() { return "dyn/group"; }      // the group's record
  static std::string members() { return "dyn/members"; }  // the member list
  static std::string rank(int rank);                      // dyn/rank/<r>
  static std::string evicted(int rank);                   // dyn/evicted/<r>
  static std::string view(int rank);                      // dyn/view/<r>
  // The id of a group founded in a store that held none, while it is on
  // probation (a live older group may be restoring the store).
  static std::string probation() { return "dyn/probation"; }
  static std::string reclaimed(const std::string& group);  // dyn/reclaimed/<id>
};

// --- named collective groups ------------------------------------------------

// A declared group's spec: "collective/specs/<group>".
std::string collective_spec_key(const std::string& group);

// The round of named collective group `group` (world size `world_size`)
// that this worker of rank `rank` joins: its k-th join of the group joins
// round k, "collective/<group>/ws<world size>/gen<k>/" (each rank counts its
// own joins under "collective/<group>/inits/<world size>/<rank>"), so a
// group destroyed and created again never meets the old one's keys.
Round join_collective_round(const std::shared_ptr<Store>& store, const std::string& group,
                            int world_size, int rank);

// --- launchers and adapters -------------------------------------------------

// The keys of multi-node job `job_id`'s launchers: "launch/<job id>/".
std::string launch_prefix(const std::string& job_id);

// The keys of attempt `attempt` (0, 1, ... : a restart is the next attempt)
// of multi-node job `job_id`'s launchers, inside launch_prefix(job_id):
// "launch/<job id>/attempt/<n>/". Its workers meet elsewhere, in the round
// of elastic_attempt_prefix(attempt).
std::string launch_attempt_prefix(const std::string& job_id, int attempt);

// The n-th join(shutdown=False) of the torch backend:
// "switchboard/torch_rpc/join/<n>".
std::string torch_join_key(uint64_t n);

// Under torchrun: the prefix of the elastic agent's store that attempt
// `attempt` uses, "/worker/attempt_<n>", as torch's own rendezvous does.
std::string elastic_attempt_prefix(int attempt);

}  // namespace switchboard::rendezvous
