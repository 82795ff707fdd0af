// Processes started in the test hosts of testkit/netns_cluster.h, as
// sbtest::Subprocess (this test binary's children, registered with
// SB_CHILD_MAIN, or any program).
//
//   if (NetnsCluster::skipped()) return;  // printed "skipped: <why>"
//   NetnsCluster cluster({.hosts = 3});
//   Subprocess w = spawn_child_in(cluster, 1, "worker", {"--rank", "1"},
//                                 {{"MASTER_ADDR", cluster.address(0)}});
//
// Errors: std::runtime_error (the process could not start, or the store
// server did not report its port). Thread safety: as the cluster's; one
// thread owns a cluster and the processes started in it.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "testkit/netns_cluster.h"
#include "tests/util/subprocess.h"

namespace sbtest {

using switchboard::netns::NetnsCluster;

// Starts `argv` in host `host`, with `env` added to the environment.
Subprocess spawn_in(const NetnsCluster& cluster, int host,
                    const std::vector<std::string>& argv,
                    const std::map<std::string, std::string>& env = {});

// Starts //tools/store_server (a data dependency of the test) in host
// `host` on its address and `port`, with `extra` flags (e.g.
// --secret-file), and waits for its "port=N" line.
Subprocess spawn_store_server_in(const NetnsCluster& cluster, int host,
                                 const std::string& port,
                                 const std::vector<std::string>& extra = {});

// Starts this test binary's child `name` (SB_CHILD_MAIN) in host `host`.
Subprocess spawn_child_in(const NetnsCluster& cluster, int host, const std::string& name,
                          const std::vector<std::string>& args = {},
                          const std::map<std::string, std::string>& env = {});

}  // namespace sbtest
