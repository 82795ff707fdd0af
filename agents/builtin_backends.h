// The built-in RPC backends, and their typed options.
//
// register_builtin_backends() is the one place that lists them; linking
// //agents:builtin_backends (which //:switchboard does) installs it with
// rpc::set_builtin_backends(), so the registry runs it once, before it
// answers its first question, and the built-ins are usable by name without
// the user doing anything:
//   PIPE           agents/pipe/agent.h, the default (static and dynamic groups)
//   PROCESS_GROUP  agents/process_group/agent.h (static groups only)
//
// Thread safety: as rpc/backend_registry.h.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "agents/pipe/options.h"
#include "core/tensor.h"
#include "rpc/backend_registry.h"
#include "rpc/device_map.h"

namespace switchboard::agents {

// PROCESS_GROUP's options. Extras accepted by construct_rpc_backend_options:
//   "num_worker_threads"  integer >= 1 (also a common field)
//   "hostname"            the address Gloo binds (e.g. "127.0.0.1")
//   "iface"               the network interface Gloo binds (e.g. "eth0")
// Both empty: the rule every listener follows (SWITCHBOARD_IFNAME, older
// aliases, the address that routes to the store; docs/multi_host.md).
struct ProcessGroupRpcBackendOptions : rpc::RpcBackendOptions {
  std::string hostname;
  std::string iface;
};

// PIPE's options. Extras accepted by construct_rpc_backend_options:
//   "num_worker_threads"     integer >= 1 (also a common field)
//   "num_io_threads"         integer >= 1 (default 1)
//   "listen_address"         an address or interface name (see
//                            agents/pipe/address.h for the default)
//   "port_range"             "LO-HI" or "P": the listener's port comes
//                            from it (default: SWITCHBOARD_PORT_RANGE, else
//                            a port the kernel picks)
//   "heartbeat_interval_ms"  integer > 0 (default 250)
//   "heartbeat_timeout_ms"   integer >= 0, 0 disables (default 5000)
// (Defaults: PipeAgentOptions', agents/pipe/options.h.)
//   "device_count"           integer >= 0: the CUDA devices device maps are
//                            validated against (default: ask CUDA)
//   "membership_lease_ms"    integer > 0: the lease on a dynamic group's
//                            membership token: how long the others wait
//                            for a joiner or leaver that holds it and stops
//                            renewing (default 10000; see
//                            rendezvous/membership_token.h)
//   "max_requests_per_peer"  integer >= 0 (0: no limit; default 1024)
//   "max_dynamic_ranks"      integer >= 1: a dynamic group's ranks are in
//                            [0, it) (default 1024)
//   "shm"                    "1" or "0": the same-host shared-memory lane
//                            on or off (default: SWITCHBOARD_PIPE_SHM, else
//                            on; see agents/pipe/transport/shm/shm_lane.h)
//   "shm_ring_bytes"         a power of two >= 4096: each direction's ring
//                            (default 4 MiB)
//   "cuda_ipc"               "1" or "0": CUDA tensors to workers of this
//                            host device to device (default:
//                            SWITCHBOARD_PIPE_CUDA_IPC, else on where a
//                            DeviceIpc is registered; see
//                            agents/pipe/channel/cuda_ipc/cuda_ipc.h)
//   "max_function_length", "max_payload_bytes", "max_tensors",
//   "max_tensor_bytes"       what a received frame may carry
//                            (pipe::wire::FrameLimits; a larger frame closes the
//                            connection)
//   "tls_cert_file", "tls_key_file", "tls_ca_file"
//                            PEM files: mutual TLS on every connection
//                            (all three or none; default: the
//                            SWITCHBOARD_TLS_* variables, else plain TCP;
//                            see PipeTlsOptions in agents/pipe/options.h)
// Device maps are set on the options object, as in PyTorch:
//   options->set_device_map("w1", {{"cuda:0", "cuda:1"}});
//   options->set_devices({"cuda:0"});
// set_device_map merges into the map for that worker and throws
// std::invalid_argument when the result would not be 1-to-1 (naming the
// worker and the devices); set_devices throws for unparsable names.
// Every field of PipeSettings (agents/pipe/options.h) is set on the object
// directly (as options->heartbeat_timeout = ...), the common ones
// (rpc_timeout, num_worker_threads, init_method) on the base; the agent
// gets them all, none copied by hand.
struct PipeRpcBackendOptions : rpc::RpcBackendOptions, pipe::PipeSettings {
  void set_device_map(const std::string& worker,
                      const std::vector<std::pair<std::string, std::string>>& map);
  void set_devices(const std::vector<std::string>& names);
};

// Registers every built-in backend (called by the registry; calling it
// again throws RegistryError for the duplicate names).
void register_builtin_backends();

}  // namespace switchboard::agents
