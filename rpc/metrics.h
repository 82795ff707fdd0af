// RPC metrics: what one worker counts about its calls, requests, peers,
// pool and store, and the snapshot users read.
//
//   rpc::RpcMetrics m = rpc::get_metrics_snapshot();   // structured
//   m.functions["add"].calls_sent;  m.functions["add"].latency.quantile(0.99);
//   std::map<std::string, double> flat = rpc::get_metrics();  // torch-like
//
// Who counts what:
//   - rpc::CallTable (every agent's pending-call table): calls sent,
//     answered and failed (by FailureKind) per function, their latency, the
//     requests served per function, calls in flight and requests being
//     handled. It counts into the AgentMetrics attached to the agent's pool
//     (RpcAgent does this), so every agent built on CallTable is counted.
//   - the transport: bytes and messages per peer and the connection's state,
//     through the PeerMetrics that AgentMetrics::peer() hands out.
//   - rpc::ThreadPool: threads, busy, blocked, queued (ThreadPool::stats()).
//   - the store client (TcpStore): operations and waits (StoreMetrics).
//
// Names: RpcMetrics::families() is the one list of every metric, its help
// text, type and labels; as_map() and the Prometheus exporter
// (rpc/metrics_exporter.h) are both written from it. docs/operations.md
// lists them.
//
// Thread safety: AgentMetrics and PeerMetrics may be used from any thread;
// PeerMetrics' updates are relaxed atomic adds (no lock). RpcMetrics and
// the other snapshots are plain values.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/metrics.h"
#include "common/mutex.h"
#include "rpc/thread_pool.h"
#include "store/store_metrics.h"

namespace switchboard::rpc {

// How a call failed, as its future's error says.
enum class FailureKind {
  kTimeout,      // TimeoutError
  kConnection,   // ConnectionError (the peer went away)
  kRemoteError,  // the callee answered with an error (its handler threw, ...)
  kCancelled,    // Error(kCancelled): this worker shut down
  kOther,        // anything else (e.g. a request the transport refused)
};
inline constexpr size_t kNumFailureKinds = 5;
// "timeout", "connection", "remote_error", "cancelled", "other".
std::string_view failure_kind_name(FailureKind kind);
// The kind of `error` (non-null), by its type.
FailureKind classify_failure(const std::exception_ptr& error);

// What a worker counted about one function, both directions.
struct FunctionMetrics {
  // Calls this worker made.
  uint64_t calls_sent = 0;
  uint64_t calls_succeeded = 0;                        // answered kResponse
  std::array<uint64_t, kNumFailureKinds> calls_failed{};  // by FailureKind
  // From send to the answer (kResponse or kError), in seconds. Calls that
  // failed without an answer (timeout, connection, cancelled) are not in it.
  HistogramSnapshot latency;
  // Requests this worker served (replies given), and those answered with
  // an error.
  uint64_t requests_served = 0;
  uint64_t requests_failed = 0;

  // Calls that failed with `kind`; all failed calls.
  uint64_t failures(FailureKind kind) const { return calls_failed[static_cast<size_t>(kind)]; }
  uint64_t failures() const;
  void merge(const FunctionMetrics& other);
};

enum class ConnectionState { kConnecting, kConnected, kClosed, kFailed };
inline constexpr size_t kNumConnectionStates = 4;
// "connecting", "connected", "closed", "failed".
std::string_view connection_state_name(ConnectionState state);

// The counters a transport keeps for one peer: bump them where bytes go in
// and out. Lock-free. What is sent and what is received are counted on
// different threads, so each pair has a cache line of its own.
struct PeerMetrics {
  alignas(64) std::atomic<uint64_t> bytes_sent{0};
  std::atomic<uint64_t> messages_sent{0};
  alignas(64) std::atomic<uint64_t> bytes_received{0};
  std::atomic<uint64_t> messages_received{0};
  alignas(64) std::atomic<ConnectionState> state{ConnectionState::kConnecting};

