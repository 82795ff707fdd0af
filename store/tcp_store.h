// TcpStore: a Store client of a TcpStoreServer or of a PyTorch TCPStore.
//
// Speaks PyTorch 1.13's TCPStore protocol: keys are sent with the "/" prefix
// the PyTorch client adds, so a key set here under "a" is what a PyTorch
// client reads as "a", and vice versa. get() is WAIT then GET, as PyTorch
// does, so a blocked get() is parked on the server (no polling).
//
// Server capabilities: against a server that knows APPEND, MULTI_GET,
// MULTI_SET and CANCEL_WAIT (ours, or a newer PyTorch), those are used.
// Against a PyTorch 1.13 server the client finds out (the server closes a
// probe connection on the unknown query code; the client reconnects) and
// emulates them: append as a compare_set loop, multi_get as one WAIT plus
// GETs, multi_set as SETs (not atomic as a whole). After a wait timeout the
// client sends CANCEL_WAIT when the server has it; otherwise it drops and
// reopens the connection, so a late STOP_WAITING can never be mistaken for
// the reply to a later request (PyTorch 1.13's own client has that flaw).
//
// Connecting: the constructor retries refused connections with exponential
// backoff until `connect_timeout` passes, so clients may start before the
// server. A broken connection is reopened by the next call.
//
// Thread safety: all methods are thread-safe; calls on one TcpStore are
// serialized on its single connection (use several TcpStores for parallel
// requests). A blocking get()/wait() holds that connection until it returns.
//
// Errors: TimeoutError (names the keys and the timeout), ConnectionError
// (server unreachable or gone; names host:port), NotFoundError,
// Error(kFailedPrecondition) for add on a non-integer value.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/auth.h"
#include "store/store.h"
#include "store/store_metrics.h"

namespace switchboard {

class TcpStoreServer;
namespace tcpstore {
struct Request;
}  // namespace tcpstore

struct TcpStoreOptions {
  // Start an in-process TcpStoreServer on host:port (port 0: ephemeral;
  // port() tells which) and connect to it, as PyTorch's is_master does.
  bool is_master = false;
  // With world_size set and wait_for_workers, every process adds 1 to the
  // "init/" key (PyTorch's convention) and the master waits until world_size
  // processes have, or throws TimeoutError after `timeout`.
  std::optional<int> world_size;
  bool wait_for_workers = true;
  // Default timeout of get()/wait(), and the connect timeout.
  std::chrono::milliseconds timeout = Store::kDefaultTimeout;
  // The job secret: each connection proves it to the server and checks the
  // server's proof (a server without it is refused). With is_master, the
  // server started requires it. Null: none (PyTorch's protocol).
  // Secret::from_environment() is SWITCHBOARD_SECRET_FILE's.
  std::shared_ptr<const Secret> secret;
};

class TcpStore : public Store {
 public:
  // Connects to host:port (and starts the server first when is_master).
  // Throws ConnectionError when the server cannot be reached in time.
  TcpStore(std::string host, uint16_t port, TcpStoreOptions options = {});
  ~TcpStore() override;

  using Store::set;
  using Store::wait;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected,
                    const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Timeout timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<Bytes>& values) override;
  void append(const std::string& key, const Bytes& value) override;
  // Every operation by kind (append emulated on PyTorch 1.13 counts its
  // compare_sets too), those that threw, and the time blocked in get, wait
  // and multi_get waiting for keys.
  std::shared_ptr<const StoreMetrics> metrics() const override;

  const std::string& host() const { return host_; }
  // The server's port (the bound ephemeral port for a master started on 0).
  uint16_t port() const { return port_; }
  // The in-process server when is_master, else null.
  TcpStoreServer* server() const { return server_.get(); }
  // Blocks until `world_size` processes have counted themselves in PyTorch's
  // "init/" key (every TcpStore constructed with world_size does), polling
  // the counter gently. Throws TimeoutError after timeout() saying how many
  // joined. The constructor calls it for a master with wait_for_workers.
  void wait_for_workers(int world_size);

  // Whether the server understands the post-1.13 query codes; probes the
  // server on first use.
  bool server_has_extensions();
  // Whether the server numbers the query types as PyTorch 2.x does (ours
  // and PyTorch 2.x's servers; the client then speaks that numbering),
  // rather than as PyTorch 1.13 does. Connects first if needed.
  bool server_speaks_torch2();

 private:
  class Connection;

  std::chrono::steady_clock::time_point request_deadline() const;
  // Sends a request whose reply is one i64.
  int64_t call_i64(const tcpstore::Request& request);
  // The next three expect connection_->mutex to be held.
  void explain_failed_add_locked(const std::string& key, int64_t delta);
  void wait_locked(const std::vector<std::string>& keys, Timeout timeout,
                   const char* op);
  std::vector<std::string> missing_locked(const std::vector<std::string>& keys);
  // Runs one operation of kind `op`, counting it (and its failure).
  template <typename F>
  auto counted(StoreOp op, F&& run) -> decltype(run()) {
    metrics_->started(op);
    try {
      return run();
    } catch (...) {
      metrics_->failed(op);
      throw;
    }
  }

  std::string host_;
  uint16_t port_;
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<Connection> connection_;
  const std::shared_ptr<StoreMetrics> metrics_ = std::make_shared<StoreMetrics>();
};

}  // namespace switchboard
