// The demo's metrics lines: a summary of rpc::get_metrics_snapshot(), and
// an excerpt of a real scrape of the worker's Prometheus endpoint.
#include <fmt/format.h>

#include <boost/asio/buffers_iterator.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <optional>
#include <sstream>
#include <string>

#include "examples/rpc_demo/roles.h"
#include "rpc/metrics.h"
#include "rpc/rpc.h"

namespace switchboard::rpc_demo {
namespace {

double micros(double seconds) { return seconds * 1e6; }

// The page at http://address:port/metrics (HTTP/1.0: the server closes the
// connection when it is done).
std::string http_get_metrics(const std::string& address, uint16_t port) {
  namespace asio = boost::asio;
  asio::io_context io;
  asio::ip::tcp::socket socket(io);
  socket.connect({asio::ip::make_address(address), port});
  const std::string request =
      fmt::format("GET /metrics HTTP/1.0\r\nHost: {}:{}\r\n\r\n", address, port);
  asio::write(socket, asio::buffer(request));
  asio::streambuf response;
  boost::system::error_code ec;
  asio::read(socket, response, ec);  // to EOF
  return std::string(asio::buffers_begin(response.data()),
                     asio::buffers_end(response.data()));
}

}  // namespace

void report_metrics(const std::string& who) {
  const rpc::RpcMetrics m = rpc::get_metrics_snapshot();
  for (const auto& [function, f] : m.functions) {
    if (f.calls_sent > 0) {
      say(who, "  metrics: sent {} {} calls, latency p50 {:.0f} us p99 {:.0f} us, {} failed",
          f.calls_sent, function, micros(f.latency.quantile(0.5)),
          micros(f.latency.quantile(0.99)), f.failures());
    }
    if (f.requests_served > 0) {
      say(who, "  metrics: served {} {} requests ({} with an error)", f.requests_served,
          function, f.requests_failed);
    }
  }
  say(who, "  metrics: pool {} threads ({} busy, {} blocked), {} calls in flight", m.pool.threads,
      m.pool.busy, m.pool.blocked, m.calls_in_flight);
  if (m.store) {
    uint64_t ops = 0;
    for (uint64_t n : m.store->operations) ops += n;
    say(who, "  metrics: store {} operations, {} waits (p99 {:.1f} ms)", ops,
        m.store->waits.count, m.store->waits.quantile(0.99) * 1e3);
  }
}

void print_scrape(const std::string& who, const std::string& metric) {
  const std::optional<uint16_t> port = rpc::metrics_port();
  if (!port) return;
  const std::string address = rpc::RpcContext::global().options()->metrics_address;
  say(who, "  scrape of http://{}:{}/metrics, {} lines:", address, *port, metric);
  std::istringstream page(http_get_metrics(address, *port));
  std::string line;
  while (std::getline(page, line)) {
    if (line.rfind(metric, 0) == 0) say(who, "    {}", line);
  }
}

}  // namespace switchboard::rpc_demo
