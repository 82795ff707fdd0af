#include "core/device_block_cache.h"

#include <algorithm>
#include <exception>
#include <optional>
#include <utility>
#include <vector>

#include "common/error.h"

namespace switchboard {

namespace {

// Small requests round up to this, so that blocks of nearby sizes are
// interchangeable.
constexpr size_t kGranule = 512;

}  // namespace

std::shared_ptr<DeviceBlockCache> DeviceBlockCache::create(Runtime runtime,
                                                           size_t max_cached_bytes) {
  return std::shared_ptr<DeviceBlockCache>(
      new DeviceBlockCache(std::move(runtime), max_cached_bytes));
}

DeviceBlockCache::DeviceBlockCache(Runtime runtime, size_t max_cached_bytes)
    : runtime_(std::move(runtime)), max_cached_bytes_(max_cached_bytes) {}

DeviceBlockCache::~DeviceBlockCache() {
  std::map<int, BlockPool<Block>> all;
  {
    MutexLock lock(mu_);
    all.swap(free_);
  }
  for (auto& [device, pool] : all) {
    for (const Block& b : pool.take_all()) drop(device, b);
  }
}

void DeviceBlockCache::drop(int device, const Block& block) {
  if (block.mark != nullptr) runtime_.wait_and_forget(device, block.mark);
  runtime_.free(device, block.data);
}

std::shared_ptr<void> DeviceBlockCache::allocate(int device, size_t bytes) {
  const size_t wanted = std::max(kGranule, (bytes + kGranule - 1) / kGranule * kGranule);
  Block block;
  {
    MutexLock lock(mu_);
    if (std::optional<Block> cached = pool(device).take(wanted)) {
      block = *cached;
      ++reuses_;
    }
  }
  if (block.data != nullptr) {
    if (block.mark != nullptr) runtime_.wait_and_forget(device, block.mark);
    block.mark = nullptr;
  } else {
    block.capacity = wanted;
    try {
      block.data = runtime_.allocate(device, wanted);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kResourceExhausted) throw;
      release_cached(device);  // what is cached may be what is missing
      block.data = runtime_.allocate(device, wanted);
    }
  }
  std::weak_ptr<DeviceBlockCache> weak = weak_from_this();
  return std::shared_ptr<void>(block.data,
                               [weak, device, block, free = runtime_.free](void*) {
                                 if (auto cache = weak.lock()) {
                                   cache->give_back(device, block);
                                 } else {
                                   free(device, block.data);  // the cache went first
                                 }
                               });
}

void DeviceBlockCache::give_back(int device, Block block) {
  block.mark = runtime_.mark(device);
  std::vector<Block> evicted;
  {
    MutexLock lock(mu_);
    evicted = pool(device).put(block);
  }
  for (const Block& b : evicted) drop(device, b);
}

void DeviceBlockCache::release_cached(int device) {
  std::deque<Block> blocks;
  {
    MutexLock lock(mu_);
    blocks = pool(device).take_all();
  }
  for (const Block& b : blocks) drop(device, b);
}

BlockPool<DeviceBlockCache::Block>& DeviceBlockCache::pool(int device) {
  return free_.try_emplace(device, max_cached_bytes_).first->second;
}

size_t DeviceBlockCache::cached_bytes(int device) const {
  MutexLock lock(mu_);
  auto it = free_.find(device);
  return it == free_.end() ? 0 : it->second.cached_bytes();
}

size_t DeviceBlockCache::reuses() const {
  MutexLock lock(mu_);
  return reuses_;
}

}  // namespace switchboard
