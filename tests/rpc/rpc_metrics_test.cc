// Metrics through the user API and in Prometheus' format: the text
// exposition (every family, the worker label, histograms as buckets, sum
// and count), the HTTP endpoint scraped over 127.0.0.1 on an ephemeral port,
// and get_metrics()/get_metrics_snapshot() over LOCAL (calls, peers, pool),
// the endpoint started by init_rpc and its environment variable. Workers
// are threads of this process over one HashStore; nothing sleeps.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "rpc/metrics.h"
#include "rpc/metrics_exporter.h"
#include "rpc/rpc.h"
#include "store/hash_store.h"
#include "tests/rpc/local_agent.h"
#include "tests/util/threads.h"

using namespace switchboard;
using namespace std::chrono_literals;
using rpc::RpcContext;
using rpc::RpcMetrics;

namespace {

// One sample line of the text format: name{labels} value.
struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// Parses the sample lines of a text exposition (labels without escapes,
// which is all these tests write); comment lines are skipped.
std::vector<Sample> parse(const std::string& text) {
  std::vector<Sample> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    Sample s;
    const size_t brace = line.find('{');
    const size_t space = line.rfind(' ');
    REQUIRE(space != std::string::npos);
    s.name = line.substr(0, std::min(brace, space));
    if (brace != std::string::npos) {
      const std::string labels = line.substr(brace + 1, line.find('}') - brace - 1);
      size_t at = 0;
      while (at < labels.size()) {
        const size_t eq = labels.find('=', at);
        const size_t close = labels.find('"', eq + 2);
        s.labels[labels.substr(at, eq - at)] = labels.substr(eq + 2, close - eq - 2);
        at = close + 2;  // past '"' and ','
      }
    }
    s.value = std::stod(line.substr(space + 1));
    out.push_back(std::move(s));
  }
  return out;
}

// The value of the one sample named `name` whose labels include `labels`.
std::optional<double> find(const std::vector<Sample>& samples, const std::string& name,
                           const std::map<std::string, std::string>& labels) {
  for (const Sample& s : samples) {
    if (s.name != name) continue;
    bool match = true;
    for (const auto& [k, v] : labels) {
      auto it = s.labels.find(k);
      match = match && it != s.labels.end() && it->second == v;
    }
    if (match) return s.value;
  }
  return std::nullopt;
}

// GET http://127.0.0.1:port/path over HTTP/1.0 (the server closes when done);
// every read and write bounded. Returns the whole response, headers included;
// empty when the connection is refused.
std::string http_get(uint16_t port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  timeval bound{30, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof bound);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &bound, sizeof bound);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return "";
  }
  const std::string request =
      fmt::format("GET {} HTTP/1.0\r\nHost: 127.0.0.1:{}\r\n\r\n", path, port);
  REQUIRE(::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(request.size()));
  std::string response;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    REQUIRE(n >= 0);
    if (n == 0) break;
    response.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return response;
}

std::string body_of(const std::string& response) {
  const size_t end = response.find("\r\n\r\n");
  REQUIRE(end != std::string::npos);
  return response.substr(end + 4);
}

RpcMetrics sample_metrics() {
  RpcMetrics m;
  m.worker = "w0";
  rpc::FunctionMetrics& add = m.functions["add"];
  add.calls_sent = 3;
  add.calls_succeeded = 2;
  add.calls_failed[static_cast<size_t>(rpc::FailureKind::kTimeout)] = 1;
  LatencyHistogram latency;
  latency.record(40us);
  latency.record(2ms);
  add.latency = latency.snapshot();
  add.requests_served = 5;
  m.calls_in_flight = 1;
  m.peers.push_back({1, "w1", rpc::ConnectionState::kConnected, 100, 200, 1, 2});
  m.pool = {4, 1, 0, 0};
  m.store = StoreMetricsSnapshot{};
  m.store->operations[static_cast<size_t>(StoreOp::kGet)] = 7;
  return m;
}

rpc::BackendType local() { return testing::register_local_backend(); }

std::shared_ptr<rpc::RpcBackendOptions> local_options() {
  return rpc::construct_rpc_backend_options(local(), 30s, "env://",
                                            {{"num_worker_threads", "2"}});
}

}  // namespace

