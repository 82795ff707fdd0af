// FunctionStatsTable (rpc/function_stats.h): one entry per function name,
// stable across lookups in any order, at most kMaxFunctions names with the
// rest counted together, and collect() merging every entry's snapshot.
#include "rpc/function_stats.h"

#include <catch2/catch.hpp>
#include <string>

using switchboard::rpc::FunctionStats;
using switchboard::rpc::FunctionStatsTable;
using switchboard::rpc::RpcMetrics;

TEST_CASE("each function has one entry, whatever the order of the lookups",
          "[rpc][function_stats]") {
  FunctionStatsTable table;
  FunctionStats& a = table.stats_for("a");
  FunctionStats& b = table.stats_for("b");
  CHECK(&a != &b);
  CHECK(&table.stats_for("a") == &a);
  CHECK(&table.stats_for("a") == &a);  // the entry found last
  CHECK(&table.stats_for("b") == &b);
  ++a.sent;
  ++a.succeeded;
  ++b.sent;
  b.served.add(3);
  RpcMetrics out;
  table.collect(out);
  REQUIRE(out.functions.size() == 2);
  CHECK(out.functions["a"].calls_sent == 1);
  CHECK(out.functions["a"].calls_succeeded == 1);
  CHECK(out.functions["b"].calls_sent == 1);
  CHECK(out.functions["b"].requests_served == 3);
}

TEST_CASE("names past kMaxFunctions are counted together under kOtherFunctions",
          "[rpc][function_stats]") {
  FunctionStatsTable table;
  for (size_t i = 0; i < FunctionStatsTable::kMaxFunctions; ++i)
    ++table.stats_for("f" + std::to_string(i)).sent;
  FunctionStats& other = table.stats_for("one too many");
  CHECK(&table.stats_for("and another") == &other);
  ++other.sent;
  ++table.stats_for("and another").sent;
  CHECK(&table.stats_for("f0") != &other);  // the first names keep theirs
  RpcMetrics out;
  table.collect(out);
  CHECK(out.functions.size() == FunctionStatsTable::kMaxFunctions + 1);
  CHECK(out.functions[FunctionStatsTable::kOtherFunctions].calls_sent == 2);
  CHECK(out.functions["f5"].calls_sent == 1);
}
