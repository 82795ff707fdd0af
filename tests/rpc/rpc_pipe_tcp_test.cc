// The RPC conformance suite over PIPE with the same-host lane off: every
// frame over TCP, as between workers of different hosts.
#include "tests/rpc/rpc_conformance.h"

namespace switchboard::conformance {

const Backend& conformance_backend() {
  static const Backend backend{"PIPE", {{"listen_address", "127.0.0.1"}, {"shm", "0"}}, nullptr};
  return backend;
}

}  // namespace switchboard::conformance
