#include "agents/builtin_backends.h"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>
#include <typeinfo>

#include "agents/pipe/agent.h"
#include "agents/process_group/agent.h"
#include "common/check.h"

namespace switchboard::agents {
namespace {

using pipe::PipeAgent;
using pipe::PipeAgentOptions;
using pipe::PipeSettings;
using process_group::ProcessGroupAgent;
using process_group::ProcessGroupAgentOptions;

std::shared_ptr<rpc::RpcBackendOptions> process_group_options(
    std::chrono::milliseconds rpc_timeout, const std::string& init_method,
    const rpc::Extras& extras) {
  auto options = std::make_shared<ProcessGroupRpcBackendOptions>();
  options->rpc_timeout = rpc_timeout;
  options->init_method = init_method;
  rpc::ExtrasReader reader("PROCESS_GROUP", extras);
  if (auto threads = reader.get_int("num_worker_threads")) {
    SB_REQUIRE(*threads >= 1 && *threads <= 4096,
               "RPC backend \"PROCESS_GROUP\": num_worker_threads must be in [1, 4096], "
               "got {}",
               *threads);
    options->num_worker_threads = static_cast<int>(*threads);
  }
  options->hostname = reader.get("hostname").value_or("");
  options->iface = reader.get("iface").value_or("");
  reader.finish();
  return options;
}

int64_t read_int(rpc::ExtrasReader& reader, const char* key, int64_t min, int64_t max,
                 int64_t fallback) {
  auto value = reader.get_int(key);
  if (!value) return fallback;
  SB_REQUIRE(*value >= min && *value <= max,
             "RPC backend \"PIPE\": option \"{}\" must be in [{}, {}], got {}", key, min,
             max, *value);
  return *value;
}

std::shared_ptr<rpc::RpcBackendOptions> pipe_options(std::chrono::milliseconds rpc_timeout,
                                                     const std::string& init_method,
                                                     const rpc::Extras& extras) {
  auto options = std::make_shared<PipeRpcBackendOptions>();
  options->rpc_timeout = rpc_timeout;
  options->init_method = init_method;
  rpc::ExtrasReader reader("PIPE", extras);
  options->num_worker_threads = static_cast<int>(
      read_int(reader, "num_worker_threads", 1, 4096, options->num_worker_threads));
  options->num_io_threads = static_cast<size_t>(
      read_int(reader, "num_io_threads", 1, 64, static_cast<int64_t>(options->num_io_threads)));
  options->listen_address = reader.get("listen_address").value_or("");
  options->port_range = reader.get("port_range").value_or("");
  options->heartbeat_interval = std::chrono::milliseconds(
      read_int(reader, "heartbeat_interval_ms", 1, 3'600'000,
               options->heartbeat_interval.count()));
  options->heartbeat_timeout = std::chrono::milliseconds(
      read_int(reader, "heartbeat_timeout_ms", 0, 86'400'000,
               options->heartbeat_timeout.count()));
  options->device_count = static_cast<int>(read_int(reader, "device_count", 0, 1024, options->device_count));
  options->membership_lease = std::chrono::milliseconds(
      read_int(reader, "membership_lease_ms", 1, 86'400'000,
               options->membership_lease.count()));
  options->max_requests_per_peer = static_cast<size_t>(
      read_int(reader, "max_requests_per_peer", 0, 1 << 30,
               static_cast<int64_t>(options->max_requests_per_peer)));
  options->max_dynamic_ranks = static_cast<int>(
      read_int(reader, "max_dynamic_ranks", 1, 1 << 20, options->max_dynamic_ranks));
  if (auto shm = reader.get_int("shm")) {
    SB_REQUIRE(*shm == 0 || *shm == 1, "RPC backend \"PIPE\": option \"shm\" must be 0 or 1, "
               "got {}", *shm);
    options->shm = *shm == 1;
  }
  if (auto cuda_ipc = reader.get_int("cuda_ipc")) {
    SB_REQUIRE(*cuda_ipc == 0 || *cuda_ipc == 1,
               "RPC backend \"PIPE\": option \"cuda_ipc\" must be 0 or 1, got {}", *cuda_ipc);
    options->cuda_ipc = *cuda_ipc == 1;
  }
  const int64_t ring = read_int(reader, "shm_ring_bytes", 4096, int64_t{1} << 30,
                                static_cast<int64_t>(options->shm_ring_bytes));
  SB_REQUIRE((ring & (ring - 1)) == 0,
             "RPC backend \"PIPE\": option \"shm_ring_bytes\" must be a power of two, got {}",
             ring);
  options->shm_ring_bytes = static_cast<size_t>(ring);
  pipe::wire::FrameLimits& limits = options->limits;
  limits.max_function_length = static_cast<uint32_t>(read_int(
      reader, "max_function_length", 1, limits.max_function_length, limits.max_function_length));
  limits.max_payload_bytes = static_cast<uint64_t>(
      read_int(reader, "max_payload_bytes", 1, static_cast<int64_t>(limits.max_payload_bytes),
               static_cast<int64_t>(limits.max_payload_bytes)));
  limits.max_tensors = static_cast<uint32_t>(
      read_int(reader, "max_tensors", 0, limits.max_tensors, limits.max_tensors));
  limits.max_tensor_bytes = static_cast<uint64_t>(
      read_int(reader, "max_tensor_bytes", 0, static_cast<int64_t>(limits.max_tensor_bytes),
               static_cast<int64_t>(limits.max_tensor_bytes)));
  options->tls.cert_file = reader.get("tls_cert_file").value_or("");
  options->tls.key_file = reader.get("tls_key_file").value_or("");
  options->tls.ca_file = reader.get("tls_ca_file").value_or("");
  reader.finish();
  return options;
}

// Options of another backend's type would lose the fields this backend
// does not know: refused, as torch refuses them (the plain
// RpcBackendOptions base is taken: it has only the common fields).
template <typename Expected>
void require_options_type(const rpc::BackendInit& init, const char* backend,
                          const char* expected) {
  const rpc::RpcBackendOptions& given = *init.options;
  if (dynamic_cast<const Expected*>(&given) != nullptr ||
      typeid(given) == typeid(rpc::RpcBackendOptions)) {
    return;
  }
  int status = 0;
  char* name = abi::__cxa_demangle(typeid(given).name(), nullptr, nullptr, &status);
  const std::string type = status == 0 && name ? name : typeid(given).name();
  std::free(name);
  throw std::invalid_argument(fmt::format(
      "RPC backend {}: worker \"{}\": the options are a {}, not a {}; its fields would be "
      "ignored (build them with construct_rpc_backend_options({}, ...))",
      backend, init.name, type, expected, backend));
}

std::unique_ptr<rpc::RpcAgent> init_pipe(const rpc::BackendInit& init) {
  require_options_type<PipeRpcBackendOptions>(init, "PIPE",
                                              "switchboard::agents::PipeRpcBackendOptions");
  PipeAgentOptions options;
  // Every PIPE setting at once (PipeSettings), then the common fields.
  if (const auto* typed = dynamic_cast<const PipeRpcBackendOptions*>(init.options.get())) {
    static_cast<PipeSettings&>(options) = static_cast<const PipeSettings&>(*typed);
  }
  options.rpc_timeout = init.options->rpc_timeout;
  SB_REQUIRE(init.options->num_worker_threads >= 1,
             "RPC backend PIPE: num_worker_threads must be at least 1, got {}",
             init.options->num_worker_threads);
  options.num_worker_threads = static_cast<size_t>(init.options->num_worker_threads);
  return std::make_unique<PipeAgent>(init.store, init.name, init.rank, init.world_size,
                                     options);
}

std::unique_ptr<rpc::RpcAgent> init_process_group(const rpc::BackendInit& init) {
  SB_REQUIRE(init.world_size.has_value(),
             "RPC backend PROCESS_GROUP: worker \"{}\": dynamic groups (no world_size) "
             "are not supported; use PIPE or pass world_size",
             init.name);
  require_options_type<ProcessGroupRpcBackendOptions>(
      init, "PROCESS_GROUP", "switchboard::agents::ProcessGroupRpcBackendOptions");
  ProcessGroupAgentOptions options;
  options.rpc_timeout = init.options->rpc_timeout;
  SB_REQUIRE(init.options->num_worker_threads >= 1,
             "RPC backend PROCESS_GROUP: num_worker_threads must be at least 1, got {}",
             init.options->num_worker_threads);
  options.num_worker_threads = static_cast<size_t>(init.options->num_worker_threads);
  if (const auto* typed =
          dynamic_cast<const ProcessGroupRpcBackendOptions*>(init.options.get())) {
    options.hostname = typed->hostname;
    options.iface = typed->iface;
  }
  return std::make_unique<ProcessGroupAgent>(init.store, init.name, init.rank,
                                             *init.world_size, options);
}

// Installs register_builtin_backends() at static-initialization time (the
// target is alwayslink, so this runs in every binary that links it).
const bool kInstalled = (rpc::set_builtin_backends(&register_builtin_backends), true);

}  // namespace

void PipeRpcBackendOptions::set_device_map(
    const std::string& worker, const std::vector<std::pair<std::string, std::string>>& map) {
  rpc::set_device_map(device_maps, worker, rpc::make_device_map(map, worker));
}

void PipeRpcBackendOptions::set_devices(const std::vector<std::string>& names) {
  std::vector<Device> parsed;
  for (const auto& name : names) parsed.push_back(Device::parse(name));
  devices = std::move(parsed);
}

// The built-in backends, in one place.
void register_builtin_backends() {
  rpc::register_backend("PIPE", pipe_options, init_pipe);
  rpc::register_backend("PROCESS_GROUP", process_group_options, init_process_group);
}

}  // namespace switchboard::agents
