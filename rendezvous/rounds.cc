#include "rendezvous/rounds.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <stdexcept>

#include "common/error.h"
#include "store/prefix_store.h"
#include "store/store.h"

namespace switchboard::rendezvous {

void claim_group_kind(Store& store, const std::string& worker, std::optional<int> world_size) {
  const std::string mine = world_size ? "static" : "dynamic";
  const Bytes desired(mine.begin(), mine.end());
  const Bytes found = store.compare_set("rpc/group_kind", {}, desired);
  if (found == desired) return;
  const std::string theirs(found.begin(), found.end());
  throw GroupKindMismatchError(fmt::format(
      "init_rpc(\"{}\"): this worker would join a {} group{}, but its store holds a {} "
      "group; static (world_size given) and dynamic (no world_size) workers cannot form one "
      "group",
      worker, mine, world_size ? fmt::format(" (world_size {})", *world_size) : "", theirs));
}

Round join_static_round(const std::shared_ptr<Store>& store, int rank, int world_size) {
  constexpr const char* kOpen = "rpc/gen/open";
  const std::string world = std::to_string(world_size);
  int64_t g = store->add(kOpen, 0);
  for (;;) {
    const std::string at = fmt::format("rpc/gen/{}/", g);
    bool ours = !store->check({at + "failed"});
    if (ours) {
      const Bytes found = store->compare_set(at + "world", {}, to_bytes(world));
      ours = to_string(found) == world;
    }
    if (ours) ours = store->add(fmt::format("{}rank/{}", at, rank), 1) == 1;
    if (ours) {
      if (store->add(at + "count", 1) == world_size) {
        store->compare_set(kOpen, to_bytes(std::to_string(g)), to_bytes(std::to_string(g + 1)));
      }
      return {g, std::make_shared<PrefixStore>(fmt::format("rpc/{}", g), store)};
    }
    // Another run's: open the next one (unless someone did) and try there.
    store->compare_set(kOpen, to_bytes(std::to_string(g)), to_bytes(std::to_string(g + 1)));
    g = std::max(g + 1, store->add(kOpen, 0));
  }
}

void mark_static_round_failed(Store& store, int64_t round, const std::string& why) {
  try {
    store.set(fmt::format("rpc/gen/{}/failed", round), to_bytes(why));
  } catch (const std::exception& e) {
    spdlog::debug("cannot mark static round {} failed: {}", round, e.what());
  }
}

std::shared_ptr<Store> agent_store(std::string_view backend, std::shared_ptr<Store> group) {
  return std::make_shared<PrefixStore>(std::string(backend), std::move(group));
}

std::string quiet_rounds(std::string_view scope, uint64_t n) {
  return fmt::format("{}join/{}/", scope, n);
}

std::string DynamicKeys::rank(int rank) { return fmt::format("dyn/rank/{}", rank); }
std::string DynamicKeys::evicted(int rank) { return fmt::format("dyn/evicted/{}", rank); }
std::string DynamicKeys::view(int rank) { return fmt::format("dyn/view/{}", rank); }
std::string DynamicKeys::reclaimed(const std::string& group) {
  return fmt::format("dyn/reclaimed/{}", group);
}

std::string collective_spec_key(const std::string& group) {
  return fmt::format("collective/specs/{}", group);
}

Round join_collective_round(const std::shared_ptr<Store>& store, const std::string& group,
                            int world_size, int rank) {
  const int64_t k =
      store->add(fmt::format("collective/{}/inits/{}/{}", group, world_size, rank), 1);
  return {k, std::make_shared<PrefixStore>(
                 fmt::format("collective/{}/ws{}/gen{}", group, world_size, k), store)};
}

std::string launch_prefix(const std::string& job_id) { return fmt::format("launch/{}/", job_id); }

std::string launch_attempt_prefix(const std::string& job_id, int attempt) {
  return fmt::format("{}attempt/{}/", launch_prefix(job_id), attempt);
}

std::string torch_join_key(uint64_t n) { return fmt::format("switchboard/torch_rpc/join/{}", n); }

std::string elastic_attempt_prefix(int attempt) {
  return fmt::format("/worker/attempt_{}", attempt);
}

}  // namespace switchboard::rendezvous
