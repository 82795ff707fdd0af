// Command line of the RPC demo: its flags (CLI11, through //common:cli) and
// what follows from them.
//
// Thread safety: plain functions over values; nothing is shared.
#pragma once

#include <cstdint>
#include <string>

namespace CLI {
class App;
}  // namespace CLI

namespace switchboard::rpc_demo {

struct DemoFlags {
  int64_t steps = 10000;          // SGD steps of the first trainer
  int64_t dim = 128;              // parameters (w* has this many weights)
  int64_t batch = 32;             // minibatch rows per step
  int64_t samples = 4096;         // rows in each trainer's shard
  int64_t held_out = 2048;        // rows in the ps's held-out set
  double lr = 0.05;               // SGD step size
  int64_t pushes_per_update = 0;  // K; 0: the number of trainers
  int64_t spread = 20;            // percent fewer steps for the last trainer
  int64_t log_every = 0;          // updates between progress lines; 0: ~10 lines
  int64_t seed = 1;               // w*, every shard and the held-out set
  int64_t late_joiner = -1;       // trainer that joins mid-run; 0 none, -1 auto
  int64_t leaver = -1;            // trainer that leaves early; 0 none, -1 auto
  // The Prometheus endpoint of every worker: -1 off (unless
  // SWITCHBOARD_METRICS_PORT says otherwise); 0 a port the kernel picks;
  // P > 0: worker of rank r on P + r. The ps prints part of a scrape of
  // its own endpoint in its report.
  int64_t metrics_port = -1;
  // PIPE, Gloo and the metrics endpoint bind it (it becomes
  // SWITCHBOARD_IFNAME); empty: each worker picks the address that routes
  // to the store (loopback when the store is on loopback), so the demo runs
  // unchanged on one host and on many.
  std::string listen_address;
  bool quick = false;  // about a second, for tests
};

// Declares the demo's flags on `app` (its name, help and checks) and where
// they go: *flags, which must outlive the app. Flags take "--flag VALUE" or
// "--flag=VALUE". --quick changes the defaults (steps, dim, samples,
// held-out rows), wherever it appears; flags given explicitly still win.
// Parsing fails (cli::parse()'s error, naming the flag and the value) on an
// unknown flag, a positional argument or a value out of range.
void add_demo_flags(CLI::App& app, DemoFlags* flags);

// Steps trainer `trainer` (1..trainers) runs: `steps` for trainer 1, down to
// steps * (1 - spread / 100) for the last one, so that the trainers finish
// at different times. At least 1.
int64_t steps_for(const DemoFlags& flags, int trainer, int trainers);

// The trainer that joins the group once the ps is halfway, and the one that
// leaves after a third of its steps (0: none): the flags, or by default the
// last trainer and trainer 2 when there are at least 3 trainers.
int64_t late_joiner(const DemoFlags& flags, int trainers);
int64_t leaver(const DemoFlags& flags, int trainers);

}  // namespace switchboard::rpc_demo
