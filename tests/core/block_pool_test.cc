// BlockPool: which cached block a request takes, and which blocks a full
// pool gives up.
#include "core/block_pool.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

using switchboard::BlockPool;

namespace {

struct Block {
  size_t capacity = 0;
  std::string tag;
};

std::vector<std::string> tags(const std::vector<Block>& blocks) {
  std::vector<std::string> out;
  for (const Block& b : blocks) out.push_back(b.tag);
  return out;
}

}  // namespace

TEST_CASE("a request takes the smallest block that holds it", "[block_pool]") {
  BlockPool<Block> pool(1000);
  REQUIRE(pool.put({400, "a"}).empty());
  REQUIRE(pool.put({200, "b"}).empty());
  REQUIRE(pool.put({300, "c"}).empty());
  CHECK(pool.cached_bytes() == 900);
  auto got = pool.take(150);
  REQUIRE(got);
  CHECK(got->tag == "b");
  CHECK(pool.cached_bytes() == 700);
  got = pool.take(250);
  REQUIRE(got);
  CHECK(got->tag == "c");
  CHECK(pool.cached_bytes() == 400);
}

TEST_CASE("no block of more than twice the request is taken", "[block_pool]") {
  BlockPool<Block> pool(1000);
  (void)pool.put({400, "a"});
  CHECK_FALSE(pool.take(199));
  CHECK_FALSE(pool.take(401));
  auto got = pool.take(200);
  REQUIRE(got);
  CHECK(got->tag == "a");
  CHECK(pool.cached_bytes() == 0);
}

TEST_CASE("of equal sizes, the most recently returned block is taken", "[block_pool]") {
  BlockPool<Block> pool(1000);
  (void)pool.put({100, "old"});
  (void)pool.put({100, "new"});
  CHECK(pool.take(100)->tag == "new");
  CHECK(pool.take(100)->tag == "old");
  CHECK_FALSE(pool.take(100));
}

TEST_CASE("accept() narrows the choice", "[block_pool]") {
  BlockPool<Block> pool(1000);
  (void)pool.put({100, "plain"});
  (void)pool.put({120, "pinned"});
  auto got = pool.take(100, [](const Block& b) { return b.tag == "pinned"; });
  REQUIRE(got);
  CHECK(got->tag == "pinned");
  CHECK_FALSE(pool.take(100, [](const Block& b) { return b.tag == "pinned"; }));
  CHECK(pool.take(100)->tag == "plain");
}

TEST_CASE("a full pool gives up its oldest blocks first", "[block_pool]") {
  BlockPool<Block> pool(1000);
  (void)pool.put({400, "a"});
  (void)pool.put({400, "b"});
  CHECK(tags(pool.put({300, "c"})) == std::vector<std::string>{"a"});
  CHECK(pool.cached_bytes() == 700);
  // Up to the bound exactly is kept.
  CHECK(tags(pool.put({700, "d"})) == std::vector<std::string>{"b"});
  CHECK(pool.cached_bytes() == 1000);
  CHECK(tags(pool.put({1, "e"})) == std::vector<std::string>{"c"});
  CHECK(pool.cached_bytes() == 701);
}

TEST_CASE("a block larger than the bound is not kept", "[block_pool]") {
  BlockPool<Block> pool(1000);
  (void)pool.put({500, "a"});
  CHECK(tags(pool.put({1001, "huge"})) == std::vector<std::string>{"huge"});
  CHECK(pool.cached_bytes() == 500);
}

TEST_CASE("take_all empties the pool, oldest first", "[block_pool]") {
  BlockPool<Block> pool(1000);
  (void)pool.put({100, "a"});
  (void)pool.put({200, "b"});
  const auto all = pool.take_all();
  REQUIRE(all.size() == 2);
  CHECK(all[0].tag == "a");
  CHECK(all[1].tag == "b");
  CHECK(pool.cached_bytes() == 0);
  CHECK_FALSE(pool.take(100));
}
