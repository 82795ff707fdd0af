// The RPC demo's flags (examples/rpc_demo/flags.h): defaults, --quick, ranges,
// and the per-trainer values that follow from them.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "common/cli.h"
#include "examples/rpc_demo/flags.h"

namespace cli = switchboard::cli;
using namespace switchboard::rpc_demo;
using Args = std::vector<std::string>;

namespace {

using Parsed = cli::Parsed<DemoFlags>;

Parsed parse(const Args& args) { return cli::parse_flags(add_demo_flags, args); }

}  // namespace

TEST_CASE("demo flags: no flags keep the defaults", "[rpc_demo][cli]") {
  Parsed p = parse({});
  REQUIRE(p.outcome.ok());
  const DemoFlags defaults;
  CHECK(p.flags.steps == defaults.steps);
  CHECK(p.flags.dim == defaults.dim);
  CHECK(p.flags.samples == defaults.samples);
  CHECK(p.flags.held_out == defaults.held_out);
  CHECK(p.flags.lr == defaults.lr);
  CHECK(p.flags.late_joiner == -1);
  CHECK(p.flags.leaver == -1);
  CHECK(p.flags.listen_address.empty());
  CHECK(p.flags.metrics_port == -1);
  CHECK_FALSE(p.flags.quick);
}

TEST_CASE(
    "demo flags: --quick shrinks the problem wherever it appears, explicit flags win",
    "[rpc_demo][cli]") {
  Parsed before = parse({"--quick", "--steps", "3"});
  Parsed after = parse({"--steps=3", "--quick"});
  for (const Parsed* p : {&before, &after}) {
    INFO(p->outcome.error);
    REQUIRE(p->outcome.ok());
    CHECK(p->flags.quick);
    CHECK(p->flags.steps == 3);
    CHECK(p->flags.dim == 64);
    CHECK(p->flags.samples == 1024);
    CHECK(p->flags.held_out == 1024);
  }
}

TEST_CASE("demo flags: every flag is parsed", "[rpc_demo][cli]") {
  Parsed p = parse({"--steps",
                    "50",
                    "--spread",
                    "90",
                    "--dim",
                    "8",
                    "--batch",
                    "4",
                    "--samples",
                    "100",
                    "--held-out",
                    "10",
                    "--lr",
                    "0.5",
                    "--pushes-per-update",
                    "3",
                    "--log-every",
                    "0",
                    "--late-joiner",
                    "0",
                    "--leaver",
                    "2",
                    "--seed",
                    "0",
                    "--listen-address",
                    "::1",
                    "--metrics-port",
                    "9400"});
  INFO(p.outcome.error);
  REQUIRE(p.outcome.ok());
  CHECK(p.flags.steps == 50);
  CHECK(p.flags.spread == 90);
  CHECK(p.flags.dim == 8);
  CHECK(p.flags.batch == 4);
  CHECK(p.flags.samples == 100);
  CHECK(p.flags.held_out == 10);
  CHECK(p.flags.lr == 0.5);
  CHECK(p.flags.pushes_per_update == 3);
  CHECK(p.flags.log_every == 0);
  CHECK(p.flags.late_joiner == 0);
  CHECK(p.flags.leaver == 2);
  CHECK(p.flags.seed == 0);
  CHECK(p.flags.listen_address == "::1");
  CHECK(p.flags.metrics_port == 9400);
}

TEST_CASE("demo flags: refusals name the flag and the value", "[rpc_demo][cli]") {
  auto [args, error] = GENERATE(table<Args, std::string>({
      {{"--steps", "0"}, "--steps: '0' is not an integer >= 1"},
      {{"--dim", "-3"}, "--dim: '-3' is not an integer >= 1"},
      {{"--spread", "91"}, "--spread: '91' is not an integer from 0 to 90"},
      {{"--lr", "0"}, "--lr: '0' is not a positive number"},
      {{"--lr", "inf"}, "--lr: 'inf' is not a positive number"},
      {{"--late-joiner", "-1"}, "--late-joiner: '-1' is not an integer >= 0"},
      {{"--listen-address="}, "--listen-address needs a value"},
      {{"--metrics-port", "-1"}, "--metrics-port: '-1' is not an integer from 0 to 61439"},
      {{"--steps"}, "--steps needs a value"},
      {{"--bogus", "1"}, "unknown flag '--bogus'; unexpected argument '1'"},
      {{"extra"}, "unexpected argument 'extra'"},
  }));
  Parsed p = parse(args);
  CHECK(p.outcome.error == error);
}

TEST_CASE("demo flags: the last trainer runs spread% fewer steps, at least 1",
          "[rpc_demo]") {
  DemoFlags flags;
  flags.steps = 100;
  flags.spread = 20;
  CHECK(steps_for(flags, 1, 4) == 100);
  CHECK(steps_for(flags, 4, 4) == 80);
  CHECK(steps_for(flags, 1, 1) == 100);
  flags.steps = 1;
  flags.spread = 90;
  CHECK(steps_for(flags, 2, 2) == 1);
}

TEST_CASE("demo flags: the late joiner and the leaver default with 3 or more trainers",
          "[rpc_demo]") {
  DemoFlags flags;
  CHECK(late_joiner(flags, 4) == 4);
  CHECK(leaver(flags, 4) == 2);
  CHECK(late_joiner(flags, 2) == 0);
  CHECK(leaver(flags, 2) == 0);
  flags.late_joiner = 0;
  flags.leaver = 3;
  CHECK(late_joiner(flags, 4) == 0);
  CHECK(leaver(flags, 4) == 3);
}
