#include "common/host_key.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

namespace switchboard {

namespace {

std::string read_link(const char* path) {
  char buffer[256];
  const ssize_t n = ::readlink(path, buffer, sizeof buffer);
  return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : std::string("?");
}

}  // namespace

const std::string& host_key() {
  static const std::string key = [] {
    std::string boot;
    if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
      char line[64] = {};
      if (std::fgets(line, sizeof line, f) != nullptr) boot = line;
      std::fclose(f);
    }
    while (!boot.empty() && (boot.back() == '\n' || boot.back() == ' ')) boot.pop_back();
    return fmt::format("{} {} {} {}", boot, read_link("/proc/self/ns/net"),
                       read_link("/proc/self/ns/ipc"), read_link("/proc/self/ns/pid"));
  }();
  return key;
}

}  // namespace switchboard
