// The RpcAgent conformance suite over PIPE with the same-host lane off:
// every frame over TCP, as between workers of different hosts.
#include "tests/rpc/agent_conformance_pipe.h"

namespace switchboard::agent_conformance {

AgentFactory& agent_factory() {
  static PipeFactory factory(rpc::Extras{{"shm", "0"}});
  return factory;
}

}  // namespace switchboard::agent_conformance
