#include "rpc/metrics_exporter.h"

#include <fmt/format.h>
#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <exception>
#include <utility>
#include <vector>

#include "common/error.h"

namespace switchboard::rpc {
namespace {

prometheus::MetricType type_of(MetricFamily::Type type) {
  switch (type) {
    case MetricFamily::Type::kCounter: return prometheus::MetricType::Counter;
    case MetricFamily::Type::kGauge: return prometheus::MetricType::Gauge;
    case MetricFamily::Type::kHistogram: return prometheus::MetricType::Histogram;
  }
  return prometheus::MetricType::Untyped;
}

prometheus::ClientMetric::Histogram histogram_of(const HistogramSnapshot& h) {
  prometheus::ClientMetric::Histogram out;
  out.sample_count = h.count;
  out.sample_sum = h.sum_seconds;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < kLatencyBucketBounds.size(); ++i) {
    cumulative += h.counts[i];
    out.bucket.push_back({cumulative, kLatencyBucketBounds[i]});
  }
  // The serializer writes the +Inf bucket from sample_count.
  return out;
}

// Our families as prometheus-cpp's, each series labelled with the worker.
std::vector<prometheus::MetricFamily> to_prometheus(const RpcMetrics& metrics) {
  std::vector<prometheus::MetricFamily> out;
  for (const MetricFamily& f : metrics.families()) {
    prometheus::MetricFamily family;
    family.name = f.name;
    family.help = f.help;
    family.type = type_of(f.type);
    for (const MetricFamily::Series& s : f.series) {
      prometheus::ClientMetric m;
      m.label.push_back({"worker", metrics.worker});
      for (const auto& [name, value] : s.labels) m.label.push_back({name, value});
      switch (f.type) {
        case MetricFamily::Type::kCounter: m.counter.value = s.value; break;
        case MetricFamily::Type::kGauge: m.gauge.value = s.value; break;
        case MetricFamily::Type::kHistogram: m.histogram = histogram_of(s.histogram); break;
      }
      family.metric.push_back(std::move(m));
    }
    out.push_back(std::move(family));
  }
  return out;
}

std::string host_port(const std::string& address, uint16_t port) {
  const bool ipv6 = address.find(':') != std::string::npos;
  return ipv6 ? fmt::format("[{}]:{}", address, port) : fmt::format("{}:{}", address, port);
}

}  // namespace

std::string to_prometheus_text(const RpcMetrics& metrics) {
  return prometheus::TextSerializer().Serialize(to_prometheus(metrics));
}

class MetricsExporter::Collectable final : public prometheus::Collectable {
 public:
  explicit Collectable(std::function<RpcMetrics()> source) : source_(std::move(source)) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    return to_prometheus(source_());
  }

 private:
  const std::function<RpcMetrics()> source_;
};

struct MetricsExporter::Server {
  explicit Server(const std::string& listen) : exposer(listen, /*num_threads=*/2) {}
  prometheus::Exposer exposer;
};

MetricsExporter::MetricsExporter(const std::string& address, uint16_t port,
                                 std::function<RpcMetrics()> source)
    : address_(address),
      collectable_(std::make_shared<Collectable>(std::move(source))) {
  try {
    server_ = std::make_unique<Server>(host_port(address, port));
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kUnavailable,
                fmt::format("metrics exporter: cannot listen on {}: {}",
                            host_port(address, port), e.what()));
  }
  const std::vector<int> ports = server_->exposer.GetListeningPorts();
  port_ = ports.empty() ? port : static_cast<uint16_t>(ports.front());
  server_->exposer.RegisterCollectable(collectable_);
}

MetricsExporter::~MetricsExporter() = default;

std::string MetricsExporter::url() const {
  return fmt::format("http://{}/metrics", host_port(address_, port_));
}

}  // namespace switchboard::rpc
