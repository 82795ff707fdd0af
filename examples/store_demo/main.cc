// One worker of the store walkthrough: rendezvous through a TcpStore server
// the way a distributed job's ranks do, and print each step. Run N of them
// against one store_server:
//
//   store_demo --host 127.0.0.1 --port P --rank R --world-size N
//
// Bad flags print what is wrong and the usage on stderr and exit with 2;
// `store_demo --help` lists the flags.
//
// Steps: publish an "address", count in, wait for every peer's address,
// elect a leader with compare_set, let the leader publish a job config,
// append to a shared log, and leave through a store-based barrier.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "common/cli.h"
#include "common/logging.h"
#include "store/tcp_store.h"

using namespace switchboard;

namespace {

struct Flags {
  std::string host = "127.0.0.1";
  int port = 0;
  int rank = 0;
  int world_size = 0;
};

// Declares the flags on `app`; they fill *flags, which must outlive it.
void add_flags(CLI::App& app, Flags* flags) {
  app.name("store_demo");
  app.description(
      "One worker of the store demo: rendezvous through a TcpStore server the way\n"
      "a distributed job's ranks do, and print each step.");
  cli::set_synopsis(app, "store_demo --port P --rank R --world-size N [--host H]");
  app.add_option("--host", flags->host, "the store server's address")
      ->type_name("H")
      ->check(cli::non_empty("an address"));
  app.add_option("--port", flags->port, "the store server's port")
      ->type_name("P")
      ->required()
      ->check(cli::in_range(1, 65535));
  app.add_option("--rank", flags->rank, "this worker's rank, below --world-size")
      ->type_name("R")
      ->required()
      ->check(cli::at_least(0));
  app.add_option("--world-size", flags->world_size, "number of workers")
      ->type_name("N")
      ->required()
      ->check(cli::at_least(1));
  app.callback([flags] {
    if (flags->rank >= flags->world_size) {
      throw CLI::ValidationError(fmt::format("--rank {} is not below --world-size {}",
                                             flags->rank, flags->world_size));
    }
  });
}

void barrier(Store& store, const std::string& name, int world_size) {
  if (store.add(name + "/arrived", 1) == world_size) store.set(name + "/done", "1");
  store.wait({name + "/done"});
}

}  // namespace

int main(int argc, char** argv) {
  init_logging("store_demo");
  Flags flags;
  CLI::App app;
  add_flags(app, &flags);
  if (auto status = cli::report(app, cli::parse(app, argc, argv))) return *status;
  auto say = [&](const std::string& text) {
    fmt::print("[rank {}] {}\n", flags.rank, text);
    std::fflush(stdout);
  };
  TcpStoreOptions options;
  options.timeout = std::chrono::seconds(30);
  TcpStore store(flags.host, static_cast<uint16_t>(flags.port), options);
  say(fmt::format("connected to {}:{}", flags.host, flags.port));

  std::string address = fmt::format("10.0.0.{}:{}", flags.rank + 1, 29500 + flags.rank);
  store.set(fmt::format("addr/{}", flags.rank), address);
  int64_t order = store.add("joined", 1);
  say(fmt::format("published {} and was #{} to join", address, order));

  std::vector<std::string> keys;
  for (int r = 0; r < flags.world_size; ++r) keys.push_back(fmt::format("addr/{}", r));
  auto addresses = store.multi_get(keys);  // blocks until every rank published
  std::string table;
  for (int r = 0; r < flags.world_size; ++r) {
    table += fmt::format("{}{}={}", r ? ", " : "", r, to_string(addresses[r]));
  }
  say("sees every peer: " + table);

  std::string me = std::to_string(flags.rank);
  std::string leader = to_string(store.compare_set("leader", {}, to_bytes(me)));
  say(leader == me ? "won the leader election"
                   : fmt::format("follows leader rank {}", leader));
  if (leader == me) store.set("config", fmt::format("lr=0.1 steps=100 leader={}", me));
  say("got config: " + to_string(store.get("config")));

  store.append("log", to_bytes(fmt::format("rank{} ", flags.rank)));
  barrier(store, "exit", flags.world_size);
  if (leader == me) say("log after the barrier: " + to_string(store.get("log")));
  say(fmt::format("done; the store holds {} keys", store.num_keys()));
  return 0;
}
