#include "core/device_block_cache.h"

#include <algorithm>
#include <exception>
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
  std::map<int, std::deque<Block>> all;
  {
    MutexLock lock(mu_);
    all.swap(free_);
  }
  for (const auto& [device, blocks] : all) {
    for (const Block& b : blocks) drop(device, b);
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
    std::deque<Block>& blocks = free_[device];
    // The smallest block that fits (and is no more than twice the size).
    auto best = blocks.end();
    for (auto it = blocks.begin(); it != blocks.end(); ++it) {
      if (it->capacity >= wanted && it->capacity / 2 <= wanted &&
          (best == blocks.end() || it->capacity < best->capacity)) {
        best = it;
      }
    }
    if (best != blocks.end()) {
      block = *best;
      blocks.erase(best);
      cached_[device] -= block.capacity;
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
    std::deque<Block>& blocks = free_[device];
    size_t& cached = cached_[device];
    if (block.capacity > max_cached_bytes_) {
      evicted.push_back(block);
    } else {
      while (cached + block.capacity > max_cached_bytes_ && !blocks.empty()) {
        evicted.push_back(blocks.front());
        cached -= blocks.front().capacity;
        blocks.pop_front();
      }
      blocks.push_back(block);
      cached += block.capacity;
    }
  }
  for (const Block& b : evicted) drop(device, b);
}

void DeviceBlockCache::release_cached(int device) {
  std::deque<Block> blocks;
  {
    MutexLock lock(mu_);
    blocks.swap(free_[device]);
    cached_[device] = 0;
  }
  for (const Block& b : blocks) drop(device, b);
}

size_t DeviceBlockCache::cached_bytes(int device) const {
  MutexLock lock(mu_);
  auto it = cached_.find(device);
  return it == cached_.end() ? 0 : it->second;
}

size_t DeviceBlockCache::reuses() const {
  MutexLock lock(mu_);
  return reuses_;
}

}  // namespace switchboard
