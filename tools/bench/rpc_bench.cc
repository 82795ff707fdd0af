// `bench rpc`: our RPC backends against raw TCP and PyTorch's RPC.
//
//   bench rpc [--quick] [--only pipe_shm|pipe_tcp|pipe_tls|process_group|torch]
//
// Every figure is measured between two processes on 127.0.0.1, in this
// order, one side at a time:
//   tcp:    this process (client) and `bench rpc --tcp-server` (a child
//           that prints port=N, echoes 64-byte messages on its first
//           connection and acks every 64 MiB with one byte on its second);
//   ours:   per backend, a TcpStore master in this process and two children
//           in worker mode (`bench rpc --worker BACKEND server|client PORT`)
//           that init_rpc over it; the server serves "noop" and "echo", the
//           client measures, and both shut down gracefully (PIPE twice:
//           over plain TCP, then inside mutual TLS with a CA and a
//           certificate made for the run);
//   torch:  the venv's Python (@sb_venv) tools/bench/torch_rpc.py (or $SB_TORCH_RPC), a
//           launcher that hosts a torch TCPStore, prints port=N and runs the
//           same two roles with PyTorch's TensorPipe backend.
// The RPC sides run the same measurements with the same counts (the script
// gets them as flags) and report the same way: each role sets
// "bench/<role>_results" (name=value lines) and then "bench/<role>_done"
// ("ok", or its error) in the store, where this process reads them.
//
// Deadlines: sockets time out after kSocketTimeout, calls after
// kRpcTimeout; this process waits kSideTimeout at most for a side and stops
// its children (SIGTERM) on the way out, also when it fails.
#include "tools/bench/rpc_bench.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/certificate_authority.h"
#include "common/cli.h"
#include "common/error.h"
#include "core/tensor.h"
#include "rpc/rpc.h"
#include "store/tcp_store.h"
#include "testkit/netns_cluster.h"
#include "tools/bench/process.h"
#include "tools/bench/report.h"
#include "tools/bench/rpc_compare.h"
#include "tools/bench/rpc_tcp_baseline.h"
#include "tools/bench/stats.h"

namespace switchboard::bench {

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr const char* kServer = "server";
constexpr const char* kClient = "client";


constexpr auto kSocketTimeout = 30s;  // each TCP accept, send and recv
constexpr auto kRpcTimeout = 60s;     // each call
// The server's graceful shutdown waits for the client's measurements.
constexpr auto kShutdownTimeout = 300s;
constexpr auto kSideTimeout = 400s;   // one side's run, as this process waits for it
constexpr auto kStartTimeout = 120s;  // a child's port=N (PyTorch imports slowly)

struct Echo {
  size_t bytes;
  int warmup;
  int iters;
  std::string label() const { return fmt::format("echo_{}MiB", bytes >> 20); }
};

// How much of everything; --quick shrinks it all.
struct Counts {
  int tcp_warmup;
  int tcp_round_trips;
  int tcp_bulk_sends;  // after one untimed send
  int rtt_warmup;
  int rtt_calls;
  int async_window;      // calls in flight
  double async_seconds;  // timed, after a third of it untimed
  Echo echoes[2];
};

constexpr Counts kFull{.tcp_warmup = 2'000,
                       .tcp_round_trips = 20'000,
                       .tcp_bulk_sends = 8,
                       .rtt_warmup = 1'000,
                       .rtt_calls = 10'000,
                       .async_window = 1'000,
                       .async_seconds = 3.0,
                       .echoes = {{1 << 20, 20, 100}, {64 << 20, 2, 8}}};
constexpr Counts kQuick{.tcp_warmup = 200,
                        .tcp_round_trips = 2'000,
                        .tcp_bulk_sends = 2,
                        .rtt_warmup = 100,
                        .rtt_calls = 1'000,
                        .async_window = 1'000,
                        .async_seconds = 0.3,
                        .echoes = {{1 << 20, 2, 10}, {64 << 20, 1, 2}}};

const Counts& counts_for(bool quick) { return quick ? kQuick : kFull; }

// A backend under test: its registry name, the prefix of its figures (and
// its name for --only and --worker), the extra that names the address it
// listens on, what the report calls it, whether its connections are inside
// mutual TLS (a CA and a certificate made for the run), and PIPE's
// same-host lane ("shm" extra: "1", "0"; null: the backend has none).
struct Backend {
  const char* name;
  const char* prefix;
  const char* address_extra;
  const char* label;
  bool tls = false;
  const char* shm = nullptr;
};

constexpr Backend kBackends[] = {
    {"PIPE", "pipe_shm", "listen_address", "PIPE (same-host lane)", false, "1"},
    {"PIPE", "pipe_tcp", "listen_address", "PIPE over TCP (lane off)", false, "0"},
    {"PIPE", "pipe_tls", "listen_address", "PIPE+TLS", true},
    {"PROCESS_GROUP", "process_group", "hostname", "PROCESS_GROUP"},
};

const Backend* find_backend(const std::string& prefix) {
  for (const Backend& b : kBackends) {
    if (prefix == b.prefix) return &b;
  }
  return nullptr;
}

// ---- statistics: tools/bench/stats.h ----

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// VmHWM of this process (peak resident set), in MiB.
double peak_rss_mib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  throw std::runtime_error("no VmHWM in /proc/self/status");
}

