#include "examples/rpc_demo/flags.h"

#include <algorithm>

#include "common/cli.h"

namespace switchboard::rpc_demo {

namespace {

constexpr const char* kDescription =
    "Rank 0 is the parameter server \"ps\"; ranks 1..N-1 are trainers\n"
    "\"trainer-1\"... that fit a linear regression y = X w* + noise with SGD over\n"
    "RPC in a dynamic group, then check with a Gloo allreduce that they hold the\n"
    "same parameters. With 3 or more trainers, one joins mid-run and one leaves.";

constexpr const char* kFooter =
    "Exit status: 0 the held-out loss went down and the trainers agree;\n"
    "1 it did not, they do not, or something failed; 2 usage error.";

// The smaller problem --quick picks (a run of about a second): the flags it
// changes, unless they are given, and their values.
struct QuickDefault {
  const char* flag;
  int64_t DemoFlags::*field;
  int64_t value;
};
constexpr QuickDefault kQuickDefaults[] = {
    {"--steps", &DemoFlags::steps, 200},
    {"--dim", &DemoFlags::dim, 64},
    {"--samples", &DemoFlags::samples, 1024},
    {"--held-out", &DemoFlags::held_out, 1024},
};

}  // namespace

void add_demo_flags(CLI::App& app, DemoFlags* flags) {
  app.name("rpc_demo");
  app.description(kDescription);
  app.footer(kFooter);
  cli::set_synopsis(app, "launch --nproc N -- rpc_demo [flags]");
  auto add_int = [&](const char* name, int64_t* field, const char* value_name,
                     const char* help, int64_t min) {
    return app.add_option(name, *field, help)
        ->type_name(value_name)
        ->check(cli::at_least(min));
  };
  add_int("--steps", &flags->steps, "S", "SGD steps of trainer-1; 200 with --quick", 1);
  app.add_option("--spread", flags->spread, "the last trainer runs P% fewer steps")
      ->type_name("P")
      ->check(cli::in_range(0, 90));
  add_int("--dim", &flags->dim, "D", "parameters; 64 with --quick", 1);
  add_int("--batch", &flags->batch, "B", "minibatch rows per step", 1);
  add_int("--samples", &flags->samples, "R",
          "rows in each trainer's shard; 1024 with --quick", 1);
  add_int("--held-out", &flags->held_out, "R",
          "rows in the ps's held-out set; 1024 with --quick", 1);
  app.add_option("--lr", flags->lr, "SGD step size")
      ->type_name("X")
      ->check(cli::positive_number());
  add_int("--pushes-per-update", &flags->pushes_per_update, "K",
          "gradients averaged into one update; 0: the number of trainers, i.e. one "
          "update per round",
          0);
  add_int("--log-every", &flags->log_every, "U",
          "updates between progress lines; 0: about 10 lines", 0);
  add_int("--late-joiner", &flags->late_joiner, "R",
          "trainer R joins the group once the ps is halfway; 0: none", 0)
      ->default_str("the last trainer when there are 3 or more");
  add_int("--leaver", &flags->leaver, "R",
          "trainer R leaves the group after a third of its steps; 0: none", 0)
      ->default_str("trainer-2 when there are 3 or more");
  add_int("--seed", &flags->seed, "N", "seed of w*, the shards and the held-out set", 0);
  app.add_option("--listen-address", flags->listen_address,
                 "address or interface PIPE, Gloo and the metrics endpoint bind (default: "
                 "the address that routes to the store)")
      ->type_name("A")
      ->check(cli::non_empty("an address"));
  app.add_option("--metrics-port", flags->metrics_port,
                 "serve Prometheus metrics: 0 on ports the kernel picks, P on P + rank")
      ->type_name("P")
      ->check(cli::in_range(0, 65535 - 4096));
  app.add_flag("--quick", flags->quick, "a run of about a second, for tests");
  app.callback([&app, flags] {
    if (!flags->quick) return;
    for (const QuickDefault& quick : kQuickDefaults) {
      if (app.count(quick.flag) == 0) flags->*quick.field = quick.value;
    }
  });
}

int64_t late_joiner(const DemoFlags& flags, int trainers) {
  if (flags.late_joiner >= 0) return flags.late_joiner;
  return trainers >= 3 ? trainers : 0;
}

int64_t leaver(const DemoFlags& flags, int trainers) {
  if (flags.leaver >= 0) return flags.leaver;
  return trainers >= 3 ? 2 : 0;
}

int64_t steps_for(const DemoFlags& flags, int trainer, int trainers) {
  if (trainers <= 1) return flags.steps;
  const int64_t fewer =
      flags.steps * flags.spread * (trainer - 1) / (100 * int64_t{trainers - 1});
  return std::max<int64_t>(1, flags.steps - fewer);
}

}  // namespace switchboard::rpc_demo
