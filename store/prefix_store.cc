#include "store/prefix_store.h"

#include <stdexcept>

namespace switchboard {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> store)
    : prefix_(std::move(prefix)), store_(std::move(store)) {
  if (!store_) throw std::invalid_argument("PrefixStore: underlying store is null");
  Store::set_timeout(store_->timeout());
}

std::vector<std::string> PrefixStore::join(const std::vector<std::string>& keys) const {
  std::vector<std::string> joined;
  joined.reserve(keys.size());
  for (const auto& key : keys) joined.push_back(join(key));
  return joined;
}

void PrefixStore::set(const std::string& key, const Bytes& value) {
  store_->set(join(key), value);
}

Bytes PrefixStore::get(const std::string& key) { return store_->get(join(key)); }

int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return store_->add(join(key), delta);
}

Bytes PrefixStore::compare_set(const std::string& key, const Bytes& expected,
                               const Bytes& desired) {
  return store_->compare_set(join(key), expected, desired);
}

void PrefixStore::wait(const std::vector<std::string>& keys, Timeout timeout) {
  store_->wait(join(keys), timeout);
}

bool PrefixStore::check(const std::vector<std::string>& keys) {
  return store_->check(join(keys));
}

bool PrefixStore::delete_key(const std::string& key) {
  return store_->delete_key(join(key));
}

int64_t PrefixStore::num_keys() { return store_->num_keys(); }

std::vector<Bytes> PrefixStore::multi_get(const std::vector<std::string>& keys) {
  return store_->multi_get(join(keys));
}

void PrefixStore::multi_set(const std::vector<std::string>& keys,
                            const std::vector<Bytes>& values) {
  store_->multi_set(join(keys), values);
}

void PrefixStore::append(const std::string& key, const Bytes& value) {
  store_->append(join(key), value);
}

void PrefixStore::set_timeout(Timeout timeout) {
  Store::set_timeout(timeout);
  store_->set_timeout(timeout);
}

}  // namespace switchboard