std::string self_exe() {
  char path[4096];
  ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) throw std::runtime_error("cannot read /proc/self/exe");
  return std::string(path, static_cast<size_t>(n));
}

// ---- worker mode: one role of an RPC pair, our backends ----

std::vector<double> time_calls_us(int warmup, int iters,
                                  const std::function<void()>& call) {
  std::vector<double> us;
  us.reserve(static_cast<size_t>(iters));
  for (int i = 0; i < warmup + iters; ++i) {
    auto start = Clock::now();
    call();
    if (i >= warmup) us.push_back(seconds_since(start) * 1e6);
  }
  return us;
}

// Issues noop calls for `seconds`, keeping `window` in flight (waiting for
// the oldest before each new one once the window is full), then waits for
// the rest; returns the number of calls completed.
int64_t run_async_window(int window, double seconds) {
  std::deque<rpc::Future<void>> in_flight;
  int64_t completed = 0;
  auto start = Clock::now();
  while (seconds_since(start) < seconds) {
    if (in_flight.size() >= static_cast<size_t>(window)) {
      in_flight.front().value();
      in_flight.pop_front();
      ++completed;
    }
    in_flight.push_back(rpc::rpc_async<void>(kServer, "noop"));
  }
  for (; !in_flight.empty(); in_flight.pop_front(), ++completed)
    in_flight.front().value();
  return completed;
}

double async_calls_per_s(const Counts& counts) {
  run_async_window(counts.async_window, counts.async_seconds / 3);
  auto start = Clock::now();
  int64_t completed = run_async_window(counts.async_window, counts.async_seconds);
  return static_cast<double>(completed) / seconds_since(start);
}

// GB/s of echoing a float32 tensor of `echo.bytes`: 2 x bytes / the median
// round trip. Checks each reply's size and last element.
double echo_gbps(const Echo& echo) {
  auto numel = static_cast<int64_t>(echo.bytes / sizeof(float));
  Tensor input = Tensor::empty({numel}, DType::kFloat32);
  std::span<float> values = input.span<float>();
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  std::vector<double> seconds;
  for (int i = 0; i < echo.warmup + echo.iters; ++i) {
    auto start = Clock::now();
    Tensor reply = rpc::rpc_sync<Tensor>(kServer, "echo", input);
    double elapsed = seconds_since(start);
    if (reply.nbytes() != echo.bytes ||
        reply.data_as<float>()[numel - 1] != values.back()) {
      throw std::runtime_error(
          fmt::format("echo of {} returned {}", input.describe(), reply.describe()));
    }
    if (i >= echo.warmup) seconds.push_back(elapsed);
  }
  return 2.0 * static_cast<double>(echo.bytes) / median(seconds) / 1e9;
}

