#include "agents/builtin_backends.h"

#include <cstdlib>
#include <memory>

#include "agents/process_group_agent.h"
#include "common/check.h"

namespace switchboard::agents {
namespace {

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

std::unique_ptr<rpc::RpcAgent> init_process_group(const rpc::BackendInit& init) {
  SB_REQUIRE(init.world_size.has_value(),
             "RPC backend PROCESS_GROUP: worker \"{}\": dynamic groups (no world_size) "
             "are not supported; use PIPE or pass world_size",
             init.name);
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
  if (options.hostname.empty() && options.iface.empty()) {
    if (const char* host = std::getenv("SWITCHBOARD_GLOO_HOSTNAME")) {
      options.hostname = host;
    }
  }
  return std::make_unique<ProcessGroupAgent>(init.store, init.name, init.rank,
                                             *init.world_size, options);
}

// Installs register_builtin_backends() at static-initialization time (the
// target is alwayslink, so this runs in every binary that links it).
const bool kInstalled = (rpc::set_builtin_backends(&register_builtin_backends), true);

}  // namespace

void register_builtin_backends() {
  rpc::register_backend("PROCESS_GROUP", process_group_options, init_process_group);
}

}  // namespace switchboard::agents
