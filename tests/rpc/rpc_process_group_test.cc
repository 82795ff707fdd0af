// The RPC conformance suite over the built-in PROCESS_GROUP backend,
// reached by name as a user would (linking //agents:builtin_backends
// registers it).
#include "tests/rpc/rpc_conformance.h"

namespace switchboard::conformance {

const Backend& conformance_backend() {
  static const Backend backend{"PROCESS_GROUP", {{"hostname", "127.0.0.1"}}, nullptr};
  return backend;
}

}  // namespace switchboard::conformance