TEST_CASE("the text format has every family, the worker label, and histograms as buckets",
          "[metrics][prometheus]") {
  const std::string text = rpc::to_prometheus_text(sample_metrics());
  CHECK_THAT(text, Catch::Contains("# TYPE switchboard_rpc_calls_sent_total counter"));
  CHECK_THAT(text, Catch::Contains("# TYPE switchboard_rpc_call_latency_seconds histogram"));
  CHECK_THAT(text, Catch::Contains("# TYPE switchboard_rpc_calls_in_flight gauge"));
  const auto samples = parse(text);
  for (const Sample& s : samples) CHECK(s.labels.at("worker") == "w0");
  CHECK(find(samples, "switchboard_rpc_calls_sent_total", {{"function", "add"}}) == 3.0);
  CHECK(find(samples, "switchboard_rpc_calls_failed_total",
             {{"function", "add"}, {"kind", "timeout"}}) == 1.0);
  CHECK(find(samples, "switchboard_rpc_calls_failed_total",
             {{"function", "add"}, {"kind", "connection"}}) == 0.0);
  CHECK(find(samples, "switchboard_rpc_requests_served_total", {{"function", "add"}}) == 5.0);
  CHECK(find(samples, "switchboard_rpc_call_latency_seconds_count", {{"function", "add"}}) ==
        2.0);
  CHECK(find(samples, "switchboard_rpc_call_latency_seconds_bucket",
             {{"function", "add"}, {"le", "5e-05"}}) == 1.0);
  CHECK(find(samples, "switchboard_rpc_call_latency_seconds_bucket",
             {{"function", "add"}, {"le", "0.0025"}}) == 2.0);
  CHECK(find(samples, "switchboard_rpc_call_latency_seconds_bucket",
             {{"function", "add"}, {"le", "+Inf"}}) == 2.0);
  CHECK(find(samples, "switchboard_rpc_call_latency_seconds_sum", {{"function", "add"}})
            .value() == Approx(0.00204));
  CHECK(find(samples, "switchboard_rpc_peer_bytes_sent_total", {{"peer", "w1"}}) == 100.0);
  CHECK(find(samples, "switchboard_rpc_peer_messages_received_total", {{"peer", "w1"}}) ==
        2.0);
  CHECK(find(samples, "switchboard_rpc_peer_connection_state",
             {{"peer", "w1"}, {"state", "connected"}}) == 1.0);
  CHECK(find(samples, "switchboard_rpc_peer_connection_state",
             {{"peer", "w1"}, {"state", "closed"}}) == 0.0);
  CHECK(find(samples, "switchboard_rpc_pool_threads", {}) == 4.0);
  CHECK(find(samples, "switchboard_store_operations_total", {{"op", "get"}}) == 7.0);
  CHECK(find(samples, "switchboard_store_wait_seconds_count", {}) == 0.0);
}

TEST_CASE("the flat map has one key per series, and p50/p99 for histograms", "[metrics]") {
  const auto flat = sample_metrics().as_map();
  CHECK(flat.at("switchboard_rpc_calls_sent_total{function=\"add\"}") == 3.0);
  CHECK(flat.at("switchboard_rpc_calls_failed_total{function=\"add\",kind=\"timeout\"}") == 1.0);
  CHECK(flat.at("switchboard_rpc_call_latency_seconds_count{function=\"add\"}") == 2.0);
  CHECK(flat.at("switchboard_rpc_call_latency_seconds{function=\"add\",quantile=\"0.5\"}") ==
        Approx(0.00005));
  CHECK(flat.at("switchboard_rpc_call_latency_seconds{function=\"add\",quantile=\"0.99\"}") ==
        Approx(0.001 + 0.0015 * 0.98));
  CHECK(flat.at("switchboard_rpc_calls_in_flight") == 1.0);
  CHECK(flat.at("switchboard_rpc_peer_connection_state{peer=\"w1\",state=\"connected\"}") ==
        1.0);
  CHECK(rpc::series_key("m", {{"function", "say \"hi\"\\\n"}}) ==
        "m{function=\"say \\\"hi\\\"\\\\\\n\"}");
}

