// The RPC conformance suite over the built-in PIPE backend (the default),
// reached by name as a user would.
#include "tests/rpc/rpc_conformance.h"

namespace switchboard::conformance {

const Backend& conformance_backend() {
  static const Backend backend{"PIPE", {{"listen_address", "127.0.0.1"}}, nullptr};
  return backend;
}

}  // namespace switchboard::conformance
