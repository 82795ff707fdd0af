#include "agents/pipe/membership_records.h"

#include <fmt/format.h>

#include <random>

namespace switchboard::agents::pipe::membership_records {

std::chrono::milliseconds view_window(const PipeAgentOptions& options) {
  return options.heartbeat_timeout.count() > 0 ? options.heartbeat_timeout
                                               : std::chrono::milliseconds(5'000);
}

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

std::optional<LinkView> view_of(const std::optional<Bytes>& value) {
  if (!value) return std::nullopt;
  try {
    return decode_link_view(*value);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::string new_group_id() {
  std::random_device device;
  return fmt::format("{:08x}{:08x}{:08x}{:08x}", device(), device(), device(), device());
}

std::set<int> ranks_of(const std::vector<Member>& members) {
  std::set<int> out;
  for (const Member& m : members) out.insert(m.rank);
  return out;
}

std::vector<Member> read_members(Store& store) {
  if (!store.check({kMembersKey})) return {};
  return decode_members(store.get(kMembersKey));
}

}  // namespace switchboard::agents::pipe::membership_records
