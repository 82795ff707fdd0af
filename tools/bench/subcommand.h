// One `bench` subcommand, as each benchmark adds itself to the `bench` app
// (CLI11, through //common:cli): its parsed flags and what runs it.
#pragma once

#include <functional>

namespace CLI {
class App;
}  // namespace CLI

namespace switchboard::bench {

struct Subcommand {
  // Owned by the `bench` app it was added to; parsed() once chosen.
  CLI::App* app = nullptr;
  // Runs the benchmark with the parsed flags and returns the exit status.
  // Call it once, after parsing, when `app` was chosen.
  std::function<int()> run;
};

}  // namespace switchboard::bench
