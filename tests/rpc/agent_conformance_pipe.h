// The RpcAgent conformance suite's factory for the built-in PIPE backend
// (static groups), through the backend registry on 127.0.0.1 with ephemeral
// ports, plus `more` extras (TLS files, for one). Shared by the PIPE binaries
// of the suite.
#pragma once

#include <fmt/format.h>

#include <string>

#include "tests/rpc/agent_conformance.h"

namespace switchboard::agent_conformance {

class PipeFactory final : public RegistryAgentFactory {
 public:
  explicit PipeFactory(const rpc::Extras& more = {})
      : RegistryAgentFactory("PIPE", with(more)) {}

  // A PIPE worker says goodbye when it shuts down: its peers report it as
  // having left rather than lost (agents/pipe/agent.h).
  std::string shut_down_peer_phrase(const std::string& worker) const override {
    return fmt::format("worker \"{}\" left the group", worker);
  }

 private:
  static rpc::Extras with(const rpc::Extras& more) {
    rpc::Extras extras{{"listen_address", "127.0.0.1"}, {"num_worker_threads", "4"}};
    for (const auto& [key, value] : more) extras[key] = value;
    return extras;
  }
};

}  // namespace switchboard::agent_conformance
