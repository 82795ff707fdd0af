// What TcpStore counts (store/store_metrics.h): operations by kind, those
// that threw, and waits for keys with their timeouts; PrefixStore reports
// the store it wraps; stores that count nothing say so. One process: a
// master TcpStore on 127.0.0.1 and an ephemeral port.
#include <catch2/catch.hpp>
#include <chrono>
#include <memory>

#include "common/error.h"
#include "store/hash_store.h"
#include "store/prefix_store.h"
#include "store/store_metrics.h"
#include "store/tcp_store.h"

using namespace switchboard;
using namespace std::chrono_literals;

namespace {

uint64_t ops(const StoreMetricsSnapshot& s, StoreOp op) {
  return s.operations[static_cast<size_t>(op)];
}
uint64_t failures(const StoreMetricsSnapshot& s, StoreOp op) {
  return s.failures[static_cast<size_t>(op)];
}

std::shared_ptr<TcpStore> master() {
  TcpStoreOptions options;
  options.is_master = true;
  options.timeout = 30s;
  return std::make_shared<TcpStore>("127.0.0.1", 0, options);
}

}  // namespace

TEST_CASE("TcpStore counts its operations, failures and waits", "[store][metrics]") {
  auto store = master();
  const StoreMetricsSnapshot before = store->metrics()->snapshot();
  store->set("a", "1");
  store->set("text", "not a number");
  CHECK(to_string(store->get("a")) == "1");
  CHECK(store->add("n", 2) == 2);
  CHECK_THROWS_AS(store->add("text", 1), Error);
  CHECK(store->check({"a"}));
  store->wait({"a"}, 1s);
  CHECK_THROWS_AS(store->wait({"missing"}, 20ms), TimeoutError);
  const StoreMetricsSnapshot s = store->metrics()->snapshot();
  auto ops_since = [&](StoreOp op) { return ops(s, op) - ops(before, op); };
  auto failures_since = [&](StoreOp op) { return failures(s, op) - failures(before, op); };
  CHECK(ops_since(StoreOp::kSet) == 2);
  CHECK(ops_since(StoreOp::kGet) == 1);
  CHECK(ops_since(StoreOp::kAdd) == 2);
  CHECK(failures_since(StoreOp::kAdd) == 1);
  CHECK(ops_since(StoreOp::kCheck) == 1);
  CHECK(ops_since(StoreOp::kWait) == 2);
  CHECK(failures_since(StoreOp::kWait) == 1);
  CHECK(failures_since(StoreOp::kGet) == 0);
  // get() waits for its key as wait() does: three waits, one timed out.
  CHECK(s.waits.count - before.waits.count == 3);
  CHECK(s.wait_timeouts - before.wait_timeouts == 1);
  CHECK(store_op_name(StoreOp::kCompareSet) == "compare_set");
}

TEST_CASE("PrefixStore reports the metrics of the store it wraps", "[store][metrics]") {
  auto store = master();
  PrefixStore prefixed("job", store);
  REQUIRE(prefixed.metrics() == store->metrics());
  const uint64_t sets = ops(store->metrics()->snapshot(), StoreOp::kSet);
  prefixed.set("k", "v");
  CHECK(ops(prefixed.metrics()->snapshot(), StoreOp::kSet) == sets + 1);
}

TEST_CASE("stores that count nothing have no metrics", "[store][metrics]") {
  HashStore store;
  CHECK(store.metrics() == nullptr);
}
