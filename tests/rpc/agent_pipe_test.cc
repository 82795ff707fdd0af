// The RpcAgent conformance suite over the built-in PIPE backend (static
// groups), made through the backend registry on 127.0.0.1, ephemeral ports.
#include <fmt/format.h>

#include "tests/rpc/agent_conformance.h"

namespace switchboard::agent_conformance {
namespace {

class PipeFactory final : public RegistryAgentFactory {
 public:
  PipeFactory()
      : RegistryAgentFactory("PIPE",
                             {{"listen_address", "127.0.0.1"}, {"num_worker_threads", "4"}}) {}

  std::optional<std::string> limitation(Limitation what) const override {
    if (what == Limitation::kJoinNamesMissingWorkers) {
      return "PIPE's join() meets the others at a Gloo barrier, which cannot tell "
             "which workers are missing or gone (agents/pipe_agent.h)";
    }
    return std::nullopt;
  }

  // A PIPE worker says goodbye when it shuts down: its peers report it as
  // having left rather than lost (agents/pipe_agent.h).
  std::string shut_down_peer_phrase(const std::string& worker) const override {
    return fmt::format("worker \"{}\" left the group", worker);
  }
};

}  // namespace

AgentFactory& agent_factory() {
  static PipeFactory factory;
  return factory;
}

}  // namespace switchboard::agent_conformance
