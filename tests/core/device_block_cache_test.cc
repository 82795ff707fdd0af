// DeviceBlockCache (core/device_block_cache.h) over a fake runtime that
// hands out host memory and records every call: a freed block comes back
// for the next allocation it fits, only after the device's work at its free
// is done; the bound evicts the oldest; an allocation refused for want of
// memory gives the cached blocks back and tries again; a block outliving
// its cache goes back to the runtime.
#include "core/device_block_cache.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <map>
#include <memory>
#include <vector>

#include "common/error.h"

using switchboard::DeviceBlockCache;
using switchboard::Error;
using switchboard::ErrorCode;

namespace {

constexpr size_t kMiB = size_t{1} << 20;

// Host memory posing as device memory; marks are counters.
struct FakeRuntime {
  int allocations = 0;
  std::map<void*, size_t> live;  // with their sizes
  size_t capacity = SIZE_MAX;    // the device's memory: more is refused (OOM)
  std::vector<void*> freed;
  std::vector<uintptr_t> waited;  // marks waited for, in order
  uintptr_t next_mark = 1;

  DeviceBlockCache::Runtime runtime() {
    DeviceBlockCache::Runtime r;
    r.allocate = [this](int, size_t bytes) -> void* {
      size_t used = 0;
      for (const auto& [p, n] : live) used += n;
      if (used + bytes > capacity)
        throw Error(ErrorCode::kResourceExhausted, "fake out of memory");
      ++allocations;
      void* p = std::malloc(bytes);
      live[p] = bytes;
      return p;
    };
    r.free = [this](int, void* p) {
      live.erase(p);
      freed.push_back(p);
      std::free(p);
    };
    r.mark = [this](int) { return reinterpret_cast<void*>(next_mark++); };
    r.wait_and_forget = [this](int, void* mark) {
      waited.push_back(reinterpret_cast<uintptr_t>(mark));
    };
    return r;
  }
};

}  // namespace

TEST_CASE(
    "a freed block is reused for the next allocation it fits, once the work at its free "
    "is done",
    "[device_block_cache]") {
  FakeRuntime fake;
  auto cache = DeviceBlockCache::create(fake.runtime());
  void* first = nullptr;
  {
    std::shared_ptr<void> a = cache->allocate(0, 3 * kMiB);
    first = a.get();
  }
  CHECK(cache->cached_bytes(0) == 3 * kMiB);
  CHECK(fake.waited.empty());
  std::shared_ptr<void> b = cache->allocate(0, 2 * kMiB);  // at least half of 3 MiB
  CHECK(b.get() == first);
  CHECK(fake.allocations == 1);
  CHECK(cache->reuses() == 1);
  CHECK(fake.waited == std::vector<uintptr_t>{1});  // the mark made at the free
  // Another device, or a request under half the block, takes a new one.
  b.reset();
  std::shared_ptr<void> other_device = cache->allocate(1, 3 * kMiB);
  std::shared_ptr<void> small = cache->allocate(0, kMiB);
  CHECK(other_device.get() != first);
  CHECK(small.get() != first);
  CHECK(fake.allocations == 3);
}

TEST_CASE("the cache keeps at most its bound per device, giving the oldest back",
          "[device_block_cache]") {
  FakeRuntime fake;
  auto cache = DeviceBlockCache::create(fake.runtime(), 4 * kMiB);
  std::shared_ptr<void> a = cache->allocate(0, 2 * kMiB);
  std::shared_ptr<void> b = cache->allocate(0, 2 * kMiB);
  void* const a_data = a.get();
  void* const b_data = b.get();
  a.reset();  // the oldest
  b.reset();
  CHECK(cache->cached_bytes(0) == 4 * kMiB);
  cache->allocate(0, 3 * kMiB).reset();  // fits neither: a new block, then kept
  CHECK(cache->cached_bytes(0) == 3 * kMiB);
  CHECK(fake.freed == std::vector<void*>{a_data, b_data});
  // Each was given back only once the device's work at its free was done.
  CHECK(fake.waited == std::vector<uintptr_t>{1, 2});
  // A block larger than the bound is never kept.
  cache->allocate(0, 5 * kMiB).reset();
  CHECK(cache->cached_bytes(0) == 3 * kMiB);
  CHECK(fake.live.size() == 1);
}

TEST_CASE(
    "an allocation refused for want of memory gives the cached blocks back and tries "
    "again",
    "[device_block_cache]") {
  FakeRuntime fake;
  fake.capacity = 40 * kMiB;
  auto cache = DeviceBlockCache::create(fake.runtime());
  cache->allocate(0, kMiB).reset();
  cache->allocate(0, 8 * kMiB).reset();
  CHECK(cache->cached_bytes(0) == 9 * kMiB);
  // 32 MiB do not fit beside the 9 cached: they are given back, and then do.
  std::shared_ptr<void> big = cache->allocate(0, 32 * kMiB);
  CHECK(big != nullptr);
  CHECK(cache->cached_bytes(0) == 0);
  CHECK(fake.live.size() == 1);
  // More than the device has: refused again, and the error reaches the caller.
  CHECK_THROWS_AS(cache->allocate(0, 48 * kMiB), Error);
}

TEST_CASE("a block that outlives its cache goes back to the runtime",
          "[device_block_cache]") {
  FakeRuntime fake;
  auto cache = DeviceBlockCache::create(fake.runtime());
  std::shared_ptr<void> block = cache->allocate(0, kMiB);
  cache->allocate(0, 4 * kMiB).reset();  // cached
  cache.reset();                         // frees the cached block
  CHECK(fake.live.size() == 1);
  block.reset();
  CHECK(fake.live.empty());
}