  // One message of `bytes` (everything that went on the wire for it).
  void sent(size_t bytes) {
    bytes_sent.fetch_add(bytes, std::memory_order_relaxed);
    messages_sent.fetch_add(1, std::memory_order_relaxed);
  }
  void received(size_t bytes) {
    bytes_received.fetch_add(bytes, std::memory_order_relaxed);
    messages_received.fetch_add(1, std::memory_order_relaxed);
  }
  void set_state(ConnectionState s) { state.store(s, std::memory_order_relaxed); }
};

struct PeerMetricsSnapshot {
  int id = -1;
  std::string name;
  ConnectionState state = ConnectionState::kConnecting;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t messages_sent = 0;
  uint64_t messages_received = 0;
};

// One metric as exported: a name, help text, type, and its series.
struct MetricFamily {
  enum class Type { kCounter, kGauge, kHistogram };
  struct Series {
    std::vector<std::pair<std::string, std::string>> labels;  // name, value
    double value = 0.0;           // counters and gauges
    HistogramSnapshot histogram;  // histograms
  };
  std::string name;
  std::string help;
  Type type = Type::kCounter;
  std::vector<Series> series;
};

// A worker's metrics at one moment: the structured form of get_metrics().
struct RpcMetrics {
  std::string worker;                               // this worker's name
  std::map<std::string, FunctionMetrics> functions;  // by function name
  uint64_t calls_in_flight = 0;       // sent, not yet answered or failed
  // Accepted, and the reply not yet handed back to the transport (the
  // caller may see the reply a moment before this drops).
  uint64_t requests_in_progress = 0;
  // Peers the transport reports (by id); empty for a transport that
  // reports none.
  std::vector<PeerMetricsSnapshot> peers;
  ThreadPool::Stats pool;
  // The rendezvous store's client, when it counts (TcpStore).
  std::optional<StoreMetricsSnapshot> store;

  // Every metric (see docs/operations.md), without the worker label.
  std::vector<MetricFamily> families() const;
  // The flat form, like torch's get_metrics(): one key per series,
  // `name{label="value",...}` (labels in the order families() gives them);
  // histograms as name_count, name_sum and name{...,quantile="0.5"} and
  // "0.99".
  std::map<std::string, double> as_map() const;
};

// Every metric name with a label set, as a key of as_map():
// `name{a="x",b="y"}` (`name` alone without labels); label values escaped
// as Prometheus does (\\, \" and \n).
std::string series_key(const std::string& name,
                       const std::vector<std::pair<std::string, std::string>>& labels);

// A worker's metrics while it runs: RpcAgent owns one and attaches it to its
// pool; CallTables and the transport count into it; RpcAgent's snapshot
// reads it.
class AgentMetrics {
 public:
  // Something that adds what it counted to a snapshot (a CallTable).
  class Source {
   public:
    virtual ~Source() = default;
    // Adds to out.functions, calls_in_flight and requests_in_progress.
    // Runs on the thread taking the snapshot.
    virtual void collect(RpcMetrics& out) const = 0;
  };

  explicit AgentMetrics(std::string worker);
  AgentMetrics(const AgentMetrics&) = delete;
  AgentMetrics& operator=(const AgentMetrics&) = delete;

  const std::string& worker() const { return worker_; }

  // For transports: the counters of peer `id` named `name`, created on the
  // first call (state kConnecting) and kept while this object lives (a peer
  // that left keeps its totals; set its state to kClosed). Takes a lock:
  // call it when a connection is made and keep the pointer, not per message.
  std::shared_ptr<PeerMetrics> peer(int id, const std::string& name) SB_EXCLUDES(mu_);

  // For CallTable: `source` is held weakly (a table that is gone stops
  // counting; its totals go with it).
  void add_source(std::weak_ptr<const Source> source) SB_EXCLUDES(mu_);

  // Fills out.functions, calls_in_flight, requests_in_progress and peers.
  // Does not hold this object's lock while sources collect.
  void collect(RpcMetrics& out) const SB_EXCLUDES(mu_);

 private:
  struct Peer {
    std::string name;
    std::shared_ptr<PeerMetrics> metrics;
  };

  const std::string worker_;
  mutable Mutex mu_;
  mutable std::vector<std::weak_ptr<const Source>> sources_ SB_GUARDED_BY(mu_);
  std::map<int, Peer> peers_ SB_GUARDED_BY(mu_);
};

}  // namespace switchboard::rpc
