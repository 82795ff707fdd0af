// HostBufferCache: large buffers come back for reuse, small tensors bypass
// it, the bound evicts the oldest, and buffers outliving the cache are
// freed.
#include "core/host_buffer_cache.h"

#include <catch2/catch.hpp>
#include <thread>
#include <vector>

#include "core/tensor.h"

using switchboard::DType;
using switchboard::HostBufferCache;
using switchboard::Tensor;

namespace {
constexpr size_t kMiB = size_t{1} << 20;
}  // namespace

TEST_CASE("a freed large buffer is reused for the next tensor that fits",
          "[buffer_cache]") {
  auto cache = HostBufferCache::create(64 * kMiB, kMiB);
  void* first = nullptr;
  {
    Tensor t = cache->empty({1 << 20}, DType::kFloat32);  // 4 MiB
    CHECK(t.nbytes() == 4 * kMiB);
    CHECK(t.is_contiguous());
    CHECK(reinterpret_cast<uintptr_t>(t.data()) % 4096 == 0);  // whole pages, for pinning
    first = t.data();
    CHECK(cache->cached_bytes() == 0);
  }
  CHECK(cache->cached_bytes() == 4 * kMiB);
  // A 3 MiB tensor fits in the 4 MiB buffer (at least half of it).
  Tensor again = cache->empty({3 << 20}, DType::kUInt8);
  CHECK(again.data() == first);
  CHECK(cache->reuses() == 1);
  CHECK(cache->cached_bytes() == 0);
  // Every byte is writable.
  auto bytes = again.span<uint8_t>();
  bytes[0] = 1;
  bytes[bytes.size() - 1] = 2;
}

TEST_CASE("a buffer much larger than the request, or too small, is not used",
          "[buffer_cache]") {
  auto cache = HostBufferCache::create(64 * kMiB, kMiB);
  { Tensor big = cache->empty({16 * kMiB}, DType::kUInt8); }
  Tensor small = cache->empty({2 * kMiB}, DType::kUInt8);  // under half of 16 MiB
  CHECK(cache->reuses() == 0);
  Tensor large = cache->empty({32 * kMiB}, DType::kUInt8);  // over 16 MiB
  CHECK(cache->reuses() == 0);
  CHECK(cache->cached_bytes() == 16 * kMiB);
}

TEST_CASE("tensors under the minimum bypass the cache", "[buffer_cache]") {
  auto cache = HostBufferCache::create(64 * kMiB, kMiB);
  { Tensor t = cache->empty({100}, DType::kFloat64); }
  CHECK(cache->cached_bytes() == 0);
  Tensor empty = cache->empty({0}, DType::kFloat32);
  CHECK(empty.numel() == 0);
  CHECK(cache->cached_bytes() == 0);
}

TEST_CASE("the cache keeps at most its bound, evicting the oldest", "[buffer_cache]") {
  auto cache = HostBufferCache::create(8 * kMiB, kMiB);
  std::vector<Tensor> held;
  for (int i = 0; i < 4; ++i) held.push_back(cache->empty({3 * kMiB}, DType::kUInt8));
  const void* newest = held.back().data();
  held.clear();  // 4 x 3 MiB freed, oldest first; only two fit in 8 MiB
  CHECK(cache->cached_bytes() == 6 * kMiB);
  // The most recent one is handed out first.
  Tensor t = cache->empty({3 * kMiB}, DType::kUInt8);
  CHECK(t.data() == newest);
  // A buffer over the bound is never kept.
  { Tensor huge = cache->empty({9 * kMiB}, DType::kUInt8); }
  CHECK(cache->cached_bytes() == 3 * kMiB);
}

TEST_CASE("a tensor that outlives its cache frees its buffer", "[buffer_cache]") {
  Tensor survivor;
  {
    auto cache = HostBufferCache::create(64 * kMiB, kMiB);
    { Tensor cached = cache->empty({2 * kMiB}, DType::kUInt8); }
    survivor = cache->empty({4 * kMiB}, DType::kUInt8);
  }
  survivor.span<uint8_t>()[0] = 7;  // still valid
  survivor = Tensor();              // freed (ASan/valgrind would see a leak otherwise)
  SUCCEED();
}

