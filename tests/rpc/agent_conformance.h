// The RpcAgent conformance suite: one set of test cases (agent_conformance.cc)
// over the RpcAgent interface (rpc/agent.h), run against every backend:
// LOCAL, PROCESS_GROUP, PIPE, and a user's own. Where the RPC conformance
// suite (rpc_conformance.h) drives the public API, this one drives agents
// directly: send(), requests and their handlers, timeouts, errors, join(),
// shutdown(), tensors, self-sends, unknown workers, handler failures.
//
// Running it for a backend takes a test binary that links
// //tests/rpc:agent_conformance and defines agent_factory():
//
//   #include "tests/rpc/agent_conformance.h"
//   namespace switchboard::agent_conformance {
//   AgentFactory& agent_factory() {
//     static RegistryAgentFactory factory("MY_BACKEND", {{"num_worker_threads", "4"}});
//     return factory;
//   }
//   }  // namespace switchboard::agent_conformance
//
// Workers are agents on threads of the test process; the workers of one
// group meet through one fresh HashStore. A backend that documents that it
// cannot do something the suite asks declares it (AgentFactory::limitation,
// max_world_size): the cases that need it print "skipped: <reason>" and
// return, so a skip is always visible in the test log, never a silent pass.
//
// Thread safety: make_agent() is called from several threads at once (one
// per rank of the group being made); the rest from the test's thread.
#pragma once

#include <chrono>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "rpc/agent.h"
#include "rpc/backend_registry.h"
#include "rpc/metrics.h"
#include "store/store.h"

namespace switchboard::agent_conformance {

// What a backend may document that it does not do. Each names the cases
// that skip for it.
enum class Limitation {
  // join()'s errors cannot name the workers that did not arrive or that
  // shut down (cases "join's timeout names the workers that did not
  // arrive", "join's failure names the workers that shut down without
  // joining").
  kJoinNamesMissingWorkers,
  // join() cannot tell that a worker shut down without joining: it waits
  // until its timeout (the cases "join fails with ConnectionError, once the
  // workers left have met, when a worker shut down without joining" and the
  // one naming them).
  kJoinSeesWorkersThatShutDown,
  // The per-peer metrics cannot tell that a peer shut down: its entry
  // stays "connected" (case "per-peer metrics count an echo ...").
  kPeerMetricsSeePeerShutdown,
};

// Which worker of which group an AgentFactory makes.
struct AgentSpec {
  // Fresh for each group, shared by its workers.
  std::shared_ptr<Store> store;
  std::string name;
  int rank = 0;
  int world_size = 1;
  // Bounds the rendezvous (every rank arriving); then TimeoutError naming
  // the ranks that did not come.
  std::chrono::milliseconds rendezvous_timeout{60'000};
};

// Makes the agents of one backend for the suite.
class AgentFactory {
 public:
  virtual ~AgentFactory() = default;

  // The backend's name, for messages ("PIPE").
  virtual std::string name() const = 0;

  // One worker of a static group, not started. The suite calls it for
  // every rank of the group at once, one thread each; it returns once the
  // group's rendezvous is complete (or throws what construction threw:
  // std::invalid_argument for a duplicate name, naming the name and its
  // ranks on every worker; TimeoutError naming the missing ranks). The
  // caller owns the agent.
  virtual std::unique_ptr<rpc::RpcAgent> make_agent(const AgentSpec& spec) = 0;

  // The most workers a group may have; cases that need more skip.
  virtual int max_world_size() const { return std::numeric_limits<int>::max(); }

  // Why the backend does not do `what`, or nullopt when it does.
  virtual std::optional<std::string> limitation(Limitation what) const {
    (void)what;
    return std::nullopt;
  }

  // What the ConnectionError of a call to `worker`, which shut down (while
  // the call was pending, or before it), says about the worker, after the
  // call's "rpc to "w1" function "f": " prefix. The default is the wording
  // of LOCAL and PROCESS_GROUP.
  virtual std::string shut_down_peer_phrase(const std::string& worker) const;

  // The state of a worker's per-peer metrics entry for a peer that shut
  // down cleanly (rpc/metrics.h). The default, kClosed, is LOCAL's and
  // PIPE's (a goodbye); see kPeerMetricsSeePeerShutdown.
  virtual rpc::ConnectionState shut_down_peer_state() const {
    return rpc::ConnectionState::kClosed;
  }
};

// An AgentFactory for a backend registered with rpc::register_backend: it
// builds options with rpc::construct_rpc_backend_options(backend,
// rendezvous_timeout, "env://", extras) and the agent with
// rpc::init_backend. `setup` (may be empty) runs once, before the first
// agent is made (e.g. registering the backend).
class RegistryAgentFactory : public AgentFactory {
 public:
  RegistryAgentFactory(std::string backend, rpc::Extras extras,
                       std::function<void()> setup = nullptr);

  std::string name() const override { return backend_; }
  std::unique_ptr<rpc::RpcAgent> make_agent(const AgentSpec& spec) override;

 private:
  const std::string backend_;
  const rpc::Extras extras_;
  const std::function<void()> setup_;
  std::once_flag setup_once_;
};

// The backend under test: defined by each test binary that links the suite.
AgentFactory& agent_factory();

}  // namespace switchboard::agent_conformance
