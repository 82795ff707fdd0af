// FairQueue (rpc/fair_queue.h): keys take turns, each key's items come out
// oldest first, take_newest() takes back the latest and a key left empty
// gives up its turn.
#include "rpc/fair_queue.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

using switchboard::rpc::FairQueue;

namespace {

std::vector<std::string> drain(FairQueue<std::string>& q) {
  std::vector<std::string> out;
  while (auto item = q.pop()) out.push_back(*item);
  return out;
}

}  // namespace

TEST_CASE("a key with a backlog gets one item in turn with every other key",
          "[rpc][fair_queue]") {
  FairQueue<std::string> q;
  CHECK_FALSE(q.pop().has_value());
  for (const char* item : {"a1", "a2", "a3"}) q.push(1, item);
  q.push(2, "b1");
  q.push(3, "c1");
  q.push(2, "b2");
  CHECK(drain(q) == std::vector<std::string>{"a1", "b1", "c1", "a2", "b2", "a3"});
  CHECK_FALSE(q.pop().has_value());
}

TEST_CASE("take_newest takes back a key's latest item; a key left empty loses its turn",
          "[rpc][fair_queue]") {
  FairQueue<std::string> q;
  q.push(1, "a1");
  q.push(2, "b1");
  q.push(1, "a2");
  CHECK(q.take_newest(1) == "a2");
  CHECK(q.take_newest(1) == "a1");
  CHECK_FALSE(q.take_newest(1).has_value());
  CHECK_FALSE(q.take_newest(7).has_value());
  CHECK(drain(q) == std::vector<std::string>{"b1"});
  q.push(1, "a3");  // back in the turns
  CHECK(drain(q) == std::vector<std::string>{"a3"});
}
