// Little-endian integers in byte buffers, for the agents' wire codecs
// (core/tensor_descriptor.h, agents/pipe/wire/frame.h). No alignment needed.
// Pure functions; thread-safe.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace switchboard {

// Writes `value` as sizeof(T) little-endian bytes at `p`.
template <typename T>
void store_le(uint8_t* p, T value) {
  using U = std::make_unsigned_t<T>;
  auto u = static_cast<U>(value);
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(p, &u, sizeof u);
  } else {
    for (size_t i = 0; i < sizeof u; ++i) p[i] = static_cast<uint8_t>(u >> (8 * i));
  }
}

// Reads sizeof(T) little-endian bytes at `p`.
template <typename T>
T load_le(const uint8_t* p) {
  using U = std::make_unsigned_t<T>;
  U u = 0;
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(&u, p, sizeof u);
  } else {
    for (size_t i = 0; i < sizeof u; ++i) u |= static_cast<U>(U{p[i]} << (8 * i));
  }
  return static_cast<T>(u);
}

}  // namespace switchboard
