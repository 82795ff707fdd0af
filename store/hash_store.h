// HashStore: an in-process Store backed by a hash map.
//
// What it is for: ranks running as threads of one process (tests, the
// collective conformance suite) rendezvous through one shared HashStore.
//
// Thread safety: every method is thread-safe; blocked get()/wait() calls are
// woken by the set/add/compare_set/append that creates their keys.
// Ownership: the store owns copies of all keys and values.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <unordered_map>

#include "store/store.h"

namespace switchboard {

class HashStore : public Store {
 public:
  HashStore() = default;

  using Store::set;
  using Store::wait;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected,
                    const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Timeout timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<Bytes>& values) override;
  void append(const std::string& key, const Bytes& value) override;

 private:
  // Blocks until every key exists; `lock` holds mutex_.
  void wait_locked(std::unique_lock<std::mutex>& lock,
                   const std::vector<std::string>& keys, Timeout timeout,
                   const char* op);

  std::mutex mutex_;
  std::condition_variable changed_;                   // signalled on writes
  std::unordered_map<std::string, Bytes> map_;        // GUARDED_BY(mutex_)
};

}  // namespace switchboard
