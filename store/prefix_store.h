// PrefixStore: a namespace over another store. Every key `k` is stored in
// the underlying store as "<prefix>/k", so several groups can share one
// store without their keys colliding (c10d's PrefixStore does the same).
//
// Thread safety: as thread-safe as the underlying store (all of ours are).
// Ownership: shares ownership of the underlying store.
// Timeouts: set_timeout() sets the underlying store's timeout.
#pragma once

#include <memory>
#include <string>

#include "store/store.h"

namespace switchboard {

class PrefixStore : public Store {
 public:
  // Throws std::invalid_argument when `store` is null.
  PrefixStore(std::string prefix, std::shared_ptr<Store> store);

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
  // Counts the keys of the whole underlying store, as c10d's does.
  int64_t num_keys() override;
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<Bytes>& values) override;
  void append(const std::string& key, const Bytes& value) override;
  void set_timeout(Timeout timeout) override;
  // The wrapped store's.
  std::shared_ptr<const StoreMetrics> metrics() const override { return store_->metrics(); }

  const std::shared_ptr<Store>& underlying_store() const { return store_; }

 private:
  std::string join(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> join(const std::vector<std::string>& keys) const;

  const std::string prefix_;
  const std::shared_ptr<Store> store_;
};

}  // namespace switchboard