TEST_CASE("threads taking and freeing buffers concurrently", "[buffer_cache]") {
  auto cache = HostBufferCache::create(32 * kMiB, kMiB);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      for (int round = 0; round < 50; ++round) {
        Tensor t = cache->empty({static_cast<int64_t>((1 + (round + i) % 4) * kMiB)},
                                DType::kUInt8);
        auto bytes = t.span<uint8_t>();
        bytes[0] = static_cast<uint8_t>(i);
        REQUIRE(bytes[0] == static_cast<uint8_t>(i));
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(cache->cached_bytes() <= 32 * kMiB);
  CHECK(cache->reuses() > 0);
}

TEST_CASE(
    "a pinned buffer is pinned once, stays pinned while cached, and is unpinned when it "
    "goes back to the system",
    "[buffer_cache]") {
  int pinned = 0;
  int unpinned = 0;
  switchboard::set_host_pinner({[&](void*, size_t) {
                                  ++pinned;
                                  return true;
                                },
                                [&](void*) { ++unpinned; }});
  {
    auto cache = HostBufferCache::create(8 * kMiB);
    void* first = nullptr;
    {
      Tensor t =
          cache->empty({2 * static_cast<int64_t>(kMiB)}, DType::kUInt8, /*pinned=*/true);
      first = t.data();
    }
    CHECK(pinned == 1);
    CHECK(cache->pins() == 1);
    {
      // Reused, already pinned.
      Tensor t =
          cache->empty({2 * static_cast<int64_t>(kMiB)}, DType::kUInt8, /*pinned=*/true);
      CHECK(t.data() == first);
    }
    CHECK(pinned == 1);
    // An unpinned request may take the pinned buffer (it is a buffer all the
    // same); a pinned request takes a pinned one before an unpinned one.
    {
      Tensor unpinned_buffer =
          cache->empty({3 * static_cast<int64_t>(kMiB)}, DType::kUInt8);
    }
    {
      Tensor t =
          cache->empty({2 * static_cast<int64_t>(kMiB)}, DType::kUInt8, /*pinned=*/true);
      CHECK(t.data() == first);
    }
    CHECK(pinned == 1);
    CHECK(unpinned == 0);
    // Evicted past the bound: unpinned before it is freed.
    { Tensor big = cache->empty({7 * static_cast<int64_t>(kMiB)}, DType::kUInt8); }
    CHECK(unpinned == 1);
  }
  // A pinner that cannot pin leaves an ordinary buffer.
  switchboard::set_host_pinner(
      {[&](void*, size_t) { return false; }, [&](void*) { ++unpinned; }});
  {
    auto cache = HostBufferCache::create();
    {
      Tensor t =
          cache->empty({static_cast<int64_t>(kMiB)}, DType::kUInt8, /*pinned=*/true);
    }
    CHECK(cache->pins() == 0);
  }
  CHECK(unpinned == 1);
  switchboard::set_host_pinner({});
}

TEST_CASE(
    "a pinned buffer below min_bytes is cached all the same, so that it is pinned once "
    "and reused",
    "[buffer_cache]") {
  int pinned = 0;
  switchboard::set_host_pinner({[&](void*, size_t) {
                                  ++pinned;
                                  return true;
                                },
                                [&](void*) {}});
  {
    auto cache = HostBufferCache::create(8 * kMiB);
    void* first = nullptr;
    {
      Tensor t = cache->empty({32 << 10}, DType::kUInt8, /*pinned=*/true);
      first = t.data();
      CHECK(reinterpret_cast<uintptr_t>(first) % 4096 == 0);
    }
    CHECK(cache->cached_bytes() == 32 << 10);
    for (int i = 0; i < 3; ++i) {
      Tensor again = cache->empty({32 << 10}, DType::kUInt8, /*pinned=*/true);
      CHECK(again.data() == first);
    }
    CHECK(pinned == 1);
    CHECK(cache->reuses() == 3);
    static_assert(HostBufferCache::kMinPinnedBytes == 32 << 10);
    // An empty pinned tensor is a real (one-page) buffer too.
    CHECK(cache->empty({0}, DType::kUInt8, /*pinned=*/true).nbytes() == 0);
    // Any small pinned request takes the same buffer (all are kMinPinnedBytes).
    for (int64_t n : {int64_t{1}, int64_t{4096}, int64_t{20000}}) {
      CHECK(cache->empty({n}, DType::kUInt8, /*pinned=*/true).data() == first);
    }
    CHECK(pinned == 1);
    // Unpinned requests below min_bytes are still not cached.
    const size_t before = cache->cached_bytes();
    { Tensor small = cache->empty({4096}, DType::kUInt8); }
    CHECK(cache->cached_bytes() == before);
  }
  switchboard::set_host_pinner({});
}
