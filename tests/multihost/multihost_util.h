// Helpers of the multi-host tests (tests/multihost): the sockets a host
// listens on, the control file the test and its workers share, and the
// environment of a dynamic group's worker. Tests only.
#pragma once

#include <fmt/format.h>
#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "store/file_store.h"
#include "tests/util/netns_spawn.h"

namespace sbtest::multihost {

// The TCP sockets listening in this network namespace, as "address:port"
// (from /proc/net/tcp; IPv4 only, which is all these hosts have).
inline std::set<std::string> listening_sockets() {
  std::ifstream in("/proc/net/tcp");
  std::string line;
  std::getline(in, line);  // header
  std::set<std::string> out;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state;
    fields >> slot >> local >> remote >> state;
    if (state != "0A") continue;  // TCP_LISTEN
    const unsigned long ip = std::stoul(local.substr(0, 8), nullptr, 16);
    const unsigned long port = std::stoul(local.substr(9), nullptr, 16);
    // /proc prints the address in host byte order of a little-endian load.
    out.insert(fmt::format("{}.{}.{}.{}:{}", ip & 0xff, (ip >> 8) & 0xff, (ip >> 16) & 0xff,
                           (ip >> 24) & 0xff, port));
  }
  return out;
}

// The "listening ..." line a worker printed (the test fails without one).
inline std::string listening_line(const std::string& out) {
  const size_t at = out.find("listening ");
  REQUIRE(at != std::string::npos);
  return out.substr(at, out.find('\n', at) - at);
}

// A FileStore the test and its workers share (hosts have networks of their
// own, not file systems): the test sets keys the workers wait for.
class ControlFile {
 public:
  ControlFile() {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = fmt::format("{}/sb-control-XXXXXX", tmp ? tmp : "/tmp");
    REQUIRE(::mkdtemp(dir_.data()) != nullptr);
    path_ = dir_ + "/control";
  }
  ~ControlFile() {
    std::remove(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  const std::string& path() const { return path_; }
  void set(const std::string& key) const {
    switchboard::FileStore control(path_);
    control.set(key, {1});
  }

 private:
  std::string dir_;
  std::string path_;
};

// The store on host 0, members a, b and c on hosts 1 to 3, a joiner on 4.
inline std::map<std::string, std::string> dynamic_env(const NetnsCluster& cluster, int host,
                                               const std::string& store_port) {
  return {{"MASTER_ADDR", cluster.address(0)},
          {"MASTER_PORT", store_port},
          {"SWITCHBOARD_STORE", fmt::format("tcp://{}:{}", cluster.address(0), store_port)},
          {"SB_TEST_HOST_ADDRESS", cluster.address(host)}};
}

}  // namespace sbtest::multihost
