// store_server: a standalone TcpStoreServer, wire-compatible with PyTorch
// 1.13's TCPStore (point torch clients at it with is_master=False).
//
//   store_server [--host 127.0.0.1] [--port 0] [--max-value-bytes N] [--quiet]
//
// Prints exactly one line "port=<N>" on stdout once listening (port 0 picks
// an ephemeral port), so scripts and tests can read it. Logs to stderr: one
// line per connection open/close (unless --quiet) and per protocol error.
// SIGINT or SIGTERM stops it cleanly with exit code 0. Bad flags print what
// is wrong and the usage on stderr and exit with 2; a port that cannot be
// bound exits with 1. `store_server --help` lists the flags.
#include <fmt/format.h>
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <cstdio>
#include <optional>

#include "common/auth.h"
#include "common/cli.h"
#include "common/error.h"
#include "common/logging.h"
#include "store/tcp_store_server.h"

namespace {

constexpr const char* kDescription =
    "A standalone TcpStoreServer, wire-compatible with PyTorch 1.13's TCPStore.\n"
    "Prints \"port=<N>\" on stdout once listening; logs to stderr. SIGINT or\n"
    "SIGTERM stops it (exit 0).";

constexpr const char* kFooter =
    "Exit status: 0 stopped by SIGINT or SIGTERM; 1 the port cannot be bound;\n"
    "2 usage error.";

// Declares the flags on `app`; they fill *options, which must outlive it.
void add_flags(CLI::App& app, switchboard::TcpStoreServerOptions* options) {
  app.name("store_server");
  app.description(kDescription);
  app.footer(kFooter);
  switchboard::cli::set_synopsis(
      app,
      "store_server [--host ADDRESS] [--port PORT] [--secret-file PATH] [--max-value-bytes N] "
      "[--quiet]");
  app.add_option(
         "--host", options->host,
         "address to listen on (\"::\" for dual-stack IPv6+IPv4, as PyTorch binds)")
      ->type_name("ADDRESS")
      ->check(switchboard::cli::non_empty("an address"));
  app.add_option("--port", options->port, "port to listen on; 0 picks one")
      ->type_name("PORT")
      ->check(switchboard::cli::in_range(0, 65535));
  app.add_option_function<std::string>(
         "--secret-file",
         [options](const std::string& path) {
           options->secret =
               std::make_shared<const switchboard::Secret>(switchboard::Secret::from_file(path));
         },
         "the job secret every client must prove (a file only its owner can read); "
         "default: $SWITCHBOARD_SECRET_FILE, else none (PyTorch's protocol)")
      ->type_name("PATH");
  app.add_option("--max-value-bytes", options->limits.max_value_bytes,
                 "close connections announcing larger values")
      ->type_name("N")
      ->check(switchboard::cli::at_least(0));
  app.add_flag_callback(
      "--quiet", [options] { options->log_connections = false; },
      "do not log connection open/close");
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
  // Logs go to stderr: stdout carries the "port=<N>" line. The logger is
  // set first so that init_logging()'s warnings go there too.
  spdlog::set_default_logger(spdlog::stderr_color_mt("store_server"));
  switchboard::init_logging("store_server");
  switchboard::TcpStoreServerOptions options;
  options.log_connections = true;
  try {
    options.secret = switchboard::Secret::from_environment();
  } catch (const std::invalid_argument& e) {
    spdlog::error("store server: {}", e.what());
    return 2;
  }
  CLI::App app;
  add_flags(app, &options);
  if (auto status =
          switchboard::cli::report(app, switchboard::cli::parse(app, argc, argv))) {
    return *status;
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
  spdlog::info("store server: listening on {}:{}{}", options.host, server->port(),
               options.secret ? ", clients must prove the job secret" : "");

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