TEST_CASE("the exporter serves /metrics on an ephemeral port of 127.0.0.1, fresh at each scrape",
          "[metrics][prometheus]") {
  std::atomic<int> scrapes{0};
  rpc::MetricsExporter exporter("127.0.0.1", 0, [&] {
    RpcMetrics m = sample_metrics();
    m.functions["add"].calls_sent = static_cast<uint64_t>(++scrapes);
    return m;
  });
  REQUIRE(exporter.port() != 0);
  CHECK(exporter.url() == fmt::format("http://127.0.0.1:{}/metrics", exporter.port()));
  const std::string first = http_get(exporter.port(), "/metrics");
  CHECK_THAT(first, Catch::StartsWith("HTTP/1.1 200") || Catch::StartsWith("HTTP/1.0 200"));
  CHECK(find(parse(body_of(first)), "switchboard_rpc_calls_sent_total",
             {{"function", "add"}}) == 1.0);
  const std::string second = http_get(exporter.port(), "/metrics");
  CHECK(find(parse(body_of(second)), "switchboard_rpc_calls_sent_total",
             {{"function", "add"}}) == 2.0);
}

TEST_CASE("an exporter that cannot listen is Error(kUnavailable) naming the address",
          "[metrics][prometheus]") {
  // 192.0.2.1 (TEST-NET-1) is no address of this host.
  try {
    rpc::MetricsExporter exporter("192.0.2.1", 0, [] { return RpcMetrics{}; });
    FAIL("listened on 192.0.2.1");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kUnavailable);
    CHECK_THAT(e.what(), Catch::Contains("192.0.2.1:0"));
  }
}

TEST_CASE("get_metrics over LOCAL: calls, requests, peers and the pool", "[metrics][rpc]") {
  auto store = std::make_shared<HashStore>();
  std::vector<std::unique_ptr<RpcContext>> workers;
  for (int r = 0; r < 2; ++r) {
    workers.push_back(std::make_unique<RpcContext>());
    workers.back()->register_function("add", [](int64_t a, int64_t b) { return a + b; });
  }
  testing::rethrow_first(testing::on_threads(2, [&](int rank) {
    workers[rank]->init_rpc(fmt::format("w{}", rank), local(), rank, 2, local_options(), store);
  }));
  RpcContext& w0 = *workers[0];
  RpcContext& w1 = *workers[1];
  for (int64_t i = 0; i < 4; ++i) CHECK(w0.rpc_sync<int64_t>("w1", "add", i, int64_t{1}) == i + 1);

  const RpcMetrics m0 = w0.get_metrics_snapshot();
  const RpcMetrics m1 = w1.get_metrics_snapshot();
  CHECK(m0.worker == "w0");
  CHECK(m0.functions.at("add").calls_sent == 4);
  CHECK(m0.functions.at("add").calls_succeeded == 4);
  CHECK(m0.functions.at("add").latency.count == 4);
  CHECK(m1.functions.at("add").requests_served == 4);
  CHECK(m1.functions.at("add").calls_sent == 0);
  CHECK(m0.pool.threads >= 2);
  CHECK(!m0.store.has_value());  // a HashStore counts nothing
  // The transport's view: four requests out, four responses in, and the
  // callee saw the same bytes.
  REQUIRE(m0.peers.size() == 1);
  REQUIRE(m1.peers.size() == 1);
  const rpc::PeerMetricsSnapshot& to_w1 = m0.peers[0];
  const rpc::PeerMetricsSnapshot& to_w0 = m1.peers[0];
  CHECK(to_w1.name == "w1");
  CHECK(to_w1.state == rpc::ConnectionState::kConnected);
  CHECK(to_w1.messages_sent == 4);
  CHECK(to_w1.messages_received == 4);
  CHECK(to_w0.messages_received == 4);
  CHECK(to_w1.bytes_sent > 0);
  CHECK(to_w1.bytes_sent == to_w0.bytes_received);
  CHECK(to_w1.bytes_received == to_w0.bytes_sent);
  const auto flat = w0.get_metrics();
  CHECK(flat.at("switchboard_rpc_calls_sent_total{function=\"add\"}") == 4.0);
  CHECK(flat.at("switchboard_rpc_peer_messages_sent_total{peer=\"w1\"}") == 4.0);

  // w1 goes: w0's transport reports the connection closed, totals kept.
  w1.shutdown(/*graceful=*/false);
  const RpcMetrics after = w0.get_metrics_snapshot();
  CHECK(after.peers.at(0).state == rpc::ConnectionState::kClosed);
  CHECK(after.peers.at(0).messages_sent == 4);
  CHECK_THROWS_AS(w1.get_metrics(), Error);  // not initialized
  w0.shutdown(/*graceful=*/false);
}

