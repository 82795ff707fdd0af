#include "store/hash_store.h"

#include <fmt/format.h>

#include "common/error.h"
#include "store/call_bound.h"

namespace switchboard {
namespace {

std::vector<std::string> missing_keys(
    const std::unordered_map<std::string, Bytes>& map,
    const std::vector<std::string>& keys) {
  std::vector<std::string> missing;
  for (const auto& key : keys) {
    if (map.find(key) == map.end()) missing.push_back(key);
  }
  return missing;
}

}  // namespace

void HashStore::wait_locked(const std::vector<std::string>& keys, Timeout timeout,
                            const char* op) {
  timeout = StoreCallBound::bounded(timeout);
  auto ready = [&]() SB_REQUIRES(mutex_) { return missing_keys(map_, keys).empty(); };
  if (timeout == kNoTimeout) {
    changed_.wait(mutex_, ready);
    return;
  }
  if (!changed_.wait_for(mutex_, timeout, ready)) {
    throw TimeoutError(fmt::format("HashStore {}: keys {} still missing after {} ms",
                                   op, format_keys(missing_keys(map_, keys)),
                                   timeout.count()));
  }
}

void HashStore::set(const std::string& key, const Bytes& value) {
  {
    MutexLock lock(mutex_);
    map_[key] = value;
  }
  changed_.notify_all();
}

Bytes HashStore::get(const std::string& key) {
  MutexLock lock(mutex_);
  wait_locked({key}, timeout(), "get");
  return map_.at(key);
}

int64_t HashStore::add(const std::string& key, int64_t delta) {
  int64_t result = 0;
  {
    MutexLock lock(mutex_);
    auto it = map_.find(key);
    int64_t current = 0;
    if (it != map_.end() && !parse_store_integer(it->second, &current)) {
      throw Error(ErrorCode::kFailedPrecondition,
                  fmt::format("HashStore add(\"{}\", {}): value \"{}\" is not an integer",
                              key, delta, to_string(it->second)));
    }
    // Wraps on overflow, as PyTorch's TCPStore does.
    result = static_cast<int64_t>(static_cast<uint64_t>(current) +
                                  static_cast<uint64_t>(delta));
    map_[key] = to_bytes(std::to_string(result));
  }
  changed_.notify_all();
  return result;
}

Bytes HashStore::compare_set(const std::string& key, const Bytes& expected,
                             const Bytes& desired) {
  MutexLock lock(mutex_);
  auto it = map_.find(key);
  if (it == map_.end()) {
    if (!expected.empty()) return expected;
    map_.emplace(key, desired);
  } else if (it->second == expected) {
    it->second = desired;
  } else {
    return it->second;
  }
  lock.unlock();
  changed_.notify_all();
  return desired;
}

void HashStore::wait(const std::vector<std::string>& keys, Timeout timeout) {
  MutexLock lock(mutex_);
  wait_locked(keys, timeout, "wait");
}

bool HashStore::check(const std::vector<std::string>& keys) {
  MutexLock lock(mutex_);
  return missing_keys(map_, keys).empty();
}

bool HashStore::delete_key(const std::string& key) {
  MutexLock lock(mutex_);
  return map_.erase(key) > 0;
}

int64_t HashStore::num_keys() {
  MutexLock lock(mutex_);
  return static_cast<int64_t>(map_.size());
}

std::vector<Bytes> HashStore::multi_get(const std::vector<std::string>& keys) {
  MutexLock lock(mutex_);
  wait_locked(keys, timeout(), "multi_get");
  std::vector<Bytes> values;
  values.reserve(keys.size());
  for (const auto& key : keys) values.push_back(map_.at(key));
  return values;
}

void HashStore::multi_set(const std::vector<std::string>& keys,
                          const std::vector<Bytes>& values) {
  if (keys.size() != values.size()) {
    throw std::invalid_argument(fmt::format(
        "multi_set: {} keys but {} values", keys.size(), values.size()));
  }
  {
    MutexLock lock(mutex_);
    for (size_t i = 0; i < keys.size(); ++i) map_[keys[i]] = values[i];
  }
  changed_.notify_all();
}

void HashStore::append(const std::string& key, const Bytes& value) {
  {
    MutexLock lock(mutex_);
    Bytes& stored = map_[key];
    stored.insert(stored.end(), value.begin(), value.end());
  }
  changed_.notify_all();
}

}  // namespace switchboard
