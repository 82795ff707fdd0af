// FileStore across real processes sharing one file: contention, a get woken
// from another process, timeouts, leader election, cleanup by the last user,
// and the files FileStore must refuse or repair.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "store/file_store.h"
#include "tests/store/file_store_fixture.h"
#include "tests/util/subprocess.h"

using namespace switchboard;
using namespace std::chrono_literals;

namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

// args: path, count. Prints every value add() returned, one per line.
SB_CHILD_MAIN(adder) {
  FileStore store(args.at(0));
  int count = std::stoi(args.at(1));
  for (int i = 0; i < count; ++i) fmt::print("{}\n", store.add("ctr", 1));
  return 0;
}

// args: path, key. Blocks in get() and prints the value.
SB_CHILD_MAIN(getter) {
  FileStore store(args.at(0));
  store.set_timeout(60s);
  fmt::print("{}\n", to_string(store.get(args.at(1))));
  return 0;
}

// args: path. Waits 100 ms for three keys and prints the timeout message.
SB_CHILD_MAIN(waiter) {
  FileStore store(args.at(0));
  try {
    store.wait({"present", "absent1", "absent2"}, 100ms);
  } catch (const TimeoutError& e) {
    fmt::print("{}\n", e.what());
    return 0;
  }
  return 1;
}

// args: path, id. Races for "leader" and prints the winner.
SB_CHILD_MAIN(candidate) {
  FileStore store(args.at(0));
  fmt::print("{}\n", to_string(store.compare_set("leader", {}, to_bytes(args.at(1)))));
  return 0;
}

// args: path. Opens the store, writes a key and leaves.
SB_CHILD_MAIN(opener) {
  FileStore store(args.at(0));
  store.set("child", "1");
  return 0;
}

TEST_CASE("adds from four processes hand out 1..200 exactly once", "[store][file]") {
  sbtest::FileStoreFixture fixture;  // keeps the file alive between children
  std::vector<sbtest::Subprocess> children;
  for (int i = 0; i < 4; ++i) {
    children.push_back(sbtest::spawn_child("adder", {fixture.path, "50"}));
  }
  std::multiset<int64_t> seen;
  for (auto& child : children) {
    for (const auto& line : lines_of(child.read_all())) seen.insert(std::stoll(line));
    CHECK(child.wait() == 0);
  }
  std::multiset<int64_t> expected;
  for (int64_t i = 1; i <= 200; ++i) expected.insert(i);
  CHECK(seen == expected);
  CHECK(to_string(fixture.open()->get("ctr")) == "200");
}

TEST_CASE("a get blocked in one process is woken by a set from another",
          "[store][file]") {
  sbtest::FileStoreFixture fixture;
  auto getter = sbtest::spawn_child("getter", {fixture.path, "late"});
  fixture.holder->set("late", "from the parent");
  CHECK(getter.read_line() == "from the parent");
  CHECK(getter.wait() == 0);
}

TEST_CASE("wait() in another process times out naming the missing keys",
          "[store][file]") {
  sbtest::FileStoreFixture fixture;
  fixture.holder->set("present", "1");
  auto waiter = sbtest::spawn_child("waiter", {fixture.path});
  std::string message = waiter.read_line();
  CHECK(waiter.wait() == 0);
  CHECK_THAT(message, Catch::Contains("[\"absent1\", \"absent2\"]") &&
                          Catch::Contains("100 ms") && Catch::Contains(fixture.path));
}

TEST_CASE("compare_set races between processes elect exactly one leader",
          "[store][file]") {
  sbtest::FileStoreFixture fixture;
  std::vector<sbtest::Subprocess> children;
  for (int i = 0; i < 4; ++i) {
    children.push_back(
        sbtest::spawn_child("candidate", {fixture.path, fmt::format("rank{}", i)}));
  }
  std::set<std::string> winners;
  int won = 0;
  for (int i = 0; i < 4; ++i) {
    std::string winner = children[i].read_line();
    winners.insert(winner);
    if (winner == fmt::format("rank{}", i)) ++won;
    CHECK(children[i].wait() == 0);
  }
  CHECK(won == 1);
  REQUIRE(winners.size() == 1);
  CHECK(to_string(fixture.holder->get("leader")) == *winners.begin());
}

