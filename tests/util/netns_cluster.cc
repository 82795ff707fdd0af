#include "tests/util/netns_cluster.h"

#include <unistd.h>

#include <climits>
#include <stdexcept>

namespace sbtest {

Subprocess NetnsCluster::spawn_store_server(int host, const std::string& port,
                                            const std::vector<std::string>& extra) const {
  std::vector<std::string> argv = {runfile("tools/store_server/store_server"), "--host",
                                   address(host), "--port", port, "--quiet"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  Subprocess server = spawn(host, argv);
  if (const std::string line = server.read_line(); line != "port=" + port) {
    throw std::runtime_error("NetnsCluster: the store server printed \"" + line +
                             "\", not port=" + port);
  }
  return server;
}

Subprocess NetnsCluster::spawn_child(int host, const std::string& name,
                                     const std::vector<std::string>& args,
                                     const std::map<std::string, std::string>& env) const {
  // The test binary's own path: /proc/self/exe would name `ip` in the child.
  char path[PATH_MAX] = {};
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) throw std::runtime_error("NetnsCluster: cannot read /proc/self/exe");
  std::vector<std::string> argv = {std::string(path, static_cast<size_t>(n)), "--sb-child",
                                   name};
  argv.insert(argv.end(), args.begin(), args.end());
  return spawn(host, argv, env);
}

}  // namespace sbtest