// The client's measurements, as name=value lines.
std::string measure_client(const Counts& counts) {
  std::string lines;
  auto add = [&](const std::string& name, double value) {
    lines += fmt::format("{}={:.6f}\n", name, value);
  };
  progress("rpc client: {} round trips of noop", counts.rtt_calls);
  std::vector<double> rtt = time_calls_us(counts.rtt_warmup, counts.rtt_calls,
                                          [] { rpc::rpc_sync<void>(kServer, "noop"); });
  add("rtt_us_p50", percentile(rtt, 0.50));
  add("rtt_us_p99", percentile(rtt, 0.99));
  // The same no-op registered inline: served on the thread that receives it.
  progress("rpc client: {} round trips of noop_inline", counts.rtt_calls);
  std::vector<double> rtt_inline = time_calls_us(
      counts.rtt_warmup, counts.rtt_calls, [] { rpc::rpc_sync<void>(kServer, "noop_inline"); });
  add("rtt_inline_us_p50", percentile(rtt_inline, 0.50));
  add("rtt_inline_us_p99", percentile(rtt_inline, 0.99));
  progress("rpc client: rpc_async of noop, {} in flight, for {} s", counts.async_window,
           counts.async_seconds);
  add("async_calls_per_s", async_calls_per_s(counts));
  for (const Echo& echo : counts.echoes) {
    progress("rpc client: {} echoes of {} MiB", echo.warmup + echo.iters, echo.bytes >> 20);
    add(echo.label() + "_GBps", echo_gbps(echo));
  }
  add("client_peak_rss_MiB", peak_rss_mib());
  return lines;
}

struct WorkerArgs {
  const Backend* backend = nullptr;
  std::string role;
  uint16_t port = 0;
  bool quick = false;
  std::string store_host = "127.0.0.1";  // the bench's store
  std::string listen = "127.0.0.1";      // this worker's address
  std::string tls_dir;                   // TLS backends: the run's CA and certificate
};

// The certificate every worker of a TLS backend uses, in the run's directory.
constexpr const char* kTlsName = "bench";

std::shared_ptr<rpc::RpcBackendOptions> backend_options(const Backend& backend,
                                                        const std::string& listen,
                                                        const std::string& tls_dir = "") {
  rpc::Extras extras{{backend.address_extra, listen}};
  if (backend.shm != nullptr) extras["shm"] = backend.shm;
  if (backend.tls) {
    extras["tls_cert_file"] = fmt::format("{}/{}.pem", tls_dir, kTlsName);
    extras["tls_key_file"] = fmt::format("{}/{}.key", tls_dir, kTlsName);
    extras["tls_ca_file"] = tls_dir + "/ca.pem";
  }
  return rpc::construct_rpc_backend_options(rpc::backend_type(backend.name), kRpcTimeout,
                                            "env://", extras);
}

// Runs one role: init_rpc, the client's measurements, graceful shutdown,
// then the results and "ok" into the store. Throws what fails.
void run_role(const WorkerArgs& args, const std::shared_ptr<TcpStore>& store) {
  bool server = args.role == kServer;
  if (server) {
    rpc::register_function("noop", [] {});
    rpc::register_inline_function("noop_inline", [] {});
    rpc::register_function("echo", [](Tensor tensor) { return tensor; });
  }
  rpc::init_rpc(args.role, args.backend->name, server ? 0 : 1, 2,
                backend_options(*args.backend, args.listen, args.tls_dir), store);
  std::string results = server ? std::string() : measure_client(counts_for(args.quick));
  rpc::shutdown(true, kShutdownTimeout);
  if (server) results = fmt::format("server_peak_rss_MiB={:.6f}\n", peak_rss_mib());
  store->set(fmt::format("bench/{}_results", args.role), results);
  store->set(fmt::format("bench/{}_done", args.role), "ok");
}

