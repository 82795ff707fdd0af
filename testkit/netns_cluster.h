// A cluster of test hosts on this machine: each "host" is a network
// namespace with its own address, all joined by a virtual switch (a bridge
// in a namespace of its own), so a multi-host test runs real TCP between
// distinct addresses without touching the machine's own network.
//
//   if (NetnsCluster::skipped()) return;  // printed "skipped: <why>"
//   NetnsCluster cluster({.hosts = 3});
//   std::vector<std::string> argv = cluster.command(
//       1, {"/path/worker", "--rank", "1"}, {{"MASTER_ADDR", cluster.address(0)}});
//   // ... run argv (it runs in host 1) ...
//   cluster.cut(2);      // host 2's link goes down
//   cluster.restore(2);  // and comes back
//
// A daemon that needs the machine's /sys (slurmd does) runs with
// daemon_command() instead of command().
//
// Used by the multi-host tests (tests/util/netns_spawn.h starts their
// processes) and by `bench rpc --hosts`.
//
// Addresses: host i is 198.18.0.(i+1)/24 on eth0 and, with
// `second_network`, 198.19.0.(i+1)/24 on eth1 (a second switch). Both are in
// the benchmarking range 198.18.0.0/15, which no real network uses; the
// namespaces see nothing else (not even the machine's own interfaces).
//
// Teardown: the destructor kills every process left in the cluster's
// namespaces and deletes them (their links go with them, and their files
// under /etc/netns/). A test process
// that was killed cannot run its destructor: every new cluster first
// removes the namespaces of clusters whose process is gone (their names
// carry its pid).
//
// Needs root and iproute2's `ip`. Errors: std::runtime_error naming the
// `ip` command that failed and what it printed. Not thread-safe: one
// thread owns a cluster. Not for production networks: it exists to test
// and measure on one machine.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace switchboard::netns {

class NetnsCluster {
 public:
  struct Options {
    int hosts = 2;
    bool second_network = false;  // eth1 on 198.19.0.0/24 as well
    // Each host has a name, "host<i>": commands run in a UTS namespace of
    // their own with that host name, and every host's /etc/hosts (a file
    // /etc/netns/<ns>/hosts that `ip netns exec` mounts over /etc/hosts)
    // maps every host's name to its eth0 address, as a cluster's DNS would
    // (what SLURM's node names and torchrun's c10d rendezvous need).
    bool host_names = false;
    // Every host starts with every other host's link-layer address in its
    // neighbor table (permanent entries), as hosts that talked before have
    // them. A cut link then drops packets silently, as across a real
    // network: a connect to a cut host waits for its own timeout. Without
    // them, the sender's ARP request goes unanswered and the connect fails
    // after about 3 s with "No route to host".
    bool known_neighbors = false;
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
  // Host `host`'s name (clusters made with host_names); std::logic_error
  // otherwise.
  std::string host_name(int host) const;
  // The namespace's name, for `ip netns exec`.
  const std::string& ns(int host) const { return hosts_.at(host); }

  // What runs a command in network namespace `ns`: {"/usr/sbin/ip", "netns",
  // "exec", ns}; put the command after it.
  static std::vector<std::string> exec_prefix(const std::string& ns);

  // The command line that runs `argv` in host `host` (`ip netns exec`),
  // with `env` added to its environment. The process keeps its pid (each
  // step execs the next).
  std::vector<std::string> command(int host, const std::vector<std::string>& argv,
                                   const std::map<std::string, std::string>& env = {}) const;

  // The command line that runs a daemon in host `host`, with `env` added
  // to its environment: for programs that need the machine's /sys, which
  // `ip netns exec` hides (it remounts /sys for the namespace, and
  // /sys/fs/cgroup is gone: SLURM 22.05's slurmd then refuses to start).
  // nsenter enters the host's network namespace only. For a cluster made
  // with host_names, unshare adds a private mount namespace, where the
  // cluster's hosts file is bind-mounted over /etc/hosts (nothing under the
  // machine's /etc changes), and a UTS namespace named host_name(host), as
  // command() does. The process keeps its pid (each step execs the next),
  // so the caller stops the daemon by that pid. Needs util-linux's nsenter
  // and unshare (daemon_unavailable() says when they are missing).
  std::vector<std::string> daemon_command(int host, const std::vector<std::string>& argv,
                                          const std::map<std::string, std::string>& env = {})
      const;
  // Why daemon_command() cannot run here (nsenter, unshare or mount
  // missing); empty when it can.
  static std::string daemon_unavailable();

  // The processes running in host `host` (`ip netns pids`).
  std::vector<int> pids(int host) const;

  // Takes host `host`'s links down at the switch (it keeps its addresses,
  // and reaches no one), and brings them back.
  void cut(int host);
  void restore(int host);

  // Splits hosts into `sides`: a host of one side reaches no host of
  // another (packets to them are dropped, as behind a cut link: a blackhole
  // route to each of their addresses), while a host in no side (the
  // store's, say) still reaches every host and is reached by all. heal()
  // takes every split away.
  void partition(const std::vector<std::vector<int>>& sides);
  void heal();

  // Runs `ip args...`; throws std::runtime_error with its output when it
  // fails.
  static void ip(const std::vector<std::string>& args);

 private:
  std::string prefix_;
  std::string switch_ns_;
  std::vector<std::string> hosts_;
  bool second_network_ = false;
  bool host_names_ = false;
  void write_hosts_files();
  // The blackhole routes partition() added: (host, address).
  std::vector<std::pair<int, std::string>> blackholes_;
};

}  // namespace switchboard::netns
