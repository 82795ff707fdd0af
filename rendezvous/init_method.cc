#include "rendezvous/init_method.h"

#include <fmt/format.h>

#include <charconv>
#include <limits>
#include <cstdlib>
#include <string_view>

#include "common/auth.h"
#include "common/check.h"
#include "common/listen_address.h"
#include "rendezvous/rounds.h"
#include "store/file_store.h"
#include "store/prefix_store.h"
#include "store/tcp_store.h"

namespace switchboard::rendezvous {
namespace {

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

int parse_int(std::string_view what, const std::string& text, int min, int max) {
  int value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  SB_REQUIRE(ec == std::errc() && ptr == end && value >= min && value <= max,
             "{}: expected an integer in [{}, {}], got \"{}\"", what, min, max, text);
  return value;
}

// The first of `names` that is set, parsed.
std::optional<int> first_env(std::initializer_list<const char*> names, int min) {
  for (const char* name : names) {
    if (auto value = env(name)) {
      return parse_int(fmt::format("environment variable {}", name), *value, min,
                       1 << 30);
    }
  }
  return std::nullopt;
}

struct HostPort {
  std::string host;
  uint16_t port = 0;
};

HostPort parse_host_port(std::string_view what, std::string_view text) {
  const auto colon = text.rfind(':');
  SB_REQUIRE(colon != std::string_view::npos && colon > 0 && colon + 1 < text.size(),
             "{}: expected host:port, got \"{}\"", what, text);
  std::string host(text.substr(0, colon));
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);  // [::1]:port
  }
  // Port 0 is only useful to the rank that hosts the store (an ephemeral
  // port; TcpStore::port() tells which); a client fails to connect to it.
  const int port = parse_int(what, std::string(text.substr(colon + 1)), 0, 65535);
  return {host, static_cast<uint16_t>(port)};
}

// Under torchrun (TORCHELASTIC_USE_AGENT_STORE=True) the elastic agent
// already hosts the store at MASTER_ADDR:MASTER_PORT: every worker, rank 0
// included, is its client, under the attempt's prefix "/worker/attempt_<n>",
// so that a restarted group never reads the failed attempt's keys. The
// agent's store is torch's: no job secret is proven to it (PIPE's hellos
// still prove it).
//
// The attempt n is not TORCHELASTIC_RESTART_COUNT. PyTorch 2.x's agents
// count restarts per node: the node whose worker failed counts one more,
// while a node restarted because another node re-joined the rendezvous
// keeps its count, so after a failure the nodes' workers would look for
// each other under different prefixes. (2.x's own env:// uses no prefix at
// all, and its agent store outlives the rounds.) Instead each worker counts
// its rank's starts in the agent's store: the n-th worker started as rank r
// (the n-th round, since every round restarts every rank) uses attempt n-1.
// The agent's store lives as long as the job's agents, so the count is the
// same on every node. Its limit: a worker that dies before init_rpc counts
// no start for its rank, and a rank added when the world grows starts
// from 0; both leave that rank one round behind (named by the static
// rendezvous as ranks that did not arrive), and torchrun's next restart
// starts every rank again.
constexpr std::string_view kElasticStartsKey = "switchboard/elastic/starts/";
bool use_agent_store() {
  const std::optional<std::string> value = env("TORCHELASTIC_USE_AGENT_STORE");
  return value && *value == "True";
}

// The attempt of an elastic job (torchrun's, or tools/launch --max-restarts):
// TORCHELASTIC_RESTART_COUNT; nullopt outside one.
std::optional<int> elastic_attempt() {
  const std::optional<std::string> count = env("TORCHELASTIC_RESTART_COUNT");
  if (!count) return std::nullopt;
  return parse_int("environment variable TORCHELASTIC_RESTART_COUNT", *count, 0,
                   std::numeric_limits<int>::max());
}

std::shared_ptr<Store> agent_store(const HostPort& at, int rank, std::optional<int> world_size,
                                   std::chrono::milliseconds timeout) {
  TcpStoreOptions options;
  options.is_master = false;
  options.world_size = world_size;
  options.wait_for_workers = false;
  options.timeout = timeout;
  auto store = std::make_shared<TcpStore>(at.host, at.port, options);
  const int64_t starts = store->add(fmt::format("{}{}", kElasticStartsKey, rank), 1);
  return std::make_shared<PrefixStore>(elastic_attempt_prefix(static_cast<int>(starts - 1)),
                                       std::move(store));
}

// `where` names the setting that gave `at` (e.g. "MASTER_ADDR").
std::shared_ptr<Store> tcp_store(const HostPort& at, std::string_view where, int rank,
                                 std::optional<int> world_size,
                                 std::chrono::milliseconds timeout) {
  if (use_agent_store() && !env("SWITCHBOARD_STORE")) {
    return agent_store(at, rank, world_size, timeout);
  }
  TcpStoreOptions options;
  options.is_master = rank == 0 && world_size.has_value() && !env("SWITCHBOARD_STORE");
  // Rank 0 hosts the store at the address it was given: that address must
  // be one of its own (binding it would fail with "cannot assign requested
  // address", which says neither why nor what to do).
  if (options.is_master && !is_local_address(at.host)) {
    const std::string from = route_source_address(at.host);
    throw std::invalid_argument(fmt::format(
        "init_rpc: rank 0 hosts the store at {} {}:{}, but {} is not an address of this "
        "host{}. Start rank 0 on the host that has {}, or run a store_server there and set "
        "SWITCHBOARD_STORE=tcp://{}:{} on every worker",
        where, at.host, at.port, at.host,
        from.empty() ? "" : fmt::format(" (this host reaches it from {})", from), at.host,
        at.host, at.port));
  }
  options.world_size = world_size;
  options.wait_for_workers = false;
  options.timeout = timeout;
  // The job secret, when the job has one: proven to the store (and
  // required by rank 0's).
  options.secret = Secret::from_environment();
  auto store = std::make_shared<TcpStore>(at.host, at.port, options);
  // A standalone store outlives the attempts of an elastic job
  // (tools/launch --max-restarts): each attempt meets under its own prefix,
  // as under torchrun's agent store.
  if (env("SWITCHBOARD_STORE")) {
    if (const std::optional<int> attempt = elastic_attempt()) {
      return std::make_shared<PrefixStore>(elastic_attempt_prefix(*attempt), std::move(store));
    }
  }
  return store;
}