int run_worker(const WorkerArgs& args) {
  TcpStoreOptions store_options;
  store_options.timeout = kSideTimeout;
  auto store = std::make_shared<TcpStore>(args.store_host, args.port, store_options);
  try {
    run_role(args, store);
  } catch (const std::exception& e) {
    std::string error =
        fmt::format("our {} ({}): {}", args.role, args.backend->label, e.what());
    fmt::print(stderr, "bench rpc: {}\n", error);
    rpc::shutdown(false);
    store->set(fmt::format("bench/{}_done", args.role), error);
    return 1;
  }
  wait_for_stdin_eof();
  return 0;
}

// ---- the bench: run each side, collect, compare ----

// Waits until `key` is in `store`; throws std::runtime_error naming `side`
// when one of `children` exits first or `deadline` passes.
void wait_for_key(Store& store, const std::string& key,
                  const std::vector<pid_t>& children, const std::string& side,
                  Clock::time_point deadline) {
  for (;;) {
    try {
      store.wait({key}, std::chrono::seconds(1));
      return;
    } catch (const TimeoutError&) {
    }
    for (pid_t pid : children) {
      if (has_exited(pid) && !store.check({key})) {
        throw std::runtime_error(fmt::format("{}: process {} exited early", side, pid));
      }
    }
    if (Clock::now() > deadline) {
      throw std::runtime_error(fmt::format("{}: no {} within {} s", side, key,
                                           std::chrono::seconds(kSideTimeout).count()));
    }
  }
}

// Adds the name=value lines of `text` to `values`.
void parse_lines(const std::string& text, Figures& values) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    size_t equals = line.find('=');
    if (equals != std::string::npos)
      values[line.substr(0, equals)] = std::stod(line.substr(equals + 1));
  }
}

// Waits for both roles of one RPC side and returns their figures, with
// echo_64MiB_peak_rss_MiB the larger of the two processes' peaks.
Figures collect(Store& store, const std::vector<pid_t>& children,
                const std::string& side) {
  auto deadline = Clock::now() + kSideTimeout;
  Figures values;
  for (const char* role : {kClient, kServer}) {
    std::string done_key = fmt::format("bench/{}_done", role);
    wait_for_key(store, done_key, children, side, deadline);
    if (std::string done = to_string(store.get(done_key)); done != "ok") {
      throw std::runtime_error(fmt::format("{}: {}", side, done));
    }
    parse_lines(to_string(store.get(fmt::format("bench/{}_results", role))), values);
  }
  values["echo_64MiB_peak_rss_MiB"] =
      std::max(values.at("client_peak_rss_MiB"), values.at("server_peak_rss_MiB"));
  return values;
}

// A CA and the certificate kTlsName for one run of a TLS backend, in a
// directory of their own, removed afterwards.
struct TempCertificates {
  TempCertificates() {
    std::string pattern = "/tmp/sb-bench-tls-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error(fmt::format("mkdtemp: {}", std::strerror(errno)));
    }
    dir = pattern;
    certs::CertificateAuthority ca(dir, "bench CA", 1);
    ca.issue(kTlsName, 1);
  }
  ~TempCertificates() {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
  std::string dir;
};

