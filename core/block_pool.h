// BlockPool: the reuse and eviction policy of Switchboard's memory caches,
// HostBufferCache (CPU buffers) and DeviceBlockCache (CUDA blocks), over
// the blocks they keep. A Block is any value with a `size_t capacity`.
//
// Reuse: a request of `want` bytes takes the smallest cached block that
// holds it and is at most twice its size (so a small tensor never pins a
// large block), the most recently returned one among blocks of equal size
// (its pages are the likeliest to be warm).
// Eviction: at most `max_cached_bytes` are kept; a block returned to a full
// pool pushes out the oldest ones first, and a block larger than the whole
// bound is not kept at all.
//
// The pool only chooses: it hands back what to reuse and what to free, and
// its owner frees (outside its lock).
//
// Thread safety: none; the owner's lock guards the pool.
#pragma once

#include <cstddef>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

namespace switchboard {

template <typename Block>
class BlockPool {
 public:
  explicit BlockPool(size_t max_cached_bytes) : max_cached_bytes_(max_cached_bytes) {}

  // The block to reuse for `want` bytes among those `accept(block)` allows,
  // removed from the pool; nullopt when none fits.
  template <typename Accept>
  std::optional<Block> take(size_t want, Accept accept) {
    auto best = blocks_.end();
    // Newest first, so that the first of equal sizes found is the newest.
    for (auto it = blocks_.end(); it != blocks_.begin();) {
      --it;
      if (it->capacity >= want && it->capacity / 2 <= want && accept(*it) &&
          (best == blocks_.end() || it->capacity < best->capacity)) {
        best = it;
        if (it->capacity == want) break;  // none fits better
      }
    }
    if (best == blocks_.end()) return std::nullopt;
    Block block = std::move(*best);
    blocks_.erase(best);
    cached_ -= block.capacity;
    return block;
  }
  std::optional<Block> take(size_t want) {
    return take(want, [](const Block&) { return true; });
  }

  // Keeps `block` for reuse; returns what must be freed now (the oldest
  // blocks, or `block` itself when it alone exceeds the bound).
  std::vector<Block> put(Block block) {
    std::vector<Block> evicted;
    if (block.capacity > max_cached_bytes_) {
      evicted.push_back(std::move(block));
      return evicted;
    }
    while (cached_ + block.capacity > max_cached_bytes_ && !blocks_.empty()) {
      cached_ -= blocks_.front().capacity;
      evicted.push_back(std::move(blocks_.front()));
      blocks_.pop_front();
    }
    cached_ += block.capacity;
    blocks_.push_back(std::move(block));
    return evicted;
  }

  // Empties the pool; returns every block, oldest first.
  std::deque<Block> take_all() {
    cached_ = 0;
    return std::exchange(blocks_, {});
  }

  size_t cached_bytes() const { return cached_; }

 private:
  size_t max_cached_bytes_;
  std::deque<Block> blocks_;  // oldest first
  size_t cached_ = 0;
};

}  // namespace switchboard
