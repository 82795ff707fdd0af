// The RPC conformance suite over LOCAL, an in-process backend that
// tests/rpc/local_agent.cc registers through rpc::register_backend exactly
// as a user registers their own transport: the whole API, by name, over a
// backend rpc/ has never heard of.
#include "tests/rpc/local_agent.h"
#include "tests/rpc/rpc_conformance.h"

namespace switchboard::conformance {

const Backend& conformance_backend() {
  static const Backend backend{
      "LOCAL", {{"num_worker_threads", "4"}}, [] { testing::register_local_backend(); }};
  return backend;
}

}  // namespace switchboard::conformance
