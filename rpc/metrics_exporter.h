// Prometheus exposition of a worker's metrics (rpc/metrics.h), with
// Debian's prometheus-cpp: the text format for anyone who wants the page,
// and a small HTTP listener that Prometheus scrapes.
//
//   MetricsExporter exporter("127.0.0.1", 0, [&] { return agent.metrics_snapshot(); });
//   // curl http://127.0.0.1:<exporter.port()>/metrics
//
// Every series carries worker="<RpcMetrics::worker>"; histograms are
// exported as name_bucket{le=...}, name_sum and name_count.
//
// init_rpc starts one when metrics are enabled (RpcBackendOptions::
// metrics_port, SWITCHBOARD_METRICS_PORT); see docs/operations.md.
//
// Threads: the listener runs on prometheus-cpp's (civetweb's) own threads,
// which call `source` once per scrape; the destructor stops listening and
// joins them. Thread safety: port() and url() may be called from any
// thread; construct and destroy from one.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "rpc/metrics.h"

namespace switchboard::rpc {

// `metrics` in Prometheus' text exposition format (version 0.0.4).
std::string to_prometheus_text(const RpcMetrics& metrics);

class MetricsExporter {
 public:
  // Listens on `address` (numeric IPv4 or IPv6) and `port` (0: one the
  // kernel picks; port() says which) and answers GET /metrics with
  // source()'s metrics, taken at each scrape. `source` must be callable from
  // the listener's threads until the destructor returns. Throws
  // Error(kUnavailable) naming the address when it cannot listen there.
  MetricsExporter(const std::string& address, uint16_t port,
                  std::function<RpcMetrics()> source);
  ~MetricsExporter();
  MetricsExporter(const MetricsExporter&) = delete;
  MetricsExporter& operator=(const MetricsExporter&) = delete;

  uint16_t port() const { return port_; }
  // "http://ADDRESS:PORT/metrics" (IPv6 addresses in brackets).
  std::string url() const;

 private:
  class Collectable;

  std::string address_;
  uint16_t port_ = 0;
  std::shared_ptr<Collectable> collectable_;
  struct Server;
  std::unique_ptr<Server> server_;
};

}  // namespace switchboard::rpc
