// rendezvous/rounds.h: the key scheme's names, and each kind of group's
// rounds on one store: static init rounds (a run per round, a failed or
// other-sized run skipped), named collective groups (one round per join),
// the group kind claimed once. Over a HashStore: the rounds' logic, not the
// store's.
#include "rendezvous/rounds.h"

#include <catch2/catch.hpp>
#include <memory>
#include <stdexcept>
#include <string>

#include "common/error.h"
#include "store/hash_store.h"

using namespace switchboard;
using Catch::Matchers::Contains;

TEST_CASE("the key scheme's names", "[rendezvous][rounds]") {
  CHECK(rendezvous::launch_prefix("job") == "launch/job/");
  CHECK(rendezvous::launch_attempt_prefix("job", 2) == "launch/job/attempt/2/");
  CHECK(rendezvous::elastic_attempt_prefix(3) == "/worker/attempt_3");
  CHECK(rendezvous::quiet_rounds("rpc/", 4) == "rpc/join/4/");
  CHECK(rendezvous::quiet_rounds("", 0) == "join/0/");
  CHECK(rendezvous::collective_spec_key("trainers") == "collective/specs/trainers");
  CHECK(rendezvous::torch_join_key(5) == "switchboard/torch_rpc/join/5");
  CHECK(rendezvous::DynamicKeys::token() == "dyn/token");
  CHECK(rendezvous::DynamicKeys::rank(7) == "dyn/rank/7");
  CHECK(rendezvous::DynamicKeys::evicted(7) == "dyn/evicted/7");
  CHECK(rendezvous::DynamicKeys::view(7) == "dyn/view/7");
  CHECK(rendezvous::DynamicKeys::probation() == "dyn/probation");
  CHECK(rendezvous::DynamicKeys::reclaimed("abc") == "dyn/reclaimed/abc");
}

TEST_CASE("static rounds: each run of a group gets its own round and store; a failed run "
          "and a run of another size are skipped",
          "[rendezvous][rounds]") {
  auto store = std::make_shared<HashStore>();
  // Run 1: two workers.
  const rendezvous::Round a0 = rendezvous::join_static_round(store, 0, 2);
  const rendezvous::Round a1 = rendezvous::join_static_round(store, 1, 2);
  CHECK(a0.number == 0);
  CHECK(a1.number == 0);
  a0.store->set("k", "run 1");
  CHECK(to_string(a1.store->get("k")) == "run 1");
  // Run 2 of the same ranks meets in the next round, which sees nothing of
  // run 1.
  const rendezvous::Round b0 = rendezvous::join_static_round(store, 0, 2);
  CHECK(b0.number == 1);
  CHECK_FALSE(b0.store->check({"k"}));
  // Its rank 1 has not come; rank 0's init failed: the round is marked, and
  // the next run's workers skip it.
  rendezvous::mark_static_round_failed(*store, b0.number, "rank 0: init failed");
  const rendezvous::Round c1 = rendezvous::join_static_round(store, 1, 2);
  CHECK(c1.number == 2);
  // A run of another size skips a round whose world size differs.
  const rendezvous::Round d0 = rendezvous::join_static_round(store, 0, 3);
  CHECK(d0.number == 3);
}

TEST_CASE("collective rounds: the k-th join of a named group joins round k",
          "[rendezvous][rounds]") {
  auto store = std::make_shared<HashStore>();
  const rendezvous::Round first0 = rendezvous::join_collective_round(store, "g", 2, 0);
  const rendezvous::Round first1 = rendezvous::join_collective_round(store, "g", 2, 1);
  CHECK(first0.number == first1.number);
  first0.store->set("k", "v");
  CHECK(to_string(first1.store->get("k")) == "v");
  // Destroyed and created again: a fresh round.
  const rendezvous::Round again0 = rendezvous::join_collective_round(store, "g", 2, 0);
  CHECK(again0.number == first0.number + 1);
  CHECK_FALSE(again0.store->check({"k"}));
  // Another group, or the same name with another size, has rounds of its own.
  CHECK_FALSE(rendezvous::join_collective_round(store, "h", 2, 0).store->check({"k"}));
  CHECK_FALSE(rendezvous::join_collective_round(store, "g", 3, 0).store->check({"k"}));
}

TEST_CASE("one store hosts one kind of group: the second kind is refused, naming both",
          "[rendezvous][rounds]") {
  HashStore store;
  rendezvous::claim_group_kind(store, "w0", 2);
  rendezvous::claim_group_kind(store, "w1", 4);  // static again: the same kind
  CHECK_THROWS_WITH(rendezvous::claim_group_kind(store, "w2", std::nullopt),
                    Contains("init_rpc(\"w2\")") && Contains("dynamic group") &&
                        Contains("holds a static group"));
  HashStore other;
  rendezvous::claim_group_kind(other, "d0", std::nullopt);
  CHECK_THROWS_WITH(rendezvous::claim_group_kind(other, "s0", 2),
                    Contains("static group (world_size 2)") && Contains("holds a dynamic group"));
  // Typed, so that the torch backend answers it in TensorPipe's words.
  CHECK_THROWS_AS(rendezvous::claim_group_kind(other, "s1", 3), GroupKindMismatchError);
  CHECK_THROWS_AS(rendezvous::claim_group_kind(store, "d1", std::nullopt),
                  GroupKindMismatchError);
}

TEST_CASE("an agent's store and a prefix of the job's store see only their own keys",
          "[rendezvous][rounds]") {
  auto job = std::make_shared<HashStore>();
  std::shared_ptr<Store> pipe = rendezvous::agent_store("pipe", job);
  pipe->set(rendezvous::DynamicKeys::members(), "m");
  CHECK(job->check({"pipe/dyn/members"}));
  CHECK_FALSE(job->check({"dyn/members"}));
}
