#include "rpc/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "common/error.h"
#include "core/remote_error.h"

namespace switchboard::rpc {

std::string_view failure_kind_name(FailureKind kind) {
  switch (kind) {
    case FailureKind::kTimeout: return "timeout";
    case FailureKind::kConnection: return "connection";
    case FailureKind::kRemoteError: return "remote_error";
    case FailureKind::kCancelled: return "cancelled";
    case FailureKind::kOther: return "other";
  }
  return "other";
}

FailureKind classify_failure(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError&) {
    return FailureKind::kTimeout;
  } catch (const ConnectionError&) {
    return FailureKind::kConnection;
  } catch (const RemoteError&) {
    return FailureKind::kRemoteError;
  } catch (const Error& e) {
    return e.code() == ErrorCode::kCancelled ? FailureKind::kCancelled : FailureKind::kOther;
  } catch (...) {
    return FailureKind::kOther;
  }
}

uint64_t FunctionMetrics::failures() const {
  uint64_t n = 0;
  for (uint64_t k : calls_failed) n += k;
  return n;
}

void FunctionMetrics::merge(const FunctionMetrics& other) {
  calls_sent += other.calls_sent;
  calls_succeeded += other.calls_succeeded;
  for (size_t i = 0; i < kNumFailureKinds; ++i) calls_failed[i] += other.calls_failed[i];
  latency.merge(other.latency);
  requests_served += other.requests_served;
  requests_failed += other.requests_failed;
}

std::string_view connection_state_name(ConnectionState state) {
  switch (state) {
    case ConnectionState::kConnecting: return "connecting";
    case ConnectionState::kConnected: return "connected";
    case ConnectionState::kClosed: return "closed";
    case ConnectionState::kFailed: return "failed";
  }
  return "failed";
}

// ------------------------------------------------------------ families

namespace {

using Type = MetricFamily::Type;
using Labels = std::vector<std::pair<std::string, std::string>>;

MetricFamily family(std::string name, std::string help, Type type) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

void add(MetricFamily& f, Labels labels, double value) {
  f.series.push_back({std::move(labels), value, {}});
}

void add_histogram(MetricFamily& f, Labels labels, const HistogramSnapshot& h) {
  f.series.push_back({std::move(labels), 0.0, h});
}

void function_families(const RpcMetrics& m, std::vector<MetricFamily>& out) {
  auto sent = family("switchboard_rpc_calls_sent_total", "Calls this worker sent.",
                     Type::kCounter);
  auto ok = family("switchboard_rpc_calls_succeeded_total",
                   "Calls this worker sent that were answered with a response.",
                   Type::kCounter);
  auto failed = family("switchboard_rpc_calls_failed_total",
                       "Calls this worker sent that failed, by kind.", Type::kCounter);
  auto latency = family("switchboard_rpc_call_latency_seconds",
                        "From send to the answer (response or remote error).",
                        Type::kHistogram);
  auto served = family("switchboard_rpc_requests_served_total",
                       "Requests this worker answered.", Type::kCounter);
  auto served_failed = family("switchboard_rpc_requests_failed_total",
                              "Requests this worker answered with an error.",
                              Type::kCounter);
  for (const auto& [name, f] : m.functions) {
    const Labels fn = {{"function", name}};
    add(sent, fn, static_cast<double>(f.calls_sent));
    add(ok, fn, static_cast<double>(f.calls_succeeded));
    for (size_t k = 0; k < kNumFailureKinds; ++k) {
      add(failed, {{"function", name}, {"kind", std::string(failure_kind_name(FailureKind(k)))}},
          static_cast<double>(f.calls_failed[k]));
    }
    add_histogram(latency, fn, f.latency);
    add(served, fn, static_cast<double>(f.requests_served));
    add(served_failed, fn, static_cast<double>(f.requests_failed));
  }
  for (auto* f : {&sent, &ok, &failed, &latency, &served, &served_failed}) {
    out.push_back(std::move(*f));
  }
  auto in_flight = family("switchboard_rpc_calls_in_flight",
                          "Calls sent and not yet answered or failed.", Type::kGauge);
  add(in_flight, {}, static_cast<double>(m.calls_in_flight));
  out.push_back(std::move(in_flight));
  auto handling = family("switchboard_rpc_requests_in_progress",
                         "Requests accepted whose reply is not yet given.", Type::kGauge);
  add(handling, {}, static_cast<double>(m.requests_in_progress));
  out.push_back(std::move(handling));
}

void peer_families(const RpcMetrics& m, std::vector<MetricFamily>& out) {
  if (m.peers.empty()) return;
  auto bytes_sent = family("switchboard_rpc_peer_bytes_sent_total",
                           "Bytes sent to the peer.", Type::kCounter);
  auto bytes_received = family("switchboard_rpc_peer_bytes_received_total",
                               "Bytes received from the peer.", Type::kCounter);
  auto messages_sent = family("switchboard_rpc_peer_messages_sent_total",
                              "Messages sent to the peer.", Type::kCounter);
  auto messages_received = family("switchboard_rpc_peer_messages_received_total",
                                   "Messages received from the peer.", Type::kCounter);
  auto state = family("switchboard_rpc_peer_connection_state",
                      "1 for the state the connection to the peer is in, else 0.",
                      Type::kGauge);
  for (const auto& p : m.peers) {
    const Labels peer = {{"peer", p.name}};
    add(bytes_sent, peer, static_cast<double>(p.bytes_sent));
    add(bytes_received, peer, static_cast<double>(p.bytes_received));
    add(messages_sent, peer, static_cast<double>(p.messages_sent));
    add(messages_received, peer, static_cast<double>(p.messages_received));
    for (size_t s = 0; s < kNumConnectionStates; ++s) {
      const auto st = ConnectionState(s);
      add(state, {{"peer", p.name}, {"state", std::string(connection_state_name(st))}},
          p.state == st ? 1.0 : 0.0);
    }
  }
  for (auto* f : {&bytes_sent, &bytes_received, &messages_sent, &messages_received, &state}) {
    out.push_back(std::move(*f));
  }
}

void pool_families(const RpcMetrics& m, std::vector<MetricFamily>& out) {
  const std::pair<const char*, const char*> gauges[] = {
      {"switchboard_rpc_pool_threads", "Threads of the pool that runs handlers."},
      {"switchboard_rpc_pool_threads_busy", "Pool threads running a task."},
      {"switchboard_rpc_pool_threads_blocked",
       "Busy pool threads blocked waiting for other work (e.g. a nested rpc_sync)."},
      {"switchboard_rpc_pool_tasks_queued", "Tasks waiting for a pool thread."},
  };
  const size_t values[] = {m.pool.threads, m.pool.busy, m.pool.blocked, m.pool.queued};
  for (size_t i = 0; i < 4; ++i) {
    auto f = family(gauges[i].first, gauges[i].second, Type::kGauge);
    add(f, {}, static_cast<double>(values[i]));
    out.push_back(std::move(f));
  }
}

void store_families(const StoreMetricsSnapshot& s, std::vector<MetricFamily>& out) {
  auto ops = family("switchboard_store_operations_total",
                    "Store operations this worker's store client made, by kind.",
                    Type::kCounter);
  auto failures = family("switchboard_store_operation_failures_total",
                         "Store operations that failed, by kind.", Type::kCounter);
  for (size_t i = 0; i < kNumStoreOps; ++i) {
    const Labels op = {{"op", std::string(store_op_name(StoreOp(i)))}};
    add(ops, op, static_cast<double>(s.operations[i]));
    add(failures, op, static_cast<double>(s.failures[i]));
  }
  out.push_back(std::move(ops));
  out.push_back(std::move(failures));
  auto waits = family("switchboard_store_wait_seconds",
                      "Time blocked waiting for keys (get, wait, multi_get).",
                      Type::kHistogram);
  add_histogram(waits, {}, s.waits);
  out.push_back(std::move(waits));
  auto timeouts = family("switchboard_store_wait_timeouts_total",
                         "Waits for keys that timed out.", Type::kCounter);
  add(timeouts, {}, static_cast<double>(s.wait_timeouts));
  out.push_back(std::move(timeouts));
}

std::string escape_label_value(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::vector<MetricFamily> RpcMetrics::families() const {
  std::vector<MetricFamily> out;
  function_families(*this, out);
  peer_families(*this, out);
  pool_families(*this, out);
  if (store) store_families(*store, out);
  return out;
}

std::string series_key(const std::string& name, const Labels& labels) {
  if (labels.empty()) return name;
  std::string key = name + "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    key += fmt::format("{}{}=\"{}\"", i == 0 ? "" : ",", labels[i].first,
                       escape_label_value(labels[i].second));
  }
  return key + "}";
}

