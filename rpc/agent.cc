#include "rpc/agent.h"

#include <algorithm>
#include <utility>

#include "common/check.h"

namespace switchboard::rpc {
namespace {

size_t checked_thread_count(const WorkerInfo& self, size_t num_worker_threads) {
  SB_REQUIRE(num_worker_threads > 0,
             "rpc agent \"{}\": num_worker_threads must be at least 1, got 0", self.name);
  return num_worker_threads;
}

}  // namespace

void validate_worker_name(const std::string& name) {
  const bool ok = !name.empty() && name.size() <= kMaxWorkerNameLength &&
                  std::all_of(name.begin(), name.end(), [](char c) {
                    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                           (c >= '0' && c <= '9') || c == '_' || c == '-' || c == ':';
                  });
  SB_REQUIRE(
      ok, "invalid rpc worker name \"{}\": use 1 to {} letters, digits, '_', '-' or ':'",
      name, kMaxWorkerNameLength);
}

RpcAgent::RpcAgent(WorkerInfo self, size_t num_worker_threads)
    : self_(std::move(self)),
      pool_(std::make_shared<ThreadPool>(checked_thread_count(self_, num_worker_threads),
                                         "sb-rpc-pool")),
      metrics_(std::make_shared<AgentMetrics>(self_.name)) {
  pool_->set_agent_metrics(metrics_);
}

RpcAgent::~RpcAgent() = default;

RpcMetrics RpcAgent::metrics_snapshot() const {
  RpcMetrics out;
  out.worker = self_.name;
  metrics_->collect(out);
  out.pool = pool_->stats();
  collect_metrics(out);
  return out;
}

std::map<std::string, double> RpcAgent::get_metrics() const {
  return metrics_snapshot().as_map();
}

}  // namespace switchboard::rpc
