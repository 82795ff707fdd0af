// The RPC conformance suite: the same test cases (rpc_conformance.cc) run
// over every backend. Each test binary links the suite and defines
// conformance_backend() for its backend; workers are RpcContexts on threads
// of the test process, meeting through one HashStore.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "rpc/backend_registry.h"
#include "rpc/rpc.h"
#include "store/store.h"

namespace switchboard::conformance {

struct Backend {
  std::string name;      // as registered, e.g. "PROCESS_GROUP"
  rpc::Extras extras;    // e.g. {{"hostname", "127.0.0.1"}}
  // Runs once before the first cluster (e.g. registers a user backend).
  std::function<void()> setup;
};

// Defined by each test binary.
const Backend& conformance_backend();

// The backend under test (runs its setup first, once).
rpc::BackendType backend_under_test();

// Builds options for the backend under test: its extras, plus these.
std::shared_ptr<rpc::RpcBackendOptions> make_options(
    std::chrono::milliseconds rpc_timeout = std::chrono::milliseconds(30'000),
    const rpc::Extras& more = {});

// n workers "w0".."w<n-1>" of a static group. `prepare(rank, context)` runs
// before init_rpc (register functions there). The destructor shuts every
// worker down gracefully and concurrently (then ungracefully, should that
// fail).
class Cluster {
 public:
  using Prepare = std::function<void(int rank, rpc::RpcContext& context)>;
  Cluster(int n, const Prepare& prepare,
          std::shared_ptr<rpc::RpcBackendOptions> options = make_options());
  ~Cluster();

  rpc::RpcContext& operator[](int rank) { return *contexts_.at(rank); }
  int size() const { return static_cast<int>(contexts_.size()); }
  const std::shared_ptr<Store>& store() const { return store_; }
  // Graceful shutdown of every worker, concurrently; rethrows the first
  // failure. The destructor then has nothing left to do.
  void shutdown_all();

 private:
  std::shared_ptr<Store> store_;
  std::vector<std::unique_ptr<rpc::RpcContext>> contexts_;
};

}  // namespace switchboard::conformance
