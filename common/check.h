// Two check macros, as STYLE.md asks:
//   SB_REQUIRE(cond, fmt, args...) - the caller has a bug: throws
//       std::invalid_argument with the formatted message.
//   SB_ASSERT(cond, fmt, args...)  - Switchboard has a bug: throws
//       switchboard::Error(kInternal) naming the file and line.
// Never use either on network input: bad bytes close a connection instead.
#pragma once

#include <fmt/format.h>

#include <stdexcept>

#include "common/error.h"

#define SB_REQUIRE(cond, ...)                                        \
  do {                                                               \
    if (!(cond)) throw std::invalid_argument(fmt::format(__VA_ARGS__)); \
  } while (0)

#define SB_ASSERT(cond, ...)                                                \
  do {                                                                      \
    if (!(cond)) {                                                          \
      throw ::switchboard::Error(                                           \
          ::switchboard::ErrorCode::kInternal,                              \
          fmt::format("internal error at {}:{}: check '{}' failed: {}",    \
                      __FILE__, __LINE__, #cond, fmt::format(__VA_ARGS__))); \
    }                                                                       \
  } while (0)
