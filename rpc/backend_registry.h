// The BackendType registry: PyTorch's torch.distributed.rpc.backend_registry
// in C++.
//
// A backend is a name, an options constructor and an agent initializer:
//
//   BackendType MY = register_backend("MY", construct_my_options, init_my);
//   auto options = construct_rpc_backend_options(MY, 10s, "env://",
//                                                {{"num_worker_threads", "8"}});
//   init_rpc("w0", MY, rank, world_size, options);
//
// C++ has no kwargs: backend-specific options travel as a subclass of
// RpcBackendOptions, built by the backend's own constructor from the common
// fields and a small string map of extras. Every backend must refuse an
// extra it does not know, naming it (ExtrasReader does the bookkeeping).
//
// Built-ins (PIPE, PROCESS_GROUP) are registered by agents/ (the one place
// that lists them, agents/builtin_backends.cc) through
// set_builtin_backends(), run once before the registry is first consulted.
// rpc/ names no concrete agent; the library users link (//:switchboard)
// wires the two together.
//
// Errors: RegistryError ("RPC backend NAME: already registered", unknown
// names with the list of registered ones); std::invalid_argument for bad
// extras or options, naming the key and the value.
//
// Thread safety: every function is thread-safe. Handlers run without the
// registry's lock held.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "rpc/agent.h"

namespace switchboard {
class Store;
}

namespace switchboard::rpc {

// PyTorch's default rpc_timeout (60 s); 0 means no timeout, as in PyTorch.
inline constexpr std::chrono::milliseconds kDefaultRpcTimeout{60'000};
inline constexpr int kDefaultNumWorkerThreads = 16;

// The options every backend shares; backends derive their own.
struct RpcBackendOptions {
  virtual ~RpcBackendOptions() = default;
  std::chrono::milliseconds rpc_timeout = kDefaultRpcTimeout;
  // "env://" (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE; SLURM and Open MPI
  // variables too), "tcp://host:port" or "file://path"; ignored when
  // init_rpc is given a Store.
  std::string init_method = "env://";
  int num_worker_threads = kDefaultNumWorkerThreads;
  // The Prometheus metrics endpoint (docs/operations.md#metrics), served by
  // init_rpc until shutdown. nullopt: the SWITCHBOARD_METRICS_PORT
  // environment variable decides (unset, empty or 0: off; else that port
  // plus LOCAL_RANK when the launcher set it, so that the workers of one
  // host each get their own); 0: on, on a port the kernel picks
  // (RpcContext::metrics_port() tells which); 1 to 65535: that port.
  std::optional<int> metrics_port;
  // The address the endpoint listens on; empty: SWITCHBOARD_METRICS_ADDRESS,
  // else 127.0.0.1.
  std::string metrics_address;
};

using Extras = std::map<std::string, std::string>;

// Reads typed values out of the extras and remembers which keys it used;
// finish() throws std::invalid_argument naming the first key nobody read:
//   RPC backend "PIPE": unknown option "num_worker_thread" (known: ...)
class ExtrasReader {
 public:
  ExtrasReader(std::string backend, const Extras& extras);
  std::optional<std::string> get(const std::string& key);
  std::optional<int64_t> get_int(const std::string& key);
  std::optional<bool> get_bool(const std::string& key);  // true/false/1/0
  void finish() const;

 private:
  std::string backend_;
  Extras extras_;  // a copy: readers may be built from temporaries
  std::set<std::string> known_;
};

// Builds a backend's options from the common fields and its extras.
using ConstructOptionsHandler = std::function<std::shared_ptr<RpcBackendOptions>(
    std::chrono::milliseconds rpc_timeout, const std::string& init_method,
    const Extras& extras)>;

// What init_backend passes to a backend's initializer.
struct BackendInit {
  std::shared_ptr<Store> store;   // the group's rendezvous store
  std::string name;               // this worker's name (already validated)
  int rank = -1;                  // -1 in a dynamic group until assigned
  std::optional<int> world_size;  // nullopt: dynamic group
  std::shared_ptr<RpcBackendOptions> options;
};

using InitBackendHandler =
    std::function<std::unique_ptr<RpcAgent>(const BackendInit& init)>;

// A registered backend: a handle naming one entry of the table. Values
// compare by name (upper case, as PyTorch's enum members).
class BackendType {
 public:
  const std::string& name() const { return name_; }
  friend bool operator==(const BackendType&, const BackendType&) = default;

 private:
  friend class BackendRegistryAccess;
  explicit BackendType(std::string name) : name_(std::move(name)) {}
  std::string name_;
};

// Adds `name` (stored upper case) and returns its BackendType. Throws
// RegistryError "RPC backend NAME: already registered" for a duplicate and
// std::invalid_argument for an empty name or handler.
BackendType register_backend(std::string_view name,
                             ConstructOptionsHandler construct_options_handler,
                             InitBackendHandler init_backend_handler);
bool backend_registered(std::string_view name);
// The BackendType of `name` (any case); RegistryError naming it and the
// registered backends when unknown.
BackendType backend_type(std::string_view name);
std::vector<BackendType> registered_backends();

// Dispatch through the table (RegistryError when `backend` was never
// registered in this process).
std::shared_ptr<RpcBackendOptions> construct_rpc_backend_options(
    const BackendType& backend,
    std::chrono::milliseconds rpc_timeout = kDefaultRpcTimeout,
    const std::string& init_method = "env://", const Extras& extras = {});
std::unique_ptr<RpcAgent> init_backend(const BackendType& backend,
                                       const BackendInit& init);

// Installed by agents/ at static-initialization time; the registry runs it
// once, before it answers its next question (also when installed after the
// registry was first consulted). Passing a second registrar replaces the
// first if it has not run yet; installing one that already ran does nothing.
void set_builtin_backends(void (*registrar)());

}  // namespace switchboard::rpc
