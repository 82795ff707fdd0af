// The RpcAgent conformance suite over PIPE inside mutual TLS: every worker
// has a certificate of one CA made for the run (tests/util/test_certs.h).
#include <fmt/format.h>

#include "tests/rpc/agent_conformance.h"
#include "tests/util/test_certs.h"

namespace switchboard::agent_conformance {
namespace {

class PipeTlsFactory final : public RegistryAgentFactory {
 public:
  PipeTlsFactory(const sbtest::TlsFiles& files, const std::string& ca_file)
      : RegistryAgentFactory("PIPE", {{"listen_address", "127.0.0.1"},
                                      {"num_worker_threads", "4"},
                                      {"tls_cert_file", files.cert_file},
                                      {"tls_key_file", files.key_file},
                                      {"tls_ca_file", ca_file}}) {}

  std::optional<std::string> limitation(Limitation what) const override {
    if (what == Limitation::kJoinNamesMissingWorkers) {
      return "PIPE's join() meets the others at a Gloo barrier, which cannot tell "
             "which workers are missing or gone (agents/pipe_agent.h)";
    }
    return std::nullopt;
  }

  std::string shut_down_peer_phrase(const std::string& worker) const override {
    return fmt::format("worker \"{}\" left the group", worker);
  }
};

}  // namespace

AgentFactory& agent_factory() {
  static sbtest::TestCa ca("conformance");
  static PipeTlsFactory factory(ca.issue("worker"), ca.ca_file());
  return factory;
}

}  // namespace switchboard::agent_conformance
