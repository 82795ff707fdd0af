// store_server: a standalone TcpStoreServer, wire-compatible with PyTorch
// 1.13's TCPStore (point torch clients at it with is_master=False).
//
//   store_server [--host 127.0.0.1] [--port 0] [--max-value-bytes N] [--quiet]
//
// Prints exactly one line "port=<N>" on stdout once listening (port 0 picks
// an ephemeral port), so scripts and tests can read it. Logs to stderr: one
// line per connection open/close (unless --quiet) and per protocol error.
// SIGINT or SIGTERM stops it cleanly with exit code 0. Bad flags print the
// usage and exit with 2; a port that cannot be bound exits with 1.
#include <fmt/format.h>
#include <signal.h>
#include <sys/resource.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "common/error.h"
#include "store/tcp_store_server.h"

namespace {

constexpr const char* kUsage =
    "usage: store_server [--host ADDRESS] [--port PORT] [--max-value-bytes N] "
    "[--quiet]\n"
    "  --host ADDRESS        address to listen on (default 127.0.0.1; \"::\" for\n"
    "                        dual-stack IPv6+IPv4, as PyTorch binds)\n"
    "  --port PORT           port to listen on; 0 picks one (default 0)\n"
    "  --max-value-bytes N   close connections announcing larger values\n"
    "                        (default 1073741824)\n"
    "  --quiet               do not log connection open/close\n";

std::optional<uint64_t> parse_number(std::string_view text, uint64_t max) {
  if (text.empty() || text.size() > 20) return std::nullopt;
  uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    uint64_t digit = static_cast<uint64_t>(c - '0');
    if (value > (max - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
  }
  return value;
}

// Fills *options from argv; returns false (after printing why) on bad flags.
bool parse_flags(int argc, char** argv, switchboard::TcpStoreServerOptions* options) {
  for (int i = 1; i < argc; ++i) {
    std::string_view flag = argv[i];
    if (flag == "--quiet") {
      options->log_connections = false;
      continue;
    }
    if (flag != "--host" && flag != "--port" && flag != "--max-value-bytes") {
      fmt::print(stderr, "store_server: unknown flag '{}'\n", flag);
      return false;
    }
    if (i + 1 >= argc) {
      fmt::print(stderr, "store_server: {} needs a value\n", flag);
      return false;
    }
    std::string_view value = argv[++i];
    if (flag == "--host") {
      options->host = std::string(value);
    } else if (flag == "--port") {
      auto port = parse_number(value, 65535);
      if (!port) return fmt::print(stderr, "store_server: bad port '{}'\n", value), false;
      options->port = static_cast<uint16_t>(*port);
    } else {
      auto bytes = parse_number(value, UINT64_MAX);
      if (!bytes) return fmt::print(stderr, "store_server: bad size '{}'\n", value), false;
      options->limits.max_value_bytes = *bytes;
    }
  }
  return true;
}

// A server of thousands of connections needs as many descriptors: raise
// the soft limit to the hard one (often 1024 -> 524288).
void raise_fd_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  limit.rlim_cur = limit.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    spdlog::warn("store server: could not raise the open-file limit");
  }
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_default_logger(spdlog::stderr_color_mt("store_server"));
  switchboard::TcpStoreServerOptions options;
  options.log_connections = true;
  if (!parse_flags(argc, argv, &options)) {
    std::fputs(kUsage, stderr);
    return 2;
  }

  raise_fd_limit();

  // Block the stop signals before the server's thread starts, so it inherits
  // the mask and only sigwait() below receives them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::optional<switchboard::TcpStoreServer> server;
  try {
    server.emplace(options);
  } catch (const switchboard::Error& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
  fmt::print("port={}\n", server->port());
  std::fflush(stdout);
  spdlog::info("store server: listening on {}:{}", options.host, server->port());

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  spdlog::info("store server: {} received, stopping ({} connections open)",
               signal_number == SIGINT ? "SIGINT" : "SIGTERM", server->num_connections());
  server->stop();
  spdlog::info("store server: stopped after {} connections, {} protocol errors, {} keys",
               server->total_connections(), server->protocol_errors(),
               server->num_keys());
  return 0;
}