// One of our backends; nullopt (after printing why) when it is not here.
std::optional<Figures> run_ours(const Backend& backend, bool quick, const Placement& where) {
  if (!rpc::backend_registered(backend.name)) {
    fmt::print("{}: skipped (not registered in this build)\n", backend.label);
    return std::nullopt;
  }
  try {
    backend_options(backend, where.client);
  } catch (const std::exception& e) {
    fmt::print("{}: skipped ({})\n", backend.label, e.what());
    return std::nullopt;
  }
  std::optional<TempCertificates> tls;
  if (backend.tls) tls.emplace();
  TcpStoreOptions options;
  options.is_master = true;
  options.wait_for_workers = false;
  options.timeout = kSideTimeout;
  TcpStore store(where.client, 0, options);
  std::vector<std::unique_ptr<ChildProcess>> workers;
  std::vector<pid_t> pids;
  for (const char* role : {kServer, kClient}) {
    const bool server = role == std::string(kServer);
    std::vector<std::string> argv = server ? where.server_prefix : std::vector<std::string>{};
    argv.insert(argv.end(), {self_exe(), "rpc", "--worker", backend.prefix, role,
                             std::to_string(store.port()), "--store-host", where.client,
                             "--listen", server ? where.server : where.client});
    if (quick) argv.push_back("--quick");
    if (tls) argv.insert(argv.end(), {"--tls-dir", tls->dir});
    workers.push_back(std::make_unique<ChildProcess>(argv));
    pids.push_back(workers.back()->pid());
  }
  Figures figures = collect(store, pids, backend.label);
  for (auto& worker : workers) worker->stop();
  return figures;
}

