// PipeSettings and PipeAgentOptions: the PIPE agent's settings
// (agents/pipe/agent.h says what each one does to the agent). Written once:
// PipeSettings holds every PIPE-specific field, which the public
// PipeRpcBackendOptions (agents/builtin_backends.h) and PipeAgentOptions
// both inherit; PipeAgentOptions adds the two fields every backend's options
// share (rpc::RpcBackendOptions holds those on the public side). Plain
// values; their own header so that the agent's parts (agents/pipe/*.h) can
// read them without the agent.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agents/pipe/transport/tls/tls_options.h"
#include "agents/pipe/wire/frame.h"
#include "common/auth.h"
#include "core/tensor.h"
#include "rpc/backend_registry.h"
#include "rpc/call_table.h"
#include "rpc/device_map.h"

namespace switchboard::agents::pipe {

using transport::PipeTlsOptions;  // agents/pipe/transport/tls/tls_options.h

struct PipeSettings {
  size_t num_io_threads = 1;
  // An address or an interface name; empty: see agents/pipe/address.h.
  std::string listen_address;
  // "LO-HI" or "P": the listener takes the first free port of it; empty:
  // SWITCHBOARD_PORT_RANGE, else a port the kernel picks
  // (common/listen_address.h).
  std::string port_range;
  // A heartbeat goes out on every connection this often; a connection
  // silent for heartbeat_timeout is declared dead.
  std::chrono::milliseconds heartbeat_interval{250};
  std::chrono::milliseconds heartbeat_timeout{5'000};
  wire::FrameLimits limits;
  // Requests of one caller this worker takes at once (waiting or running);
  // more are refused at once with Error(kResourceExhausted) (0: no limit).
  size_t max_requests_per_peer = rpc::kDefaultMaxRequestsPerPeer;
  // Device maps (local device → the target's device) per target worker,
  // and the devices this worker uses (empty: derived, as PyTorch does).
  rpc::DeviceMaps device_maps;
  std::vector<Device> devices;
  // Dynamic groups: ranks are in [0, max_dynamic_ranks), and the
  // membership token is held on a lease of `membership_lease`: how long
  // the others wait, from their first look, for a holder that stops
  // renewing it (rendezvous/membership_token.h).
  int max_dynamic_ranks = 1024;
  std::chrono::milliseconds membership_lease{10'000};
  // The job secret every connection must prove in its hello
  // (agents/pipe/handshake.h); null: SWITCHBOARD_SECRET_FILE's when it is set,
  // else none.
  std::shared_ptr<const Secret> secret;
  // Mutual TLS on every connection; none named: the SWITCHBOARD_TLS_*
  // variables' files when set, else plain TCP.
  PipeTlsOptions tls;
  // The same-host lane (agents/pipe/transport/shm/shm_lane.h): frames to a worker
  // of this host go through shared memory. nullopt: on unless
  // SWITCHBOARD_PIPE_SHM is "0". Never with TLS. Each direction's ring has
  // shm_ring_bytes (a power of two, >= 4096).
  std::optional<bool> shm;
  size_t shm_ring_bytes = 4 << 20;
  // The cuda_ipc channel (agents/pipe/channel/cuda_ipc/cuda_ipc.h): CUDA tensors to
  // a worker of this host go device to device, when a DeviceIpc is
  // registered (core/device_ipc.h: //core:cuda_allocator does).
  // nullopt: on unless SWITCHBOARD_PIPE_CUDA_IPC is "0".
  std::optional<bool> cuda_ipc;
  // CUDA devices of this machine as the maps are validated against; -1
  // asks the registered CUDA runtime (registered_cuda_device_count(): 0 in
  // a binary that does not link //core:cuda_allocator).
  int device_count = -1;
};

struct PipeAgentOptions : PipeSettings {
  size_t num_worker_threads = rpc::kDefaultNumWorkerThreads;
  // Bounds the construction rendezvous and is join()'s default.
  std::chrono::milliseconds rpc_timeout = rpc::kDefaultRpcTimeout;
};

}  // namespace switchboard::agents::pipe
