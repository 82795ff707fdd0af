#include "tests/util/netns_spawn.h"

#include <unistd.h>

#include <climits>
#include <stdexcept>

namespace sbtest {

Subprocess spawn_in(const NetnsCluster& cluster, int host,
                    const std::vector<std::string>& argv,
                    const std::map<std::string, std::string>& env) {
  return Subprocess(cluster.command(host, argv, env));
}

Subprocess spawn_store_server_in(const NetnsCluster& cluster, int host,
                                 const std::string& port,
                                 const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {runfile("tools/store_server/store_server"),
                                   "--host",
                                   cluster.address(host),
                                   "--port",
                                   port,
                                   "--quiet"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  Subprocess server = spawn_in(cluster, host, argv);
  if (const std::string line = server.read_line(); line != "port=" + port) {
    throw std::runtime_error("spawn_store_server_in: the store server in host " +
                             std::to_string(host) + " printed \"" + line +
                             "\", not port=" + port);
  }
  return server;
}

Subprocess spawn_child_in(const NetnsCluster& cluster, int host, const std::string& name,
                          const std::vector<std::string>& args,
                          const std::map<std::string, std::string>& env) {
  // The test binary's own path: /proc/self/exe would name `ip` in the child.
  char path[PATH_MAX] = {};
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) throw std::runtime_error("spawn_child_in: cannot read /proc/self/exe");
  std::vector<std::string> argv = {std::string(path, static_cast<size_t>(n)),
                                   "--sb-child", name};
  argv.insert(argv.end(), args.begin(), args.end());
  return spawn_in(cluster, host, argv, env);
}

}  // namespace sbtest