// PyTorch's side; nullopt with `why_not` set when PyTorch cannot start.
// `extra`: more arguments for torch_rpc.py (its --backend, --pythonpath).
std::optional<Figures> run_torch(const std::string& script, const Counts& counts,
                                 std::string& why_not, std::string& version,
                                 const std::vector<std::string>& extra = {}) {
  std::string python;
  try {
    python = torch_python();
  } catch (const std::exception& e) {
    why_not = e.what();
    return std::nullopt;
  }
  std::vector<std::string> argv = {
      python,
      script,
      fmt::format("--rtt-warmup={}", counts.rtt_warmup),
      fmt::format("--rtt-calls={}", counts.rtt_calls),
      fmt::format("--window={}", counts.async_window),
      fmt::format("--seconds={}", counts.async_seconds),
  };
  for (const Echo& echo : counts.echoes) {
    argv.push_back(fmt::format("--echo={}:{}:{}", echo.bytes, echo.warmup, echo.iters));
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  std::unique_ptr<ChildProcess> launcher;
  uint16_t port = 0;
  try {
    launcher = std::make_unique<ChildProcess>(argv);
    port = launcher->read_port(kStartTimeout);
  } catch (const std::exception& e) {
    why_not = fmt::format("{} (is the project venv made? tools/setup; see stderr)", e.what());
    return std::nullopt;
  }
  TcpStoreOptions options;
  options.timeout = kSideTimeout;
  TcpStore store("127.0.0.1", port, options);
  Figures figures = collect(store, {launcher->pid()}, "torch");
  version = to_string(store.get("bench/torch_version"));
  launcher->stop();
  return figures;
}

void print_header(const Counts& counts, bool quick, const Placement& where) {
  int cpus = usable_cpus();
  const bool hosts = !where.server_prefix.empty();
  if (hosts) {
    fmt::print(
        "# rpc: --hosts: every figure between two network namespaces over a veth link: the "
        "client side (this process, its store, the clients) on {}, the servers on {}; same "
        "machine, same {} usable cores; torch is not run across them\n",
        where.client, where.server, cpus);
  }
  fmt::print(
      "# rpc: every figure between two processes on {} sharing {} usable cores; "
      "ours = this binary's worker mode per backend (a server and a client, rendezvous "
      "through a TcpStore in the bench); torch = PyTorch's TensorPipe RPC "
      "(PyTorch 2.11 from the project venv, tools/bench/torch_rpc.py, num_worker_threads=16, "
      "TP_SOCKET_IFNAME=lo)\n",
      hosts ? fmt::format("{} and {}", where.client, where.server) : "127.0.0.1", cpus);
  fmt::print(
      "# rpc: tcp = blocking sockets, TCP_NODELAY: rtt = {}-byte ping-pong; oneway = {} "
      "MiB "
      "sends, each acked with one byte (median; _best = fastest)\n",
      kPingBytes, kBulkBytes >> 20);
  fmt::print(
      "# rpc: rtt = rpc_sync of \"noop\" (no arguments, no result), p50/p99 after "
      "warm-up; rtt_inline = the same of \"noop_inline\", registered inline (ours "
      "only); async = rpc_async of noop, {} calls in flight; echo = rpc_sync of a "
      "float32 tensor the server returns as is, GBps = 2 x bytes / median round trip "
      "(GB = 1e9 bytes); peak_rss = the larger peak RSS (VmHWM; ru_maxrss for torch) of "
      "client and server, read after the echoes\n",
      counts.async_window);
  fmt::print(
      "# rpc: ratio_* and *_vs_torch_* = ours / theirs: below 1 is better for rtt and "
      "rss, above 1 for calls_per_s and GBps\n");
  print_value("nproc", std::to_string(cpus));
  print_value("loadavg_start", load_average());
  print_value("quick", quick ? "1" : "0");
  print_value("path", hosts ? "veth" : "loopback");
  print_value("tcp_round_trips", std::to_string(counts.tcp_round_trips));
  print_value("tcp_oneway_sends", std::to_string(counts.tcp_bulk_sends));
  print_value("rtt_calls", std::to_string(counts.rtt_calls));
  print_value("async_seconds", fmt::format("{}", counts.async_seconds));
  for (const Echo& echo : counts.echoes) {
    print_value(echo.label() + "_iters", std::to_string(echo.iters));
  }
}

void print_tcp(const Figures& tcp) {
  print_number("tcp_rtt_us_p50", tcp.at("rtt_us_p50"), 1);
  print_number("tcp_rtt_us_p99", tcp.at("rtt_us_p99"), 1);
  print_number("tcp_oneway_GBps", tcp.at("oneway_GBps"), 3);
  print_number("tcp_oneway_GBps_best", tcp.at("oneway_GBps_best"), 3);
}

// Runs one side, printing `NAME: failed (...)` instead of throwing; false
// when it failed.
template <typename F>
bool run_side(const std::string& name, F&& run) {
  try {
    run();
    return true;
  } catch (const std::exception& e) {
    fmt::print("{}: failed ({})\n", name, e.what());
    std::fflush(stdout);
    return false;
  }
}

// `only`: empty runs every side; else the prefix of the one side to run
// after the TCP baseline (for profiling one backend).
int run_bench(const std::string& argv0, bool quick, const std::string& only,
              const Placement& where) {
  const Counts& counts = counts_for(quick);
  const bool hosts = !where.server_prefix.empty();
  std::string script =
      hosts ? std::string() : find_runfile(argv0, "tools/bench/torch_rpc.py", "SB_TORCH_RPC");
  print_header(counts, quick, where);
  progress("rpc: raw TCP baseline ({} round trips, {} sends of {} MiB)",
           counts.tcp_round_trips, counts.tcp_bulk_sends, kBulkBytes >> 20);
  Figures tcp = run_tcp_baseline(
      self_exe(), {counts.tcp_warmup, counts.tcp_round_trips, counts.tcp_bulk_sends}, where);
  print_tcp(tcp);
  bool ok = true;
  std::vector<std::pair<const Backend*, Figures>> ours;
  for (const Backend& backend : kBackends) {
    if (!only.empty() && only != backend.prefix) continue;
    ok &= run_side(backend.label, [&] {
      progress("rpc: {} (a server and a client process)", backend.label);
      if (std::optional<Figures> figures = run_ours(backend, quick, where)) {
        print_side(backend.prefix, *figures);
        ours.emplace_back(&backend, std::move(*figures));
      }
    });
  }
  std::optional<Figures> torch;
  if (hosts) {
    fmt::print("torch: skipped (not run across hosts)\n");
  } else if (only.empty() || only == "torch") ok &= run_side("torch", [&] {
    std::string why_not, version;
    progress("rpc: PyTorch's TensorPipe RPC (the project venv)");
    torch = run_torch(script, counts, why_not, version);
    if (!torch) {
      fmt::print("torch: skipped ({})\n", why_not);
      return;
    }
    print_value("torch_version", version);
    print_side("torch", *torch);
  });
  // PyTorch's API over Switchboard's torch backend (python/switchboard).
  std::optional<Figures> torch_sb;
  if (!hosts && (only.empty() || only == "torch_switchboard")) {
    ok &= run_side("torch_switchboard", [&] {
      std::string why_not, version;
      const std::string package = python_package();
      if (::access((package + "/switchboard/_C.so").c_str(), R_OK) != 0) {
        fmt::print(
            "torch_switchboard: skipped (no {}/switchboard/_C.so: run `bazel build -c opt "
            "//python:package` first, or set SB_TORCH_RPC_PACKAGE)\n",
            package);
        return;
      }
      progress("rpc: PyTorch's RPC over the SWITCHBOARD backend (the project venv)");
      torch_sb = run_torch(script, counts, why_not, version,
                           {"--backend=switchboard", "--pythonpath=" + package});
      if (!torch_sb) {
        fmt::print("torch_switchboard: skipped ({})\n", why_not);
        return;
      }
      print_side("torch_switchboard", *torch_sb);
    });
  }
  if (torch_sb) compare_torch_backends(*torch_sb, torch);
  const Figures* plain_pipe = nullptr;
  for (const auto& [backend, figures] : ours) {
    // TLS has no same-host lane: its cost is against PIPE over TCP.
    if (std::string(backend->prefix) == "pipe_tcp") plain_pipe = &figures;
  }
  for (const auto& [backend, figures] : ours) {
    if (backend->tls) {
      compare_tls(backend->prefix, backend->label, figures, plain_pipe);
    } else {
      compare(backend->prefix, backend->label, figures, tcp, torch);
    }
    if (std::string(backend->prefix) == "pipe_shm") compare_lane(figures, tcp, plain_pipe, torch);
  }
  for (const Backend& backend : kBackends) {
    bool measured = std::any_of(ours.begin(), ours.end(),
                                [&](const auto& side) { return side.first == &backend; });
    if (!measured) fmt::print("# rpc: no targets for {} (not measured)\n", backend.label);
  }
  print_value("loadavg_end", load_average());
  return ok ? 0 : 1;
}

// The flags of `bench rpc`, its internal modes included.
struct Flags {
  bool quick = false;
  std::string only;                 // empty: every side
  bool hosts = false;               // --hosts
  // The bench inside namespace A: --in-hosts SERVER_NS SERVER_ADDR CLIENT_ADDR.
  std::vector<std::string> in_hosts;
  bool tcp_server = false;          // --tcp-server
  std::string bind = "127.0.0.1";   // --bind: the TCP server's address
  std::vector<std::string> worker;  // --worker BACKEND ROLE PORT
  std::string store_host = "127.0.0.1";  // --store-host
  std::string listen = "127.0.0.1";      // --listen
  std::string tls_dir;                   // --tls-dir
};

// `bench rpc --hosts`: two network namespaces joined by a virtual switch
// (testkit/netns_cluster.h), this binary run again in the first (--in-hosts) with its
// servers in the second; everything is torn down afterwards. Its exit
// status, or 1 when the namespaces cannot be made (saying why).
int run_across_hosts(bool quick, const std::string& only) {
  if (const std::string why = netns::NetnsCluster::unavailable(); !why.empty()) {
    fmt::print("bench rpc --hosts: {}\n", why);
    return 1;
  }
  netns::NetnsCluster cluster({.hosts = 2});
  std::vector<std::string> argv = {self_exe(),      "rpc",
                                   "--in-hosts",    cluster.ns(1),
                                   cluster.address(1), cluster.address(0)};
  if (quick) argv.push_back("--quick");
  if (!only.empty()) argv.insert(argv.end(), {"--only", only});
  return run_inheriting_output(cluster.command(0, argv));
}

// Checks and converts --worker BACKEND server|client PORT; throws
// CLI::ValidationError naming what is wrong.
WorkerArgs worker_args(const Flags& flags) {
  if (flags.worker.size() != 3) {
    throw CLI::ValidationError("--worker",
                               fmt::format("wants BACKEND server|client PORT, not '{}'",
                                           fmt::join(flags.worker, " ")));
  }
  WorkerArgs args;
  args.backend = find_backend(flags.worker[0]);
  args.role = flags.worker[1];
  args.quick = flags.quick;
  args.store_host = flags.store_host;
  args.listen = flags.listen;
  args.tls_dir = flags.tls_dir;
  if (args.backend == nullptr) {
    throw CLI::ValidationError(
        "--worker", fmt::format("'{}' is not a backend under test", flags.worker[0]));
  }
  if (args.role != kServer && args.role != kClient) {
    throw CLI::ValidationError("--worker", fmt::format("role '{}' is not {} or {}",
                                                       args.role, kServer, kClient));
  }
  std::string port = flags.worker[2];
  if (std::string error = cli::in_range(1, 65535)(port); !error.empty()) {
    throw CLI::ValidationError("--worker", fmt::format("port {}", error));
  }
  args.port = static_cast<uint16_t>(std::stoi(port));
  return args;
}

}  // namespace