TEST_CASE("metrics_port 0 serves the worker's metrics on an ephemeral port until shutdown",
          "[metrics][prometheus][rpc]") {
  RpcContext solo;
  solo.register_function("twice", [](int64_t x) { return 2 * x; });
  auto options = local_options();
  options->metrics_port = 0;
  options->metrics_address = "127.0.0.1";
  solo.init_rpc("solo", local(), 0, 1, options, std::make_shared<HashStore>());
  REQUIRE(solo.metrics_port().has_value());
  const uint16_t port = *solo.metrics_port();
  CHECK(port != 0);
  CHECK(solo.rpc_sync<int64_t>("solo", "twice", int64_t{21}) == 42);
  const auto samples = parse(body_of(http_get(port, "/metrics")));
  CHECK(find(samples, "switchboard_rpc_calls_sent_total",
             {{"worker", "solo"}, {"function", "twice"}}) == 1.0);
  CHECK(find(samples, "switchboard_rpc_requests_served_total",
             {{"worker", "solo"}, {"function", "twice"}}) == 1.0);
  CHECK(find(samples, "switchboard_rpc_call_latency_seconds_count",
             {{"worker", "solo"}, {"function", "twice"}}) == 1.0);
  solo.shutdown();
  CHECK(http_get(port, "/metrics").empty());  // refused: nothing listens
}

TEST_CASE("SWITCHBOARD_METRICS_PORT: unset or 0 is off, else the port plus LOCAL_RANK (or "
          "SLURM_LOCALID); a bad "
          "value is refused naming it",
          "[metrics][rpc]") {
  struct Restore {
    ~Restore() {
      ::unsetenv("SWITCHBOARD_METRICS_PORT");
      ::unsetenv("LOCAL_RANK");
      ::unsetenv("SLURM_LOCALID");
    }
  } restore;
  auto store = std::make_shared<HashStore>();
  RpcContext solo;
  ::unsetenv("SWITCHBOARD_METRICS_PORT");
  solo.init_rpc("solo", local(), 0, 1, local_options(), std::make_shared<HashStore>());
  CHECK(!solo.metrics_port().has_value());
  solo.shutdown();
  ::setenv("SWITCHBOARD_METRICS_PORT", "0", 1);
  solo.init_rpc("solo", local(), 0, 1, local_options(), std::make_shared<HashStore>());
  CHECK(!solo.metrics_port().has_value());
  solo.shutdown();
  // Set: that port plus LOCAL_RANK. Held here, so the worker cannot listen
  // there, and its error names the port.
  const int held = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof addr;
  REQUIRE(::bind(held, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(held, 1) == 0);
  REQUIRE(::getsockname(held, reinterpret_cast<sockaddr*>(&addr), &length) == 0);
  const int port = ntohs(addr.sin_port);
  ::setenv("SWITCHBOARD_METRICS_PORT", std::to_string(port - 2).c_str(), 1);
  ::setenv("LOCAL_RANK", "2", 1);
  CHECK_THROWS_WITH(
      solo.init_rpc("solo", local(), 0, 1, local_options(), std::make_shared<HashStore>()),
      Catch::Contains(fmt::format("127.0.0.1:{}", port)));
  ::unsetenv("LOCAL_RANK");
  // Under srun: SLURM_LOCALID stands in for LOCAL_RANK.
  ::setenv("SLURM_LOCALID", "2", 1);
  CHECK_THROWS_WITH(
      solo.init_rpc("solo", local(), 0, 1, local_options(), std::make_shared<HashStore>()),
      Catch::Contains(fmt::format("127.0.0.1:{}", port)));
  ::unsetenv("SLURM_LOCALID");
  ::close(held);
  ::setenv("SWITCHBOARD_METRICS_PORT", "http", 1);
  CHECK_THROWS_WITH(
      solo.init_rpc("solo", local(), 0, 1, local_options(), std::make_shared<HashStore>()),
      Catch::Contains("SWITCHBOARD_METRICS_PORT") && Catch::Contains("\"http\""));
  CHECK(!solo.initialized());
}
