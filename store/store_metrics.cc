#include "store/store_metrics.h"

namespace switchboard {

std::string_view store_op_name(StoreOp op) {
  switch (op) {
    case StoreOp::kSet: return "set";
    case StoreOp::kGet: return "get";
    case StoreOp::kAdd: return "add";
    case StoreOp::kCompareSet: return "compare_set";
    case StoreOp::kWait: return "wait";
    case StoreOp::kCheck: return "check";
    case StoreOp::kDeleteKey: return "delete_key";
    case StoreOp::kNumKeys: return "num_keys";
    case StoreOp::kMultiGet: return "multi_get";
    case StoreOp::kMultiSet: return "multi_set";
    case StoreOp::kAppend: return "append";
  }
  return "unknown";
}

StoreMetricsSnapshot StoreMetrics::snapshot() const {
  StoreMetricsSnapshot s;
  for (size_t i = 0; i < kNumStoreOps; ++i) {
    s.operations[i] = operations_[i].value();
    s.failures[i] = failures_[i].value();
  }
  s.waits = waits_.snapshot();
  s.wait_timeouts = wait_timeouts_.value();
  return s;
}

}  // namespace switchboard