// Checked before any store is opened: a worker with a bad rank must not
// connect, nor count itself into the group (a TcpStore with a world size
// adds 1 to the "init/" key), nor start the server.
void check_rank(const Rendezvous& out) {
  SB_REQUIRE(!out.world_size || (out.rank >= 0 && out.rank < *out.world_size),
             "init_rpc: rank {} is outside [0, {}) (set rank or RANK)", out.rank,
             out.world_size.value_or(0));
}

// Under srun, where MASTER_ADDR or MASTER_PORT is not set: the store's host
// is the step's (else the job's) first node, where SLURM runs task 0, and
// its port follows from the job id, so that every task finds the same one
// and two jobs on one node rarely share it. `where` says which variables
// gave them, for errors.
void slurm_defaults(std::optional<std::string>& addr, std::optional<std::string>& port,
                    std::string& where) {
  if (!env("SLURM_PROCID")) return;
  if (!addr) {
    for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"}) {
      if (auto nodes = env(name)) {
        addr = slurm_first_node(*nodes);
        where = name;
        break;
      }
    }
  }
  if (!port) {
    if (auto job = env("SLURM_JOB_ID")) {
      port = std::to_string(slurm_store_port(parse_int(
          "environment variable SLURM_JOB_ID", *job, 0, std::numeric_limits<int>::max())));
    }
  }
}

}  // namespace

std::string slurm_first_node(std::string_view nodelist) {
  // The first name of the list: up to the first comma outside brackets;
  // each bracket "[a-b,c]" in it becomes its first value ("a"), which
  // keeps its zero padding ("node[07-12]" -> "node07").
  std::string out;
  for (size_t i = 0; i < nodelist.size(); ++i) {
    const char c = nodelist[i];
    if (c == ',') break;
    if (c != '[') {
      SB_REQUIRE(c != ']', "SLURM node list \"{}\": a ']' without its '['", nodelist);
      out.push_back(c);
      continue;
    }
    const size_t close = nodelist.find(']', i);
    SB_REQUIRE(close != std::string_view::npos, "SLURM node list \"{}\": a '[' without its ']'",
               nodelist);
    const std::string_view range = nodelist.substr(i + 1, close - i - 1);
    const std::string_view first = range.substr(0, range.find_first_of(",-"));
    SB_REQUIRE(!first.empty() && first.find_first_not_of("0123456789") == std::string_view::npos,
               "SLURM node list \"{}\": \"[{}]\" is not a range of numbers", nodelist, range);
    out.append(first);
    i = close;
  }
  SB_REQUIRE(!out.empty(), "SLURM node list \"{}\" names no node", nodelist);
  return out;
}

uint16_t slurm_store_port(int job_id) { return static_cast<uint16_t>(20000 + job_id % 10000); }

std::optional<int> env_rank() {
  return first_env({"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"}, 0);
}

std::optional<int> env_local_rank() {
  return first_env({"LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"}, 0);
}

std::optional<int> env_world_size() {
  return first_env({"WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"}, 1);
}

Rendezvous rendezvous(const std::string& init_method, int rank,
                      std::optional<int> world_size, std::chrono::milliseconds timeout,
                      bool dynamic) {
  SB_REQUIRE(!dynamic || !world_size, "rendezvous: a dynamic group with world_size {}",
             world_size.value_or(0));
  Rendezvous out;
  out.rank = rank;
  out.world_size = world_size;
  const std::string_view method = init_method;
  if (method == "env://" || method.empty()) {
    if (out.rank < 0) out.rank = env_rank().value_or(-1);
    if (!out.world_size && !dynamic) out.world_size = env_world_size();
    auto addr = env("MASTER_ADDR");
    auto port = env("MASTER_PORT");
    std::string where = "MASTER_ADDR";
    slurm_defaults(addr, port, where);
    SB_REQUIRE(addr && port, "init_method \"env://\": environment variable{} not set",
               !addr && !port ? "s MASTER_ADDR and MASTER_PORT are"
                              : (!addr ? " MASTER_ADDR is" : " MASTER_PORT is"));
    const HostPort at{*addr, static_cast<uint16_t>(parse_int(
                                 "environment variable MASTER_PORT", *port, 0, 65535))};
    check_rank(out);
    out.store = tcp_store(at, where, out.rank, out.world_size, timeout);
  } else if (method.starts_with("tcp://")) {
    const HostPort at = parse_host_port(fmt::format("init_method \"{}\"", init_method),
                                        method.substr(6));
    check_rank(out);
    out.store = tcp_store(at, "init_method", out.rank, out.world_size, timeout);
  } else if (method.starts_with("file://")) {
    const std::string path(method.substr(7));
    SB_REQUIRE(!path.empty(), "init_method \"{}\": the path is empty", init_method);
    check_rank(out);
    out.store = std::make_shared<FileStore>(path, out.world_size);
  } else {
    throw std::invalid_argument(fmt::format(
        "init_method \"{}\": expected env://, tcp://host:port or file://path",
        init_method));
  }
  return out;
}

}  // namespace switchboard::rendezvous
