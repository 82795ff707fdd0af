#include "rpc/backend/static_workers.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>

#include "common/error.h"
#include "rpc/call_table.h"

namespace switchboard::rpc::backend {
namespace {

// "0 and 2", "0, 1 and 2".
std::string and_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) out += i + 1 == ranks.size() ? " and " : ", ";
    out += std::to_string(ranks[i]);
  }
  return out;
}

// What is left until `deadline`, for the store's wait: at least 1 ms (0
// would mean no bound to the store).
Store::Timeout time_left(std::chrono::steady_clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                        deadline - std::chrono::steady_clock::now()) +
                    std::chrono::milliseconds(1);
  return std::max(left, std::chrono::milliseconds(1));
}

}  // namespace

StaticWorkers StaticWorkers::exchange(Store& store, const Self& self,
                                      std::chrono::milliseconds timeout,
                                      std::chrono::steady_clock::time_point deadline) {
  const Store::Timeout wait_timeout =
      timeout.count() > 0 ? time_left(deadline) : Store::kNoTimeout;
  std::vector<std::string> keys;
  keys.reserve(self.world_size);
  for (int r = 0; r < self.world_size; ++r)
    keys.push_back(self.names_key + std::to_string(r));
  store.set(keys[self.rank], self.name);
  try {
    store.wait(keys, wait_timeout);
  } catch (const TimeoutError&) {
    std::vector<int> missing;
    for (int r = 0; r < self.world_size; ++r) {
      if (!store.check({keys[r]})) missing.push_back(r);
    }
    throw TimeoutError(fmt::format(
        "rpc worker \"{}\" (rank {} of {}): timed out after {} ms waiting for ranks "
        "[{}] to start",
        self.name, self.rank, self.world_size, timeout.count(),
        fmt::join(missing, ", ")));
  }
  const std::vector<Bytes> values = store.multi_get(keys);
  StaticWorkers table;
  std::map<std::string, std::vector<int>> ranks_of;
  for (int r = 0; r < self.world_size; ++r) {
    table.workers_.push_back(WorkerInfo{to_string(values[r]), r});
    ranks_of[table.workers_.back().name].push_back(r);
  }
  std::vector<std::string> duplicates;
  for (const auto& [worker_name, ranks] : ranks_of) {
    if (ranks.size() > 1) {
      duplicates.push_back(
          fmt::format("\"{}\" is used by ranks {}", worker_name, and_list(ranks)));
    }
  }
  if (!duplicates.empty()) {
    throw DuplicateNameError(
        fmt::format("rpc worker names must be unique: {}", fmt::join(duplicates, "; ")));
  }
  for (const auto& w : table.workers_) table.ranks_by_name_.emplace(w.name, w.id);
  return table;
}

std::vector<std::string> StaticWorkers::names() const {
  std::vector<std::string> names;
  names.reserve(workers_.size());
  for (const WorkerInfo& w : workers_) names.push_back(w.name);
  return names;
}

int StaticWorkers::find(const WorkerInfo& to) const {
  if (to.id >= 0 && to.id < size() && workers_[to.id].name == to.name) return to.id;
  return -1;
}

WorkerInfo StaticWorkers::worker(const std::string& worker_name) const {
  auto it = ranks_by_name_.find(worker_name);
  if (it == ranks_by_name_.end()) {
    std::vector<std::string> quoted;
    for (const auto& w : workers_) quoted.push_back(fmt::format("\"{}\"", w.name));
    throw NotFoundError(fmt::format("no rpc worker named \"{}\" (workers: {})",
                                    worker_name, fmt::join(quoted, ", ")));
  }
  return workers_[it->second];
}

WorkerInfo StaticWorkers::worker(int id) const {
  if (id < 0 || id >= size()) {
    throw NotFoundError(
        fmt::format("no rpc worker with id {} (ids 0 to {})", id, size() - 1));
  }
  return workers_[id];
}

std::exception_ptr StaticWorkers::check_request(
    int dst, const WorkerInfo& to, const Message& request,
    std::chrono::milliseconds timeout,
    const std::function<std::optional<std::string>()>& more) const {
  if (dst < 0) {
    return std::make_exception_ptr(NotFoundError(fmt::format(
        "rpc to \"{}\" (id {}) function \"{}\": no such worker in this group of {}",
        to.name, to.id, request.function, size())));
  }
  std::optional<std::string> problem;
  if (request.type != MessageType::kRequest) {
    problem = fmt::format("send() takes requests, got message type {}",
                          static_cast<int>(request.type));
  } else if (timeout.count() < 0) {
    problem = fmt::format("negative timeout {} ms", timeout.count());
  } else if (more) {
    problem = more();
  }
  if (!problem) return nullptr;
  return std::make_exception_ptr(std::invalid_argument(
      fmt::format("{}: {}", call_prefix(name(dst), request.function), *problem)));
}

}  // namespace switchboard::rpc::backend
