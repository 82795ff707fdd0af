// The RpcAgent conformance suite over the built-in PROCESS_GROUP backend,
// made through the backend registry (Gloo on 127.0.0.1).
#include "tests/rpc/agent_conformance.h"

namespace switchboard::agent_conformance {
namespace {

class ProcessGroupFactory final : public RegistryAgentFactory {
 public:
  ProcessGroupFactory()
      : RegistryAgentFactory("PROCESS_GROUP",
                             {{"hostname", "127.0.0.1"}, {"num_worker_threads", "4"}}) {}

  std::optional<std::string> limitation(Limitation what) const override {
    if (what == Limitation::kJoinSeesWorkersThatShutDown) {
      return "PROCESS_GROUP's join() barrier waits on store keys until its timeout; it "
             "cannot see a worker that shut down (agents/process_group/agent.h)";
    }
    return std::nullopt;
  }

  // A PROCESS_GROUP worker that shuts down closes its Gloo group: its
  // peers' listeners see the link fail, so their metrics entry for it
  // reads "failed" (agents/process_group/agent.h).
  rpc::ConnectionState shut_down_peer_state() const override {
    return rpc::ConnectionState::kFailed;
  }
};

}  // namespace

AgentFactory& agent_factory() {
  static ProcessGroupFactory factory;
  return factory;
}

}  // namespace switchboard::agent_conformance
