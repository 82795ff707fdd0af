// The built-in RPC backends, and their typed options.
//
// register_builtin_backends() is the one place that lists them; linking
// //agents:builtin_backends (which //:switchboard does) installs it with
// rpc::set_builtin_backends(), so the registry runs it once, before it
// answers its first question, and the built-ins are usable by name without
// the user doing anything:
//   PROCESS_GROUP  agents/process_group_agent.h (static groups only)
//   PIPE           the default backend (not built yet: issue 5)
//
// Thread safety: as rpc/backend_registry.h.
#pragma once

#include <string>

#include "rpc/backend_registry.h"

namespace switchboard::agents {

// PROCESS_GROUP's options. Extras accepted by construct_rpc_backend_options:
//   "num_worker_threads"  integer >= 1 (also a common field)
//   "hostname"            the address Gloo binds (e.g. "127.0.0.1")
//   "iface"               the network interface Gloo binds (e.g. "eth0")
// Both empty: SWITCHBOARD_GLOO_HOSTNAME, then Gloo's own choice.
struct ProcessGroupRpcBackendOptions : rpc::RpcBackendOptions {
  std::string hostname;
  std::string iface;
};

// Registers every built-in backend (called by the registry; calling it
// again throws RegistryError for the duplicate names).
void register_builtin_backends();

}  // namespace switchboard::agents
