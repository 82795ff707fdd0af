// HostBufferCache: recently freed large CPU buffers, kept for the next
// tensor of about the same size.
//
// A received tensor needs fresh memory; for a large one, malloc maps new
// pages from the kernel and every first touch faults one in (and the kernel
// zeroes it), which costs as much as copying the bytes again. The PIPE agent
// allocates received tensors of at least `min_bytes` through this cache:
// when the last Tensor over such a buffer goes away, the buffer comes back
// here instead of going back to the kernel, and the next tensor that fits
// takes it. Which buffer is reused, and which go when more than
// `max_cached_bytes` are kept, is BlockPool's rule (core/block_pool.h).
//
// Contents of a reused buffer are whatever it held before: callers overwrite
// it (the frame reader fills every byte).
//
// Pinned buffers: a tensor that will be copied to or from a CUDA device
// (staged on its way) asks for one; the buffer is page-locked once with the
// registered HostPinner (core/tensor.h: cudaHostRegister), stays pinned
// while cached, and is unpinned when it goes back to the system. Copies
// from and to it run at the bus's speed instead of through the driver's
// own bounce buffers. Without a pinner (no CUDA linked) it is an ordinary
// buffer.
//
// Ownership: tensors keep the cache alive only weakly; a buffer freed after
// the cache is gone returns to the system.
//
// Thread safety: every member function is thread-safe.
#pragma once

#include <cstddef>
#include <deque>
#include <memory>

#include "common/mutex.h"
#include "core/block_pool.h"
#include "core/tensor.h"

namespace switchboard {

class HostBufferCache : public std::enable_shared_from_this<HostBufferCache> {
 public:
  static constexpr size_t kDefaultMinBytes = size_t{1} << 20;
  static constexpr size_t kDefaultMaxCachedBytes = size_t{256} << 20;
  static constexpr size_t kMinPinnedBytes = size_t{32} << 10;

  static std::shared_ptr<HostBufferCache> create(
      size_t max_cached_bytes = kDefaultMaxCachedBytes,
      size_t min_bytes = kDefaultMinBytes);
  ~HostBufferCache();
  HostBufferCache(const HostBufferCache&) = delete;
  HostBufferCache& operator=(const HostBufferCache&) = delete;

  // A contiguous CPU tensor of `shape` and `dtype`. Below min_bytes it is
  // Tensor::empty's; at or above, its storage is a cached buffer when one
  // fits, else a new one (page-aligned, a whole number of pages) that
  // returns here when freed.
  // Throws what Tensor::empty throws (std::invalid_argument for a bad
  // shape, std::bad_alloc).
  // With `pinned`, the buffer is pinned (see above) when it can be, and is
  // a cached one whatever its size, of at least kMinPinnedBytes: pinning
  // costs far more than a copy of a small tensor, so a pinned buffer is
  // kept once made, and any small one serves any small tensor.
  Tensor empty(const Tensor::Shape& shape, DType dtype, bool pinned = false)
      SB_EXCLUDES(mu_);

  // Bytes held for reuse now, and how many tensors took a cached buffer.
  size_t cached_bytes() const SB_EXCLUDES(mu_);
  size_t reuses() const SB_EXCLUDES(mu_);
  // How many buffers were pinned so far.
  size_t pins() const SB_EXCLUDES(mu_);

 private:
  struct Buffer {
    void* data;
    size_t capacity;
    bool pinned = false;
  };
  // Unpins (when pinned) and frees; not under mu_.
  static void release(const Buffer& buffer);

  HostBufferCache(size_t max_cached_bytes, size_t min_bytes);
  void give_back(Buffer buffer) SB_EXCLUDES(mu_);

  const size_t min_bytes_;
  mutable Mutex mu_;
  BlockPool<Buffer> free_ SB_GUARDED_BY(mu_);
  size_t reuses_ SB_GUARDED_BY(mu_) = 0;
  size_t pins_ SB_GUARDED_BY(mu_) = 0;
};

}  // namespace switchboard
