#include "tools/bench/store_bench.h"

#include <fmt/format.h>
#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>

#include "common/cli.h"
#include "tools/bench/process.h"
#include "tools/bench/report.h"
#include "tools/bench/store_load.h"

namespace switchboard::bench {

namespace {

constexpr const char* kHost = "127.0.0.1";
constexpr int kClientCounts[] = {1, 16, 64};
// The goal: our server at least this many times PyTorch's at 64 clients.
constexpr double kTargetRatioC64 = 2.0;
// File descriptors the held-connections section needs in this process: one
// socket per connection plus the Asio reactor's own fds (epoll, eventfd,
// timerfd) of each connection's private io_context, and some to spare.
rlim_t fds_needed() {
  HeldOptions held;
  return static_cast<rlim_t>(held.threads * held.per_thread) * 4 + 256;
}

struct Flags {
  double seconds = 2.0;  // measured time per throughput figure
};

// Raises RLIMIT_NOFILE's soft limit to the hard limit, here and so in the
// servers we spawn (children inherit it). Returns the resulting soft limit.
rlim_t raise_fd_limit() {
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
  getrlimit(RLIMIT_NOFILE, &limit);
  return limit.rlim_cur;
}

// The two servers, running until this object is destroyed.
struct Servers {
  explicit Servers(const std::string& argv0)
      : ours({find_runfile(argv0, "tools/store_server/store_server", "SB_STORE_SERVER"),
              "--host", kHost, "--port", "0", "--quiet"}),
        torch({torch_python(),
               find_runfile(argv0, "tools/torch_store_server/torch_store_server.py",
                            "SB_TORCH_STORE_SERVER"),
               "--until", "stdin"}) {
    ours_port = ours.read_port(std::chrono::seconds(30));
    torch_port = torch.read_port(std::chrono::seconds(120));  // imports torch
  }
  ChildProcess ours;
  ChildProcess torch;
  uint16_t ours_port = 0;
  uint16_t torch_port = 0;
};

// One throughput figure: one server at one client count.
struct Figure {
  double ops_per_s = 0;
  // CPU time (user + system, so including the kernel's loopback TCP work)
  // per completed call, warm-up included: of the server process, and of this
  // process, i.e. the TcpStore clients. Tells which side the CPUs go to.
  double server_us_per_op = 0;
  double client_us_per_op = 0;
};

double own_cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

Figure measure(const ChildProcess& server, uint16_t port, int clients, const Flags& flags) {
  LoadOptions options;
  options.clients = clients;
  options.measure = Seconds(flags.seconds);
  double server_cpu = server.cpu_seconds();
  double client_cpu = own_cpu_seconds();
  LoadResult load = run_store_load(kHost, port, options);
  double us_per_op = 1e6 / static_cast<double>(std::max<uint64_t>(load.all_ops, 1));
  return Figure{load.ops_per_s(), (server.cpu_seconds() - server_cpu) * us_per_op,
                (own_cpu_seconds() - client_cpu) * us_per_op};
}

void print_cpu_costs(const std::map<std::string, Figure>& figures) {
  fmt::print("# store: CPU microseconds per call, server process vs this process's "
             "clients (on a shared machine both compete for the same cores)\n");
  for (const char* server : {"ours", "torch"}) {
    for (int clients : kClientCounts) {
      const Figure& figure = figures.at(fmt::format("{}_c{}", server, clients));
      print_value(fmt::format("{}_server_cpu_us_per_op_c{}", server, clients),
                  fmt::format("{:.1f}", figure.server_us_per_op));
      print_value(fmt::format("{}_client_cpu_us_per_op_c{}", server, clients),
                  fmt::format("{:.1f}", figure.client_us_per_op));
    }
  }
}

// Throughput section: for each client count, ours then PyTorch's, so slow
// drift in the machine affects both alike. Prints ops/s and ours/torch.
void throughput_section(const Servers& servers, const Flags& flags) {
  fmt::print("# store: throughput, ops/s = completed set+get+add calls / seconds, "
             "{} s per figure after {} s warm-up, one connection per client thread\n",
             flags.seconds, LoadOptions{}.warmup.count());
  std::map<std::string, Figure> figures;  // by "ours_c16" etc.
  for (int clients : kClientCounts) {
    progress("store: {} clients, ours then PyTorch's, {} s each", clients, flags.seconds);
    figures[fmt::format("ours_c{}", clients)] =
        measure(servers.ours, servers.ours_port, clients, flags);
    figures[fmt::format("torch_c{}", clients)] =
        measure(servers.torch, servers.torch_port, clients, flags);
  }
  auto ops_per_s = [&](const char* server, int clients) {
    return figures.at(fmt::format("{}_c{}", server, clients)).ops_per_s;
  };
  for (const char* server : {"ours", "torch"}) {
    for (int clients : kClientCounts) {
      print_value(fmt::format("{}_ops_per_s_c{}", server, clients),
                  fmt::format("{:.0f}", ops_per_s(server, clients)));
    }
  }
  for (int clients : kClientCounts) {
    print_value(fmt::format("ratio_c{}", clients),
                fmt::format("{:.2f}", ops_per_s("ours", clients) / ops_per_s("torch", clients)));
  }
  print_value("target_ratio_c64", fmt::format("{:.1f}", kTargetRatioC64));
  bool met = ops_per_s("ours", 64) >= kTargetRatioC64 * ops_per_s("torch", 64);
  print_value("target_met", met ? "yes" : "no");
  print_cpu_costs(figures);
}

// Held-connections section (our server only). Returns whether every
// connection opened and completed its three calls.
bool held_section(const Servers& servers) {
  HeldOptions options;
  int total = options.threads * options.per_thread;
  fmt::print("# store: held connections, {} TcpStores to our server open at once "
             "({} threads x {}), each does set+get+add, then all close\n",
             total, options.threads, options.per_thread);
  progress("store: opening {} connections to our server", total);
  HeldResult held = run_held_connections(kHost, servers.ours_port, options);
  print_value("held_connections", std::to_string(held.opened));
  print_value("held_completed", std::to_string(held.completed));
  print_value("held_seconds", fmt::format("{:.2f}", held.seconds));
  if (!held.first_error.empty()) fmt::print("# store: first error: {}\n", held.first_error);
  return held.opened == total && held.completed == total;
}

int run_store_bench(const std::string& argv0, const Flags& flags) {
  int cpus = usable_cpus();
  rlim_t fd_limit = raise_fd_limit();
  fmt::print("# store: machine has {} usable cores; both servers and all clients share them\n",
             cpus);
  print_value("nproc", std::to_string(cpus));
  print_value("fd_limit", std::to_string(fd_limit));
  if (fd_limit < fds_needed()) {
    fmt::print("# store: warning: RLIMIT_NOFILE hard limit {} < {} needed for the held "
               "connections; raise it (ulimit -Hn) or expect failed opens\n",
               fd_limit, fds_needed());
  }
  try {
    Servers servers(argv0);
    throughput_section(servers, flags);
    return held_section(servers) ? 0 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench store: {}\n", e.what());
    return 1;
  }
}

}  // namespace

Subcommand add_store_bench(CLI::App& bench, const std::string& argv0) {
  auto flags = std::make_shared<Flags>();
  CLI::App* sub = bench.add_subcommand(
      "store", "TcpStore server throughput vs PyTorch's, and 1,000 held connections");
  cli::set_synopsis(*sub, "bench store [--seconds S]");
  sub->add_option("--seconds", flags->seconds, "measured seconds per throughput figure")
      ->type_name("S")
      ->check(cli::positive_number());
  return {sub, [argv0, flags] { return run_store_bench(argv0, *flags); }};
}

}  // namespace switchboard::bench
