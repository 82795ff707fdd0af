#include "core/host_buffer_cache.h"

#include <algorithm>
#include <cstdlib>
#include <new>
#include <optional>
#include <utility>
#include <vector>

namespace switchboard {

namespace {

// Whole pages: what page-locking (cudaHostRegister) works on.
constexpr size_t kAlignment = 4096;

size_t round_up(size_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

}  // namespace

std::shared_ptr<HostBufferCache> HostBufferCache::create(size_t max_cached_bytes,
                                                         size_t min_bytes) {
  return std::shared_ptr<HostBufferCache>(
      new HostBufferCache(max_cached_bytes, min_bytes));
}

HostBufferCache::HostBufferCache(size_t max_cached_bytes, size_t min_bytes)
    : min_bytes_(std::max<size_t>(min_bytes, 1)), free_(max_cached_bytes) {}

HostBufferCache::~HostBufferCache() {
  std::deque<Buffer> all;
  {
    MutexLock lock(mu_);
    all = free_.take_all();
  }
  for (const Buffer& b : all) release(b);
}

void HostBufferCache::release(const Buffer& buffer) {
  if (buffer.pinned) {
    if (HostPinner pinner = host_pinner(); pinner.unpin) pinner.unpin(buffer.data);
  }
  std::free(buffer.data);
}

Tensor HostBufferCache::empty(const Tensor::Shape& shape, DType dtype, bool pinned) {
  const size_t nbytes = static_cast<size_t>(Tensor::numel_of(shape)) * dtype_size(dtype);
  if (nbytes < min_bytes_ && !pinned) return Tensor::empty(shape, dtype);
  // What the buffer must hold: small pinned ones are all one size, so that
  // any of them serves any small tensor.
  const size_t want = pinned ? std::max(nbytes, kMinPinnedBytes) : nbytes;
  Buffer buffer{nullptr, 0};
  {
    MutexLock lock(mu_);
    // For a pinned one, a pinned buffer first.
    std::optional<Buffer> cached;
    if (pinned) cached = free_.take(want, [](const Buffer& b) { return b.pinned; });
    if (!cached) cached = free_.take(want);
    if (cached) {
      buffer = *cached;
      ++reuses_;
    }
  }
  if (buffer.data == nullptr) {
    buffer.capacity = round_up(std::max<size_t>(want, 1));  // never a 0-byte buffer
    buffer.data = std::aligned_alloc(kAlignment, buffer.capacity);
    if (buffer.data == nullptr) throw std::bad_alloc();
  }
  if (pinned && !buffer.pinned) {
    if (HostPinner pinner = host_pinner();
        pinner.pin && pinner.pin(buffer.data, buffer.capacity)) {
      buffer.pinned = true;
      MutexLock lock(mu_);
      ++pins_;
    }
  }
  std::weak_ptr<HostBufferCache> weak = weak_from_this();
  std::shared_ptr<void> owner(buffer.data, [weak, buffer](void*) {
    if (auto cache = weak.lock()) {
      cache->give_back(buffer);
    } else {
      release(buffer);
    }
  });
  return Tensor::from_blob(buffer.data, shape, dtype, Device::cpu(), std::move(owner));
}

void HostBufferCache::give_back(Buffer buffer) {
  std::vector<Buffer> evicted;  // freed outside the lock
  {
    MutexLock lock(mu_);
    evicted = free_.put(buffer);
  }
  for (const Buffer& b : evicted) release(b);
}

size_t HostBufferCache::cached_bytes() const {
  MutexLock lock(mu_);
  return free_.cached_bytes();
}

size_t HostBufferCache::reuses() const {
  MutexLock lock(mu_);
  return reuses_;
}

size_t HostBufferCache::pins() const {
  MutexLock lock(mu_);
  return pins_;
}

}  // namespace switchboard
