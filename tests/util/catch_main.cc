// Catch2's main for every test binary; dispatches child invocations first
// (see subprocess.h).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "tests/util/subprocess.h"

int main(int argc, char** argv) {
  int child = sbtest::maybe_run_child(argc, argv);
  if (child >= 0) return child;
  return Catch::Session().run(argc, argv);
}