std::map<std::string, double> RpcMetrics::as_map() const {
  std::map<std::string, double> out;
  for (const MetricFamily& f : families()) {
    for (const MetricFamily::Series& s : f.series) {
      if (f.type != Type::kHistogram) {
        out[series_key(f.name, s.labels)] = s.value;
        continue;
      }
      out[series_key(f.name + "_count", s.labels)] = static_cast<double>(s.histogram.count);
      out[series_key(f.name + "_sum", s.labels)] = s.histogram.sum_seconds;
      for (const auto& [q, text] : {std::pair{0.5, "0.5"}, std::pair{0.99, "0.99"}}) {
        Labels labels = s.labels;
        labels.emplace_back("quantile", text);
        out[series_key(f.name, labels)] = s.histogram.quantile(q);
      }
    }
  }
  return out;
}

// ------------------------------------------------------------ AgentMetrics

AgentMetrics::AgentMetrics(std::string worker) : worker_(std::move(worker)) {}

std::shared_ptr<PeerMetrics> AgentMetrics::peer(int id, const std::string& name) {
  MutexLock lock(mu_);
  Peer& p = peers_[id];
  if (!p.metrics || p.name != name) {
    // A new worker under a reused id (dynamic groups never reuse ids; this
    // keeps a transport that does honest): its counts start from zero.
    p = Peer{name, std::make_shared<PeerMetrics>()};
  }
  return p.metrics;
}

void AgentMetrics::add_source(std::weak_ptr<const Source> source) {
  MutexLock lock(mu_);
  sources_.push_back(std::move(source));
}

void AgentMetrics::collect(RpcMetrics& out) const {
  std::vector<std::shared_ptr<const Source>> live;
  {
    MutexLock lock(mu_);
    std::erase_if(sources_, [&](const std::weak_ptr<const Source>& weak) {
      auto source = weak.lock();
      if (!source) return true;
      live.push_back(std::move(source));
      return false;
    });
    for (const auto& [id, p] : peers_) {
      const PeerMetrics& m = *p.metrics;
      out.peers.push_back({id, p.name, m.state.load(std::memory_order_relaxed),
                           m.bytes_sent.load(std::memory_order_relaxed),
                           m.bytes_received.load(std::memory_order_relaxed),
                           m.messages_sent.load(std::memory_order_relaxed),
                           m.messages_received.load(std::memory_order_relaxed)});
    }
  }
  for (const auto& source : live) source->collect(out);
}

}  // namespace switchboard::rpc
