#include "common/auth.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

namespace switchboard {

Secret::Secret(std::vector<uint8_t> key) : key_(std::move(key)) {
  if (key_.size() < kMinBytes) {
    throw std::invalid_argument(fmt::format(
        "job secret: {} byte(s), at least {} are needed", key_.size(), kMinBytes));
  }
}

Secret Secret::from_file(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    throw std::invalid_argument(
        fmt::format("secret file \"{}\": {}", path, std::strerror(errno)));
  }
  if (!S_ISREG(info.st_mode)) {
    throw std::invalid_argument(fmt::format("secret file \"{}\" is not a regular file", path));
  }
  if ((info.st_mode & 077) != 0) {
    throw std::invalid_argument(fmt::format(
        "secret file \"{}\" has mode {:03o}: others than its owner may read or change it; "
        "run chmod 600 on it",
        path, info.st_mode & 0777));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw std::invalid_argument(fmt::format("secret file \"{}\" cannot be read", path));
  }
  std::vector<uint8_t> key((std::istreambuf_iterator<char>(in)),
                           std::istreambuf_iterator<char>());
  if (!key.empty() && key.back() == '\n') key.pop_back();
  if (key.size() < kMinBytes) {
    throw std::invalid_argument(
        fmt::format("secret file \"{}\" holds {} byte(s); a secret needs at least {}", path,
                    key.size(), kMinBytes));
  }
  return Secret(std::move(key));
}

std::shared_ptr<const Secret> Secret::from_environment() {
  const char* path = std::getenv(kEnvironmentVariable);
  if (path == nullptr || *path == '\0') return nullptr;
  try {
    return std::make_shared<const Secret>(from_file(path));
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("{}: {}", kEnvironmentVariable, e.what()));
  }
}

Secret Secret::random() {
  std::vector<uint8_t> key(32);
  if (RAND_bytes(key.data(), static_cast<int>(key.size())) != 1) {
    throw std::runtime_error("job secret: the system's random generator failed");
  }
  return Secret(std::move(key));
}

void Secret::write_file(const std::string& path) const {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw std::runtime_error(
        fmt::format("cannot write the secret file \"{}\": {}", path, std::strerror(errno)));
  }
  // A file that existed keeps its mode through O_CREAT: set it.
  bool ok = ::fchmod(fd, 0600) == 0;
  size_t written = 0;
  while (ok && written < key_.size()) {
    const ssize_t n = ::write(fd, key_.data() + written, key_.size() - written);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) written += static_cast<size_t>(n);
  }
  const int error = errno;
  ::close(fd);
  if (!ok) {
    throw std::runtime_error(
        fmt::format("cannot write the secret file \"{}\": {}", path, std::strerror(error)));
  }
}

Mac Secret::mac(std::initializer_list<std::span<const uint8_t>> parts) const {
  std::vector<uint8_t> message;
  for (const auto& part : parts) message.insert(message.end(), part.begin(), part.end());
  Mac out{};
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), key_.data(), static_cast<int>(key_.size()), message.data(),
           message.size(), out.data(), &length) == nullptr ||
      length != out.size()) {
    throw std::runtime_error("job secret: HMAC-SHA256 failed in libcrypto");
  }
  return out;
}

bool Secret::verify(std::span<const uint8_t> proof,
                    std::initializer_list<std::span<const uint8_t>> parts) const {
  return same_mac(proof, mac(parts));
}

bool same_mac(std::span<const uint8_t> proof, const Mac& expected) {
  return proof.size() == expected.size() &&
         CRYPTO_memcmp(proof.data(), expected.data(), expected.size()) == 0;
}

Nonce random_nonce() {
  Nonce nonce{};
  if (RAND_bytes(nonce.data(), static_cast<int>(nonce.size())) != 1) {
    throw std::runtime_error("nonce: the system's random generator failed");
  }
  return nonce;
}

}  // namespace switchboard