Subcommand add_rpc_bench(CLI::App& bench, const std::string& argv0) {
  auto flags = std::make_shared<Flags>();
  auto worker = std::make_shared<WorkerArgs>();
  CLI::App* sub = bench.add_subcommand(
      "rpc",
      "rpc_sync/rpc_async/echo of PIPE and PROCESS_GROUP vs raw TCP and PyTorch's");
  cli::set_synopsis(
      *sub, "bench rpc [--quick] [--only pipe_shm|pipe_tcp|pipe_tls|process_group|torch|"
      "torch_switchboard] [--hosts]");
  sub->add_flag("--quick", flags->quick, "smaller counts: a smoke run of a few seconds");
  sub->add_flag("--hosts", flags->hosts,
                "measure between two network namespaces over a veth link instead of on "
                "127.0.0.1 (needs root and iproute2; torch is not run)");
  std::vector<std::string> sides;
  for (const Backend& backend : kBackends) sides.push_back(backend.prefix);
  sides.push_back("torch");
  sides.push_back("torch_switchboard");
  sub->add_option("--only", flags->only,
                  "after the TCP baseline, run this side only (for profiling one)")
      ->type_name("SIDE")
      ->check(CLI::IsMember(sides));
  // The child processes the bench starts (hidden from --help).
  sub->add_flag("--tcp-server", flags->tcp_server, "the raw TCP baseline's server")
      ->group("");
  sub->add_option("--worker", flags->worker, "one role of our side")
      ->expected(3)
      ->group("");
  sub->add_option("--in-hosts", flags->in_hosts, "the bench inside --hosts' first namespace")
      ->expected(3)
      ->group("");
  sub->add_option("--bind", flags->bind, "the TCP server's address")->group("");
  sub->add_option("--store-host", flags->store_host, "a worker's store address")->group("");
  sub->add_option("--listen", flags->listen, "a worker's listen address")->group("");
  sub->add_option("--tls-dir", flags->tls_dir, "a TLS worker's CA and certificate")->group("");
  sub->callback([flags, worker] {
    if (!flags->worker.empty()) *worker = worker_args(*flags);
  });
  return {sub, [argv0, flags, worker] {
            try {
              if (flags->tcp_server) return run_tcp_server(kSocketTimeout, flags->bind);
              if (!flags->worker.empty()) return run_worker(*worker);
              if (flags->hosts) return run_across_hosts(flags->quick, flags->only);
              Placement where;
              if (!flags->in_hosts.empty()) {
                where.server = flags->in_hosts[1];
                where.client = flags->in_hosts[2];
                where.server_prefix = netns::NetnsCluster::exec_prefix(flags->in_hosts[0]);
              }
              return run_bench(argv0, flags->quick, flags->only, where);
            } catch (const std::exception& e) {
              fmt::print(stderr, "bench rpc: {}\n", e.what());
              return 1;
            }
          }};
}

}  // namespace switchboard::bench
