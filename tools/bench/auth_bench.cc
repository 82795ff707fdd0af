#include "tools/bench/auth_bench.h"

#include <fmt/format.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agents/pipe/agent.h"
#include "common/auth.h"
#include "common/cli.h"
#include "rpc/future.h"
#include "store/hash_store.h"
#include "store/tcp_store.h"
#include "store/tcp_store_server.h"
#include "tools/bench/report.h"
#include "tools/bench/stats.h"

namespace switchboard::bench {

namespace {

using Clock = std::chrono::steady_clock;
using agents::pipe::PipeAgent;
using agents::pipe::PipeAgentOptions;
using rpc::Message;

struct Flags {
  int rounds = 200;
};

double us_since(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

// Microseconds for a TcpStore to connect (and authenticate) and answer one
// CHECK, per round.
std::vector<double> store_connects(std::shared_ptr<const Secret> secret, int rounds) {
  TcpStoreServerOptions server_options;
  server_options.secret = secret;
  TcpStoreServer server(server_options);
  TcpStoreOptions options;
  options.secret = secret;
  std::vector<double> samples;
  for (int i = 0; i < rounds; ++i) {
    const auto start = Clock::now();
    TcpStore store("127.0.0.1", server.port(), options);
    store.check({"k"});
    samples.push_back(us_since(start));
  }
  return samples;
}

PipeAgentOptions pipe_options(std::shared_ptr<const Secret> secret) {
  PipeAgentOptions options;
  options.listen_address = "127.0.0.1";
  options.num_worker_threads = 2;
  options.secret = std::move(secret);
  return options;
}

void echo(PipeAgent& agent) {
  agent.start([](Message m, const rpc::WorkerInfo&) {
    Message reply;
    reply.type = rpc::MessageType::kResponse;
    reply.payload = std::move(m.payload);
    return rpc::Future<Message>::ready(std::move(reply));
  });
}

struct PipeFigures {
  std::vector<double> joins;  // µs per join of a member of a group of 2
  std::vector<double> rtts;   // µs per round trip member -> joiner
};

// A member "m" and `rounds` joiners, one at a time: each joins (connects to
// the member and, with a secret, authenticates), makes round trips, and
// leaves.
PipeFigures pipe_figures(std::shared_ptr<const Secret> secret, int rounds) {
  auto store = std::make_shared<HashStore>();
  PipeAgent member(store, "m", 0, std::nullopt, pipe_options(secret));
  echo(member);
  PipeFigures figures;
  for (int i = 0; i < rounds; ++i) {
    const auto start = Clock::now();
    PipeAgent joiner(store, fmt::format("j{}", i), i + 1, std::nullopt, pipe_options(secret));
    figures.joins.push_back(us_since(start));
    echo(joiner);
    const rpc::WorkerInfo to = member.worker(fmt::format("j{}", i));
    for (int k = 0; k < 50; ++k) {
      Message m;
      m.type = rpc::MessageType::kRequest;
      m.function = "echo";
      m.payload = {1, 2, 3};
      const auto call = Clock::now();
      member.send(to, std::move(m), std::chrono::seconds(30)).value();
      if (k >= 10) figures.rtts.push_back(us_since(call));  // warm
    }
    joiner.join(std::chrono::seconds(30));
  }
  return figures;
}

void print_pair(const std::string& name, const std::vector<double>& without,
                const std::vector<double>& with) {
  const double a = median(without);
  const double b = median(with);
  print_value(name + "_us_p50_plain", fmt::format("{:.1f}", a));
  print_value(name + "_us_p50_secret", fmt::format("{:.1f}", b));
  print_value(name + "_ratio", fmt::format("{:.3f}", b / a));
}

int run_auth_bench(const Flags& flags) {
  fmt::print("# auth: the job secret's cost, with and without it, in this run\n");
  print_value("loadavg_start", load_average());
  print_value("rounds", std::to_string(flags.rounds));
  const auto secret = std::make_shared<const Secret>(Secret::random());
  // Each figure twice, in the order plain, secret, secret, plain, so that
  // warming up and drifting load fall on both alike.
  auto append = [](std::vector<double>& to, const std::vector<double>& from) {
    to.insert(to.end(), from.begin(), from.end());
  };
  std::vector<double> store_plain, store_secret;
  const int joins = std::max(10, flags.rounds / 10);
  PipeFigures pipe_plain, pipe_secret;
  for (int pass = 0; pass < 2; ++pass) {
    for (const bool with : pass == 0 ? std::vector<bool>{false, true}
                                     : std::vector<bool>{true, false}) {
      progress("{} store connections and {} PIPE joins {} a secret", flags.rounds, joins,
               with ? "with" : "without");
      append(with ? store_secret : store_plain,
             store_connects(with ? secret : nullptr, flags.rounds));
      const PipeFigures f = pipe_figures(with ? secret : nullptr, joins);
      PipeFigures& into = with ? pipe_secret : pipe_plain;
      append(into.joins, f.joins);
      append(into.rtts, f.rtts);
    }
  }
  print_pair("store_connect", store_plain, store_secret);
  print_pair("pipe_join", pipe_plain.joins, pipe_secret.joins);
  print_pair("pipe_rtt", pipe_plain.rtts, pipe_secret.rtts);
  print_value("loadavg_end", load_average());
  return 0;
}

}  // namespace

Subcommand add_auth_bench(CLI::App& bench, const std::string&) {
  auto flags = std::make_shared<Flags>();
  CLI::App* sub = bench.add_subcommand(
      "auth", "connection setup and round trips with and without the job secret");
  cli::set_synopsis(*sub, "bench auth [--rounds N]");
  sub->add_option("--rounds", flags->rounds, "store connections per figure (joins: a tenth)")
      ->type_name("N")
      ->check(cli::in_range(1, 100000));
  return {sub, [flags] { return run_auth_bench(*flags); }};
}

}  // namespace switchboard::bench
