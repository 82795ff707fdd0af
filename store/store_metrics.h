// StoreMetrics: what a Store client counts (TcpStore does; see
// Store::metrics()): operations by kind, failed operations, and the time
// spent blocked waiting for keys (get, wait, multi_get), with the waits that
// timed out.
//
// Thread safety: every member may be updated and read from any thread at
// once (common/metrics.h); snapshot() is a plain value.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/metrics.h"

namespace switchboard {

enum class StoreOp {
  kSet,
  kGet,
  kAdd,
  kCompareSet,
  kWait,
  kCheck,
  kDeleteKey,
  kNumKeys,
  kMultiGet,
  kMultiSet,
  kAppend,
};
inline constexpr size_t kNumStoreOps = 11;

// "set", "get", "add", "compare_set", "wait", "check", "delete_key",
// "num_keys", "multi_get", "multi_set", "append".
std::string_view store_op_name(StoreOp op);

struct StoreMetricsSnapshot {
  std::array<uint64_t, kNumStoreOps> operations{};  // by StoreOp
  std::array<uint64_t, kNumStoreOps> failures{};    // of those, how many threw
  HistogramSnapshot waits;                           // time blocked for keys
  uint64_t wait_timeouts = 0;                        // waits that timed out
};

class StoreMetrics {
 public:
  // One operation of kind `op` begins (counted whatever its outcome).
  void started(StoreOp op) { operations_[static_cast<size_t>(op)].add(); }
  // The operation threw.
  void failed(StoreOp op) { failures_[static_cast<size_t>(op)].add(); }
  // A wait for keys took `blocked`; `timed_out` when it gave up.
  void waited(std::chrono::nanoseconds blocked, bool timed_out) {
    waits_.record(blocked);
    if (timed_out) wait_timeouts_.add();
  }

  StoreMetricsSnapshot snapshot() const;

 private:
  std::array<Counter, kNumStoreOps> operations_;
  std::array<Counter, kNumStoreOps> failures_;
  LatencyHistogram waits_;
  Counter wait_timeouts_;
};

}  // namespace switchboard
