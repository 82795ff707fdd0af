// DeviceBlockCache: device memory kept after its tensors went, for the next
// tensor of about the same size, so that a steady stream of CUDA tensors
// (received, staged, copied) does not pay a cudaMalloc and a cudaFree (which
// waits for the whole device) per tensor. What PyTorch's caching allocator
// does, reduced to what Switchboard's tensors need.
//
// A freed block is marked with the point the device's work had reached
// (an event recorded on the device's default stream) and kept; the next
// allocation on that device that it fits waits for that point and takes
// it. So work
// queued on the default stream (or a blocking stream) before the free
// never sees its memory reused under it; work on non-blocking streams is
// the user's to finish before the tensor goes, as with cudaFree.
// Which block is reused, and which go back when more than
// `max_cached_bytes` per device are kept, is BlockPool's rule
// (core/block_pool.h); an allocation the runtime refuses for want of memory
// gives back every cached block of that device and tries once more.
//
// No CUDA here: the runtime's calls are injected (core/cuda_allocator.cc
// passes CUDA's; tests pass fakes).
//
// Ownership: a block's owner (the shared_ptr allocate() returns) keeps the
// cache alive only weakly; a block freed after the cache went goes back to
// the runtime at once.
// Thread safety: every member function is thread-safe.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <memory>

#include "common/mutex.h"
#include "core/block_pool.h"

namespace switchboard {

class DeviceBlockCache : public std::enable_shared_from_this<DeviceBlockCache> {
 public:
  struct Runtime {
    // Allocates `bytes` on `device`; throws (an Error with kResourceExhausted
    // for out-of-memory).
    std::function<void*(int device, size_t bytes)> allocate;
    // Frees what allocate() returned. Must not throw.
    std::function<void(int device, void* data)> free;
    // The point the device's queued work has reached now (an event); null
    // when it cannot say (then reuse waits for nothing). Must not throw.
    std::function<void*(int device)> mark;
    // Waits until `mark` passed, then forgets it. Must not throw.
    std::function<void(int device, void* mark)> wait_and_forget;
  };

  static constexpr size_t kDefaultMaxCachedBytes = size_t{2} << 30;  // per device

  static std::shared_ptr<DeviceBlockCache> create(
      Runtime runtime, size_t max_cached_bytes = kDefaultMaxCachedBytes);
  ~DeviceBlockCache();
  DeviceBlockCache(const DeviceBlockCache&) = delete;
  DeviceBlockCache& operator=(const DeviceBlockCache&) = delete;

  // `bytes` on `device` (the pointer is the owner's get()); a cached block
  // when one fits. Throws what Runtime::allocate throws.
  std::shared_ptr<void> allocate(int device, size_t bytes) SB_EXCLUDES(mu_);

  // Gives every cached block of `device` back to the runtime.
  void release_cached(int device) SB_EXCLUDES(mu_);

  size_t cached_bytes(int device) const SB_EXCLUDES(mu_);
  size_t reuses() const SB_EXCLUDES(mu_);

 private:
  struct Block {
    void* data = nullptr;
    size_t capacity = 0;
    void* mark = nullptr;  // the device's work when it was freed
  };

  DeviceBlockCache(Runtime runtime, size_t max_cached_bytes);
  void give_back(int device, Block block) SB_EXCLUDES(mu_);
  void drop(int device, const Block& block);  // to the runtime, not under mu_

  // The device's pool, made on first use.
  BlockPool<Block>& pool(int device) SB_REQUIRES(mu_);

  const Runtime runtime_;
  const size_t max_cached_bytes_;
  mutable Mutex mu_;
  std::map<int, BlockPool<Block>> free_ SB_GUARDED_BY(mu_);  // by device
  size_t reuses_ SB_GUARDED_BY(mu_) = 0;
};

}  // namespace switchboard
