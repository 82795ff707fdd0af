// NetnsCluster for tests: the test hosts of testkit/netns_cluster.h,
// plus processes started in them as sbtest::Subprocess (this test binary's
// children, registered with SB_CHILD_MAIN, or any program).
//
//   if (sbtest::NetnsCluster::skipped()) return;  // printed "skipped: <why>"
//   sbtest::NetnsCluster cluster({.hosts = 3});
//   Subprocess w = cluster.spawn_child(1, "worker", {"--rank", "1"},
//                                      {{"MASTER_ADDR", cluster.address(0)}});
//
// Thread safety: as the base class; one thread owns a cluster.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "tests/util/subprocess.h"
#include "testkit/netns_cluster.h"

namespace sbtest {

class NetnsCluster : public switchboard::netns::NetnsCluster {
 public:
  using switchboard::netns::NetnsCluster::NetnsCluster;

  // Starts `argv` in host `host`, with `env` added to the environment.
  Subprocess spawn(int host, const std::vector<std::string>& argv,
                   const std::map<std::string, std::string>& env = {}) const {
    return Subprocess(command(host, argv, env));
  }
  // Starts //tools/store_server (a data dependency of the test) in host
  // `host` on its address and `port`, with `extra` flags (e.g.
  // --secret-file), and waits for its "port=N" line.
  Subprocess spawn_store_server(int host, const std::string& port,
                                const std::vector<std::string>& extra = {}) const;
  // Starts this test binary's child `name` (SB_CHILD_MAIN) in host `host`.
  Subprocess spawn_child(int host, const std::string& name,
                         const std::vector<std::string>& args = {},
                         const std::map<std::string, std::string>& env = {}) const;
};

}  // namespace sbtest
