// The RpcAgent conformance suite over the built-in PIPE backend (static
// groups), made through the backend registry on 127.0.0.1, ephemeral ports.
#include "tests/rpc/agent_conformance_pipe.h"

namespace switchboard::agent_conformance {

AgentFactory& agent_factory() {
  static PipeFactory factory;
  return factory;
}

}  // namespace switchboard::agent_conformance
