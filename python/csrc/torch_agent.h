// SwitchboardAgent: a torch::distributed::rpc::RpcAgent whose messages travel
// over Switchboard's PIPE agent: authenticated hellos (the job secret), the
// same-host shared-memory lane, heartbeats, TLS, device maps. torch builds
// rpc_sync, rpc_async, remote, RRefs, distributed autograd and the rest on
// top of this interface, so all of them run over it unchanged
// (docs/torch_rpc.md).
//
// How: each torch Message goes as one Switchboard request to the raw
// function "__torch_rpc" (FunctionRegistry::register_raw_function, the
// backend kit), its payload and tensors encoded by torch_message.h. The
// callee hands it to torch's RequestCallback on Switchboard's pool and
// answers with the callback's response (an EXCEPTION message when the
// callback failed, as TensorPipe does). Requests that arrive before
// start() wait for it, as RpcAgent requires.
//
// Groups: static (world_size given) and dynamic (world_size none: workers
// join and leave while the others run; getWorkerInfos() follows them).
//
// Security: torch's payloads are pickles, so a peer that can send a
// request can run code here. The constructor refuses to listen on an address beyond
// loopback without the job secret, unless the configuration says `insecure`
// (docs/torch_rpc.md, "Security").
//
// Errors: send() never throws; its future fails with a RuntimeError whose
// text names the worker and what failed ("RPC ran for more than set
// timeout (N ms)" for a timeout, as TensorPipe says it). The constructor
// throws std::runtime_error (RuntimeError in Python, as torch's agents) with
// init_rpc's reason: a name taken twice ("is not unique", TensorPipe's
// words), a rendezvous that timed out, a bad option, the security rule.
//
// Thread safety: every member function is thread-safe. torch's callbacks
// take the GIL where they run Python, on pool threads that keep their
// Python thread states (python_thread_state.h); join(), shutdown and the
// destructor release the GIL while they run, when the caller holds it, so
// that those threads can free their states as they exit.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/rpc/rpc_agent.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "rpc/future.h"
#include "rpc/rpc.h"

namespace switchboard::torch_rpc {

// The raw function every torch message is sent to.
inline constexpr const char* kTorchFunction = "__torch_rpc";

// What the Python options object says (python/switchboard/torch_rpc.py).
struct AgentConfig {
  std::string name;
  int rank = -1;
  std::optional<int> world_size;  // none: a dynamic group
  float rpc_timeout_seconds = 60;
  std::string init_method;
  // The host of the store (tcp:// or env://'s), for the listen address's
  // default rule; empty for file://.
  std::string store_host;
  int num_worker_threads = 16;
  // worker -> {source device -> target device}, as "cuda:0" strings.
  std::map<std::string, std::map<std::string, std::string>> device_maps;
  std::vector<std::string> devices;
  std::string secret_file;  // empty: SWITCHBOARD_SECRET_FILE's, else none
  std::string tls_cert_file, tls_key_file, tls_ca_file;
  std::optional<bool> shm;  // the same-host lane; none: on
  int heartbeat_interval_ms = 0;  // 0: PIPE's default
  int heartbeat_timeout_ms = -1;  // -1: PIPE's default; 0: off
  std::string listen_address;     // empty: PIPE's rule (agents/pipe/address.h)
  bool insecure = false;  // listen beyond loopback without a secret
};

class SwitchboardAgent final : public torch::distributed::rpc::RpcAgent {
 public:
  // Joins the group (the rendezvous runs through `store`); serves requests
  // once start() ran.
  SwitchboardAgent(const c10::intrusive_ptr<c10d::Store>& store, AgentConfig config,
                   std::unique_ptr<torch::distributed::rpc::RequestCallback> callback);
  ~SwitchboardAgent() override;

  c10::intrusive_ptr<torch::distributed::rpc::JitFuture> send(
      const torch::distributed::rpc::WorkerInfo& to,
      c10::intrusive_ptr<torch::distributed::rpc::Message> message,
      float rpc_timeout_seconds = torch::distributed::rpc::kUnsetRpcTimeout,
      const torch::distributed::rpc::DeviceMap& device_map = {}) override;

  const torch::distributed::rpc::WorkerInfo& getWorkerInfo(
      const std::string& name) const override;
  const torch::distributed::rpc::WorkerInfo& getWorkerInfo(
      torch::distributed::rpc::worker_id_t id) const override;
  std::vector<torch::distributed::rpc::WorkerInfo> getWorkerInfos() const override;
  using RpcAgent::getWorkerInfo;

  // Static group: waits, as TensorPipe's join does, until no worker of the
  // group has a call in flight (rounds over torch's store, each after this
  // worker's own calls completed); with `shutdown`, this worker then sends
  // no more, and PIPE stops in shutdownImpl() (torch checks its RRefs for
  // leaks in between). A request whose caller gave up on it (timed out) is
  // not waited for: its handler finishes while PIPE stops, and its reply
  // is dropped. Dynamic group, with `shutdown`: leaves the group
  // (PIPE's graceful shutdown). `timeout` (seconds, 0: none) bounds it:
  // TimeoutError past it.
  void join(bool shutdown = false, float timeout = 0) override;
  void sync() override {}
  void startImpl() override;
  void shutdownImpl() override;
  std::unordered_map<std::string, std::string> getMetrics() override;

  bool is_static_group() const { return config_.world_size.has_value(); }
  const AgentConfig& config() const { return config_; }

 private:
  void addGilWaitTime(std::chrono::microseconds wait) override;
  // join()'s rounds (see there); throws TimeoutError past `bound`.
  void wait_until_no_calls(std::optional<std::chrono::milliseconds> bound);
  // The raw function's body: one torch request, answered.
  rpc::Future<rpc::Message> serve(const rpc::Message& request);
  void remember(const rpc::WorkerInfo& info) SB_EXCLUDES(mu_);
  void forget(const std::string& name) SB_EXCLUDES(mu_);

  const AgentConfig config_;
  const c10::intrusive_ptr<c10d::Store> store_;
  // Set by start(); declared before context_, so that it outlives it.
  rpc::Promise<void> started_;
  rpc::RpcContext context_;
  // What the callbacks of calls and requests count; shared with them, so
  // that one that runs after the agent is gone (a handler past shutdown's
  // bound) touches live memory.
  struct Activity {
    // Calls this worker made that have not completed (join() waits for
    // none), and requests it serves.
    std::atomic<int64_t> client{0};
    std::atomic<int64_t> server{0};
    Mutex mu;
    CondVar calls_done;
    void call_ended() {
      if (--client == 0) {
        MutexLock lock(mu);
        calls_done.notify_all();
      }
    }
  };
  const std::shared_ptr<Activity> activity_ = std::make_shared<Activity>();
  std::atomic<int64_t> join_rounds_{0};
  std::atomic<bool> stopped_{false};

  mutable Mutex mu_;
  // Every worker ever seen, by name (entries are never erased: references
  // handed out stay valid); those in the group now; names by id.
  std::map<std::string, torch::distributed::rpc::WorkerInfo> infos_ SB_GUARDED_BY(mu_);
  std::map<std::string, bool> members_ SB_GUARDED_BY(mu_);
  std::map<int, std::string> names_by_id_ SB_GUARDED_BY(mu_);
  int64_t gil_waits_ SB_GUARDED_BY(mu_) = 0;
  std::chrono::microseconds gil_wait_total_ SB_GUARDED_BY(mu_){0};
};

}  // namespace switchboard::torch_rpc
