// What a call table counts per function (rpc/metrics.h: FunctionMetrics),
// and the table of those counts by function name.
//
// The calls a worker makes are counted under the call table's lock, which
// it holds anyway to add and complete a call (plain adds: no atomic, no
// cache line of their own to bounce between the caller and the thread that
// completes); the requests it serves are counted with atomic adds, outside
// the lock.
//
// Requests carry names chosen by peers, so the names counted are bounded:
// past kMaxFunctions distinct names, the rest count as kOtherFunctions.
//
// Thread safety: FunctionStatsTable and FunctionStats' plain fields are
// guarded by the caller's lock (the call table's); `served` and
// `served_failed` are lock-free. Entries are never erased: a FunctionStats&
// stays valid for the life of its table.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "common/metrics.h"
#include "rpc/metrics.h"

namespace switchboard::rpc {

struct FunctionStats {
  // Under the caller's lock.
  uint64_t sent = 0;
  uint64_t succeeded = 0;
  std::array<uint64_t, kNumFailureKinds> failed{};
  HistogramSnapshot latency;
  // Lock-free.
  Counter served;
  Counter served_failed;

  void failure(FailureKind kind) { ++failed[static_cast<size_t>(kind)]; }
  // Under the caller's lock.
  FunctionMetrics snapshot() const;
};

class FunctionStatsTable {
 public:
  static constexpr size_t kMaxFunctions = 1024;
  static constexpr const char* kOtherFunctions = "(other)";

  // The entry of `function` (made on first use; kOtherFunctions' past
  // kMaxFunctions names). Calls in a row mostly name one function: the
  // entry found last is tried first, with a string compare.
  FunctionStats& stats_for(const std::string& function);
  // Merges every entry's snapshot into out.functions.
  void collect(RpcMetrics& out) const;

 private:
  std::unordered_map<std::string, FunctionStats> functions_;
  const std::string* last_function_ = nullptr;
  FunctionStats* last_stats_ = nullptr;
};

}  // namespace switchboard::rpc