TEST_CASE("the last FileStore user removes the file", "[store][file]") {
  std::string path = sbtest::make_temp_file();
  auto parent = std::make_unique<FileStore>(path);
  auto child = sbtest::spawn_child("opener", {path});
  REQUIRE(child.wait() == 0);
  CHECK(std::filesystem::exists(path));
  CHECK(to_string(parent->get("child")) == "1");
  parent.reset();
  CHECK_FALSE(std::filesystem::exists(path));
  // A later user starts a fresh, empty store on the same path.
  FileStore again(path);
  CHECK(again.num_keys() == 0);
}

TEST_CASE("with num_workers the file stays until that many users have finished",
          "[store][file]") {
  std::string path = sbtest::make_temp_file();
  auto first = std::make_unique<FileStore>(path, 2);
  first->set("early", "1");
  first.reset();
  REQUIRE(std::filesystem::exists(path));
  auto second = std::make_unique<FileStore>(path, 2);
  CHECK(to_string(second->get("early")) == "1");
  second.reset();
  CHECK_FALSE(std::filesystem::exists(path));
  CHECK_THROWS_AS(FileStore(path, 0), std::invalid_argument);
}

TEST_CASE("FileStore on an unwritable path throws an Error naming the path",
          "[store][file]") {
  std::string file = sbtest::make_temp_file();
  std::string path = file + "/store";  // a regular file as a directory
  try {
    FileStore store(path);
    FAIL("FileStore opened " << path);
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains(path) && Catch::Contains("Not a directory"));
  }
  std::filesystem::remove(file);
}

TEST_CASE("FileStore refuses a file that is not a FileStore log and leaves it alone",
          "[store][file]") {
  std::string path = sbtest::make_temp_file();
  std::ofstream(path) << "some unrelated data\n";
  try {
    FileStore store(path);
    FAIL("FileStore accepted a foreign file");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kFailedPrecondition);
    CHECK_THAT(e.what(), Catch::Contains(path));
  }
  CHECK(read_file(path) == "some unrelated data\n");
  std::filesystem::remove(path);
}

TEST_CASE("a partial record left by a dead writer is cut off", "[store][file]") {
  sbtest::FileStoreFixture fixture;
  auto store = fixture.open();
  store->set("a", "1");
  {
    // A set of a 5-byte key, torn after two of its key bytes.
    std::ofstream out(fixture.path, std::ios::binary | std::ios::app);
    out.write("\x01\x05\0\0\0\0\0\0\0ke", 11);
  }
  auto other = fixture.open();
  other->set("b", "2");
  CHECK(to_string(store->get("b")) == "2");
  CHECK(to_string(fixture.open()->get("a")) == "1");
  CHECK(store->num_keys() == 2);
}

TEST_CASE("bookkeeping is hidden from num_keys and check", "[store][file]") {
  sbtest::FileStoreFixture fixture;
  auto store = fixture.open();
  CHECK(store->num_keys() == 0);
  CHECK_FALSE(store->check({"users"}));
  CHECK_FALSE(store->check({"finished"}));
}

TEST_CASE("threads sharing one FileStore add atomically", "[store][file]") {
  sbtest::FileStoreFixture fixture;
  std::vector<std::vector<int64_t>> seen(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) seen[t].push_back(fixture.holder->add("ctr", 1));
    });
  }
  for (auto& thread : threads) thread.join();
  std::set<int64_t> all;
  for (const auto& values : seen) all.insert(values.begin(), values.end());
  CHECK(all.size() == 200);
  CHECK(*all.rbegin() == 200);
}
