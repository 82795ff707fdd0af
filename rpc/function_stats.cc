#include "rpc/function_stats.h"

namespace switchboard::rpc {

FunctionMetrics FunctionStats::snapshot() const {
  FunctionMetrics m;
  m.calls_sent = sent;
  m.calls_succeeded = succeeded;
  m.calls_failed = failed;
  m.latency = latency;
  m.requests_served = served.value();
  m.requests_failed = served_failed.value();
  return m;
}

FunctionStats& FunctionStatsTable::stats_for(const std::string& function) {
  if (last_function_ != nullptr && *last_function_ == function) return *last_stats_;
  auto it = functions_.find(function);
  if (it == functions_.end()) {
    const std::string& key =
        functions_.size() < kMaxFunctions ? function : kOtherFunctions;
    it = functions_.try_emplace(key).first;
  }
  // A name counted as kOtherFunctions is not cached: it would compare
  // unequal to the key it is counted under.
  if (it->first == function) {
    last_function_ = &it->first;
    last_stats_ = &it->second;
  }
  return it->second;
}

void FunctionStatsTable::collect(RpcMetrics& out) const {
  for (const auto& [function, stats] : functions_) {
    out.functions[function].merge(stats.snapshot());
  }
}

}  // namespace switchboard::rpc
