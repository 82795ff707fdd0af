// The job secret, and the proofs built from it: what lets a store server, a
// store client and the workers of a job know that the other side belongs to
// the job (docs/security.md).
//
// A secret is a key of at least kMinBytes bytes shared by every process of
// a job, usually through a file that only its owner can read
// (SWITCHBOARD_SECRET_FILE; tools/launch makes one per job). Each side of a
// connection sends a fresh random nonce, and proves it holds the secret
// with an HMAC-SHA256 over a label naming its role and both nonces (and
// whatever else the protocol binds, e.g. both worker names), so that a
// proof recorded on one connection is worth nothing on another.
//
// Errors: std::invalid_argument naming the file and what is wrong with it
// (others may read it, it is too short, it cannot be read).
// Thread safety: a Secret is immutable; share it freely.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace switchboard {

using Mac = std::array<uint8_t, 32>;     // an HMAC-SHA256
using Nonce = std::array<uint8_t, 32>;   // a random challenge

class Secret {
 public:
  static constexpr size_t kMinBytes = 16;
  // The variable naming the job's secret file.
  static constexpr const char* kEnvironmentVariable = "SWITCHBOARD_SECRET_FILE";

  // The key itself; std::invalid_argument when shorter than kMinBytes.
  explicit Secret(std::vector<uint8_t> key);

  // The file's bytes (one trailing newline dropped). Refuses a file that
  // its group or others may read or write (mode & 077), naming it and its
  // mode, and one shorter than kMinBytes.
  static Secret from_file(const std::string& path);
  // The secret SWITCHBOARD_SECRET_FILE names; null when the variable is
  // unset or empty. Reads the file at each call.
  static std::shared_ptr<const Secret> from_environment();
  // 32 random bytes from the system's generator.
  static Secret random();

  // Writes the key to `path`, created (or truncated) with mode 0600.
  // std::runtime_error naming the path on failure.
  void write_file(const std::string& path) const;

  // HMAC-SHA256 of the concatenation of `parts`.
  Mac mac(std::initializer_list<std::span<const uint8_t>> parts) const;
  // Whether `proof` is mac(parts), compared in constant time.
  bool verify(std::span<const uint8_t> proof,
              std::initializer_list<std::span<const uint8_t>> parts) const;

 private:
  std::vector<uint8_t> key_;
};

// A fresh nonce from the system's cryptographic generator.
Nonce random_nonce();

// Whether `proof` is `expected`, compared in constant time.
bool same_mac(std::span<const uint8_t> proof, const Mac& expected);

// The bytes of a string, for Secret::mac's parts.
inline std::span<const uint8_t> bytes_of(std::string_view text) {
  return {reinterpret_cast<const uint8_t*>(text.data()), text.size()};
}

}  // namespace switchboard
