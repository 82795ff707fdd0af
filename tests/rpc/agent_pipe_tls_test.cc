// The RpcAgent conformance suite over PIPE inside mutual TLS: every worker
// has a certificate of one CA made for the run (tests/util/test_certs.h).
#include "tests/rpc/agent_conformance_pipe.h"
#include "tests/util/test_certs.h"

namespace switchboard::agent_conformance {

AgentFactory& agent_factory() {
  static sbtest::TestCa ca("conformance");
  static const sbtest::TlsFiles files = ca.issue("worker");
  static PipeFactory factory({{"tls_cert_file", files.cert_file},
                              {"tls_key_file", files.key_file},
                              {"tls_ca_file", ca.ca_file()}});
  return factory;
}

}  // namespace switchboard::agent_conformance
