// Object collectives (torch's all_gather_object, broadcast_object_list,
// gather_object, scatter_object_list; test_c10d_common's object cases) over
// a Gloo group of three: strings, maps and a user struct of different sizes
// on each rank; a value holding a tensor is refused.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "collective/gloo_process_group.h"
#include "collective/objects.h"
#include "core/tensor.h"
#include "tests/collective/pg_harness.h"

using namespace switchboard;
using namespace switchboard::collective;
using namespace std::chrono_literals;

namespace objects_test {
struct Stats {
  std::string name;
  std::vector<double> losses;
  int64_t step = 0;
  MSGPACK_DEFINE(name, losses, step);
  friend bool operator==(const Stats&, const Stats&) = default;
};
}  // namespace objects_test
using objects_test::Stats;

namespace {

constexpr std::chrono::milliseconds kTimeout = 30s;

Stats stats_of(int rank) {
  return Stats{fmt::format("worker-{}", rank), std::vector<double>(rank + 1, 0.5 * rank), rank};
}

}  // namespace

TEST_CASE("all_gather_object, broadcast_object_list, gather_object and scatter_object_list "
          "carry values of any size",
          "[gloo][objects]") {
  sbtest::Groups groups = sbtest::make_groups(3, sbtest::unique_group_name("objects"), kTimeout);
  std::vector<std::vector<Stats>> gathered(3);
  std::vector<std::vector<std::string>> broadcast(3);
  std::vector<std::optional<std::vector<std::map<std::string, int64_t>>>> at_dst(3);
  std::vector<std::string> scattered(3);
  sbtest::run_threads(
      3,
      [&](int rank) {
        GlooProcessGroup& g = *groups[rank];
        gathered[rank] = all_gather_object(g, stats_of(rank));
        broadcast[rank] = rank == 1 ? std::vector<std::string>{"lr", std::string(1000, 'x')}
                                    : std::vector<std::string>{"stale"};
        broadcast_object_list(g, broadcast[rank], 1);
        at_dst[rank] = gather_object(g, std::map<std::string, int64_t>{{"rank", rank}}, 2);
        scattered[rank] = scatter_object_list(
            g,
            rank == 0 ? std::vector<std::string>{"a", "bb", std::string(300, 'c')}
                      : std::vector<std::string>{},
            0);
      },
      sbtest::watchdog_for(kTimeout));
  for (int rank = 0; rank < 3; ++rank) {
    INFO("rank " << rank);
    CHECK(gathered[rank] == std::vector<Stats>{stats_of(0), stats_of(1), stats_of(2)});
    CHECK(broadcast[rank] == std::vector<std::string>{"lr", std::string(1000, 'x')});
    CHECK(at_dst[rank].has_value() == (rank == 2));
  }
  REQUIRE(at_dst[2]);
  CHECK((*at_dst[2])[1].at("rank") == 1);
  CHECK(scattered == std::vector<std::string>{"a", "bb", std::string(300, 'c')});
}

TEST_CASE("an object collective refuses a value that holds a tensor", "[gloo][objects]") {
  sbtest::Groups groups = sbtest::make_groups(1, sbtest::unique_group_name("objects"), kTimeout);
  const Tensor t = Tensor::from_vector(std::vector<float>{1.0f});
  CHECK_THROWS_WITH(all_gather_object(*groups[0], t),
                    Catch::Contains("object collectives carry values without tensors"));
}
