// HashStore: an in-process Store backed by a hash map.
//
// What it is for: ranks running as threads of one process (tests, the
// collective conformance suite) rendezvous through one shared HashStore.
//
// Thread safety: every method is thread-safe; blocked get()/wait() calls are
// woken by the set/add/compare_set/append that creates their keys.
// Ownership: the store owns copies of all keys and values.
#pragma once

#include <string>
#include <unordered_map>

#include "common/mutex.h"
#include "store/store.h"

namespace switchboard {

class HashStore : public Store {
 public:
  HashStore() = default;

  using Store::set;
  using Store::wait;

  void set(const std::string& key, const Bytes& value) override SB_EXCLUDES(mutex_);
  Bytes get(const std::string& key) override SB_EXCLUDES(mutex_);
  int64_t add(const std::string& key, int64_t delta) override SB_EXCLUDES(mutex_);
  Bytes compare_set(const std::string& key, const Bytes& expected,
                    const Bytes& desired) override SB_EXCLUDES(mutex_);
  void wait(const std::vector<std::string>& keys, Timeout timeout) override
      SB_EXCLUDES(mutex_);
  bool check(const std::vector<std::string>& keys) override SB_EXCLUDES(mutex_);
  bool delete_key(const std::string& key) override SB_EXCLUDES(mutex_);
  int64_t num_keys() override SB_EXCLUDES(mutex_);
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys) override
      SB_EXCLUDES(mutex_);
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<Bytes>& values) override SB_EXCLUDES(mutex_);
  void append(const std::string& key, const Bytes& value) override SB_EXCLUDES(mutex_);

 private:
  // Blocks until every key exists (mutex_ is released while waiting).
  void wait_locked(const std::vector<std::string>& keys, Timeout timeout, const char* op)
      SB_REQUIRES(mutex_);

  Mutex mutex_;
  CondVar changed_;  // signalled on writes
  std::unordered_map<std::string, Bytes> map_ SB_GUARDED_BY(mutex_);
};

}  // namespace switchboard
