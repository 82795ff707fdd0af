// FUZZ_CHECK(cond): the fuzz targets' own checks. It throws
// std::logic_error naming the file, line and condition, which neither the
// targets nor the code under test catch: libFuzzer reports it as a crash,
// the Bazel smoke runs as a failure.
#pragma once

#include <fmt/format.h>

#include <stdexcept>

#define FUZZ_CHECK(cond)                                                      \
  do {                                                                        \
    if (!(cond)) {                                                            \
      throw std::logic_error(                                                 \
          fmt::format("{}:{}: check failed: {}", __FILE__, __LINE__, #cond)); \
    }                                                                         \
  } while (0)
