// The RpcAgent conformance suite over LOCAL, the in-process backend that
// tests/rpc/local_agent.cc registers as a user registers their own.
#include "tests/rpc/agent_conformance.h"
#include "tests/rpc/local_agent.h"

namespace switchboard::agent_conformance {

AgentFactory& agent_factory() {
  static RegistryAgentFactory factory(testing::kLocalBackendName,
                                      {{"num_worker_threads", "4"}},
                                      [] { testing::register_local_backend(); });
  return factory;
}

}  // namespace switchboard::agent_conformance
