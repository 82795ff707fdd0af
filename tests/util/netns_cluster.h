// A cluster of test hosts on this machine: each "host" is a network
// namespace with its own address, all joined by a virtual switch (a bridge
// in a namespace of its own), so a multi-host test runs real TCP between
// distinct addresses without touching the machine's own network.
//
//   if (sbtest::NetnsCluster::skipped()) return;  // printed "skipped: <why>"
//   sbtest::NetnsCluster cluster({.hosts = 3});
//   Subprocess w = cluster.spawn_child(1, "worker", {"--rank", "1"},
//                                      {{"MASTER_ADDR", cluster.address(0)}});
//   cluster.cut(2);      // host 2's link goes down
//   cluster.restore(2);  // and comes back
//
// Addresses: host i is 198.18.0.(i+1)/24 on eth0 and, with
// `second_network`, 198.19.0.(i+1)/24 on eth1 (a second switch). Both are in
// the benchmarking range 198.18.0.0/15, which no real network uses; the
// namespaces see nothing else (not even the machine's own interfaces).
//
// Teardown: the destructor kills every process left in the cluster's
// namespaces and deletes them (their links go with them). A test process
// that was killed cannot run its destructor: every new cluster first
// removes the namespaces of clusters whose process is gone (their names
// carry its pid).
//
// Needs root and iproute2's `ip`. Errors: std::runtime_error naming the
// `ip` command that failed and what it printed. Not thread-safe: one
// thread owns a cluster.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "tests/util/subprocess.h"

namespace sbtest {

class NetnsCluster {
 public:
  struct Options {
    int hosts = 2;
    bool second_network = false;  // eth1 on 198.19.0.0/24 as well
  };

  // Why clusters cannot be made here (not root, no `ip`, namespaces
  // refused), for a test's `skipped:` line; empty when they can.
  static std::string unavailable();
  // When unavailable(): prints "skipped: <reason>" on stdout (tools/test
  // counts the case as skipped) and returns true.
  static bool skipped();

  explicit NetnsCluster(Options options);
  ~NetnsCluster();
  NetnsCluster(const NetnsCluster&) = delete;
  NetnsCluster& operator=(const NetnsCluster&) = delete;

  int size() const { return static_cast<int>(hosts_.size()); }
  // Host `host`'s address on the first (eth0) and second (eth1) network.
  std::string address(int host) const;
  std::string address2(int host) const;
  // The namespace's name, for `ip netns exec`.
  const std::string& ns(int host) const { return hosts_.at(host); }

  // Starts this test binary's child `name` (SB_CHILD_MAIN) in host `host`,
  // with `env` added to the environment.
  Subprocess spawn_child(int host, const std::string& name,
                         const std::vector<std::string>& args = {},
                         const std::map<std::string, std::string>& env = {}) const;
  // Starts `argv` in host `host`, with `env` added to the environment.
  Subprocess spawn(int host, const std::vector<std::string>& argv,
                   const std::map<std::string, std::string>& env = {}) const;

  // The processes running in host `host` (`ip netns pids`).
  std::vector<int> pids(int host) const;

  // Takes host `host`'s links down at the switch (it keeps its addresses,
  // and reaches no one), and brings them back.
  void cut(int host);
  void restore(int host);

  // Runs `ip args...`; throws std::runtime_error with its output when it
  // fails.
  static void ip(const std::vector<std::string>& args);

 private:
  std::string prefix_;
  std::string switch_ns_;
  std::vector<std::string> hosts_;
  bool second_network_ = false;
};

}  // namespace sbtest
