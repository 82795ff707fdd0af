#include "testkit/netns_cluster.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

extern char** environ;

namespace switchboard::netns {
namespace {

constexpr const char* kPrefix = "sbt";  // every cluster namespace starts with it

// What daemon_command() runs (util-linux and mount; /bin is /usr/bin on
// Debian 12, and holds mount on older layouts).
constexpr const char* kNsenter = "/usr/bin/nsenter";
constexpr const char* kUnshare = "/usr/bin/unshare";
constexpr const char* kMount = "/bin/mount";

std::string ip_path() {
  for (const char* path : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (::access(path, X_OK) == 0) return path;
  }
  return {};
}

struct Output {
  int status = -1;   // exit code, or 128 + signal
  std::string text;  // stdout and stderr
};

// Runs `argv` (argv[0] a path) and collects what it prints.
Output run(const std::vector<std::string>& argv) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    throw std::runtime_error(fmt::format("NetnsCluster: pipe: {}", std::strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  Output out;
  if (rc != 0) {
    ::close(fds[0]);
    out.text = fmt::format("cannot start {}: {}", argv[0], std::strerror(rc));
    return out;
  }
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(fds[0], buffer, sizeof(buffer));
    if (n > 0) {
      out.text.append(buffer, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  out.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return out;
}

Output run_ip(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {ip_path()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv);
}

// Host `host`'s link-layer address on network `net`: fixed (locally
// administered), so that other hosts' neighbor entries can name it.
std::string mac_address(int host, int net) {
  return fmt::format("02:5b:00:00:{:02x}:{:02x}", net, host);
}

std::vector<std::string> words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// Kills every process in namespace `ns` and deletes it. Best effort.
// `ip netns exec NS` bind-mounts the files of /etc/netns/NS/ over /etc/.
constexpr const char* kEtcNetns = "/etc/netns";

void remove_namespace(const std::string& ns) {
  for (int round = 0; round < 3; ++round) {
    const std::vector<std::string> pids = words(run_ip({"netns", "pids", ns}).text);
    if (pids.empty()) break;
    for (const std::string& pid : pids) {
      try {
        ::kill(static_cast<pid_t>(std::stoi(pid)), SIGKILL);
      } catch (const std::exception&) {
      }
    }
  }
  run_ip({"netns", "del", ns});
  // The host's own /etc files (host names), if it had them.
  std::error_code ignored;
  std::filesystem::remove_all(std::filesystem::path(kEtcNetns) / ns, ignored);
}

// Deletes the namespaces of clusters whose test process is gone.
void sweep_stale() {
  std::istringstream lines(run_ip({"netns", "list"}).text);
  for (std::string line; std::getline(lines, line);) {
    const std::string name = line.substr(0, line.find(' '));
    if (name.rfind(kPrefix, 0) != 0) continue;
    const size_t dash = name.find('-');
    if (dash == std::string::npos) continue;
    pid_t owner = 0;
    try {
      owner = static_cast<pid_t>(std::stol(name.substr(3, dash - 3)));
    } catch (const std::exception&) {
      continue;
    }
    if (owner > 0 && (::kill(owner, 0) == 0 || errno != ESRCH)) continue;
    remove_namespace(name);
  }
}

std::vector<std::string> with_env(const std::vector<std::string>& argv,
                                  const std::map<std::string, std::string>& env) {
  std::vector<std::string> out;
  if (!env.empty()) {
    out.push_back("/usr/bin/env");
    for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  }
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

}  // namespace

std::string NetnsCluster::unavailable() {
  if (::geteuid() != 0) return "network namespaces need root (this test runs as a user)";
  if (ip_path().empty()) return "iproute2's `ip` is not installed (apt-get install iproute2)";
  // Everything a cluster does, once, in a namespace of its own: a
  // namespace, a bridge and a veth pair on it, a command run inside
  // (kernels or containers without one of them say so here, not in a
  // test's constructor).
  const std::string probe = fmt::format("{}{}-probe", kPrefix, ::getpid());
  const Output added = run_ip({"netns", "add", probe});
  if (added.status != 0) {
    return fmt::format("cannot create a network namespace (`ip netns add`: {})", added.text);
  }
  std::string why;
  for (const std::vector<std::string>& step :
       {std::vector<std::string>{"-n", probe, "link", "add", "br0", "type", "bridge"},
        std::vector<std::string>{"-n", probe, "link", "add", "v0", "type", "veth", "peer",
                                 "name", "v1"},
        std::vector<std::string>{"-n", probe, "link", "set", "v0", "master", "br0"},
        std::vector<std::string>{"netns", "exec", probe, "/bin/true"}}) {
    const Output out = run_ip(step);
    if (out.status != 0) {
      why = fmt::format("cannot build a virtual network or run in it (`ip {}`: {})",
                        fmt::join(step, " "), out.text);
      break;
    }
  }
  run_ip({"netns", "del", probe});
  return why;
}

bool NetnsCluster::skipped() {
  static const std::string why = unavailable();
  if (why.empty()) return false;
  fmt::print("skipped: {}\n", why);
  std::fflush(stdout);
  return true;
}

void NetnsCluster::ip(const std::vector<std::string>& args) {
  const Output out = run_ip(args);
  if (out.status != 0) {
    throw std::runtime_error(fmt::format("NetnsCluster: `ip {}` failed (exit {}): {}",
                                         fmt::join(args, " "), out.status, out.text));
  }
}

NetnsCluster::NetnsCluster(Options options)
    : second_network_(options.second_network), host_names_(options.host_names) {
  if (options.hosts < 1 || options.hosts > 200) {
    throw std::invalid_argument(fmt::format("NetnsCluster: {} hosts (1 to 200)", options.hosts));
  }
  static std::atomic<int> next{0};
  sweep_stale();
  prefix_ = fmt::format("{}{}-{}", kPrefix, ::getpid(), next++);
  switch_ns_ = prefix_ + "-sw";
  try {
    ip({"netns", "add", switch_ns_});
    ip({"-n", switch_ns_, "link", "set", "lo", "up"});
    const int networks = second_network_ ? 2 : 1;
    for (int net = 0; net < networks; ++net) {
      const std::string bridge = fmt::format("br{}", net);
      ip({"-n", switch_ns_, "link", "add", bridge, "type", "bridge"});
      ip({"-n", switch_ns_, "link", "set", bridge, "up"});
    }
    for (int h = 0; h < options.hosts; ++h) {
      const std::string ns = fmt::format("{}-h{}", prefix_, h);
      ip({"netns", "add", ns});
      hosts_.push_back(ns);
      ip({"-n", ns, "link", "set", "lo", "up"});
      for (int net = 0; net < networks; ++net) {
        const std::string port = fmt::format("p{}n{}", h, net);
        const std::string dev = fmt::format("eth{}", net);
        ip({"-n", switch_ns_, "link", "add", port, "type", "veth", "peer", "name", dev,
            "netns", ns});
        ip({"-n", switch_ns_, "link", "set", port, "master", fmt::format("br{}", net)});
        ip({"-n", switch_ns_, "link", "set", port, "up"});
        ip({"-n", ns, "addr", "add", fmt::format("198.{}.0.{}/24", 18 + net, h + 1), "dev",
            dev});
        ip({"-n", ns, "link", "set", dev, "address", mac_address(h, net)});
        ip({"-n", ns, "link", "set", dev, "up"});
      }
    }
    if (options.known_neighbors) {
      for (int h = 0; h < options.hosts; ++h) {
        for (int other = 0; other < options.hosts; ++other) {
          if (other == h) continue;
          for (int net = 0; net < networks; ++net) {
            ip({"-n", hosts_[h], "neigh", "replace",
                fmt::format("198.{}.0.{}", 18 + net, other + 1), "lladdr",
                mac_address(other, net), "dev", fmt::format("eth{}", net), "nud", "permanent"});
          }
        }
      }
    }
    if (host_names_) write_hosts_files();
  } catch (...) {
    for (const std::string& ns : hosts_) remove_namespace(ns);
    remove_namespace(switch_ns_);
    throw;
  }
}

NetnsCluster::~NetnsCluster() {
  for (const std::string& ns : hosts_) remove_namespace(ns);
  remove_namespace(switch_ns_);
}

std::string NetnsCluster::address(int host) const {
  hosts_.at(host);  // range check
  return fmt::format("198.18.0.{}", host + 1);
}

std::string NetnsCluster::host_name(int host) const {
  hosts_.at(host);  // range check
  if (!host_names_) {
    throw std::logic_error("NetnsCluster: host_name() of a cluster without host names");
  }
  return fmt::format("host{}", host);
}

void NetnsCluster::write_hosts_files() {
  std::string hosts = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n";
  for (int h = 0; h < size(); ++h) hosts += fmt::format("{}\t{}\n", address(h), host_name(h));
  for (const std::string& ns : hosts_) {
    const std::filesystem::path dir = std::filesystem::path(kEtcNetns) / ns;
    std::filesystem::create_directories(dir);
    std::ofstream out(dir / "hosts", std::ios::trunc);
    out << hosts;
    out.close();
    if (!out) throw std::runtime_error(fmt::format("NetnsCluster: cannot write {}/hosts", dir.string()));
  }
}

std::string NetnsCluster::address2(int host) const {
  if (!second_network_) {
    throw std::logic_error("NetnsCluster: address2() of a cluster without a second network");
  }
  hosts_.at(host);  // range check
  return fmt::format("198.19.0.{}", host + 1);
}

std::vector<std::string> NetnsCluster::exec_prefix(const std::string& ns) {
  return {ip_path(), "netns", "exec", ns};
}

std::vector<std::string> NetnsCluster::command(
    int host, const std::vector<std::string>& argv,
    const std::map<std::string, std::string>& env) const {
  std::vector<std::string> full = exec_prefix(hosts_.at(host));
  if (host_names_) {
    // A UTS namespace of its own, named as /etc/hosts names the host; the
    // shell execs the command, which keeps the pid.
    for (const char* a : {"/usr/bin/unshare", "--uts", "--", "/bin/sh", "-c",
                          "echo \"$0\" > /proc/sys/kernel/hostname && exec \"$@\""}) {
      full.push_back(a);
    }
    full.push_back(host_name(host));
  }
  for (std::string& a : with_env(argv, env)) full.push_back(std::move(a));
  return full;
}

std::string NetnsCluster::daemon_unavailable() {
  for (const char* tool : {kNsenter, kUnshare, kMount}) {
    if (::access(tool, X_OK) != 0) {
      return fmt::format("{} is not installed (util-linux and mount)", tool);
    }
  }
  return {};
}

std::vector<std::string> NetnsCluster::daemon_command(
    int host, const std::vector<std::string>& argv,
    const std::map<std::string, std::string>& env) const {
  // `ip netns add` makes /run/netns/<ns>, the file nsenter enters.
  std::vector<std::string> full = {kNsenter, "--net=/run/netns/" + hosts_.at(host)};
  if (host_names_) {
    // $0 is the host name, $1 the hosts file, the rest the command.
    for (const char* a :
         {kUnshare, "--mount", "--uts", "--propagation", "private", "--", "/bin/sh", "-c",
          "/bin/mount --bind \"$1\" /etc/hosts && echo \"$0\" > /proc/sys/kernel/hostname && "
          "shift && exec \"$@\""}) {
      full.push_back(a);
    }
    full.push_back(host_name(host));
    full.push_back((std::filesystem::path(kEtcNetns) / hosts_.at(host) / "hosts").string());
  }
  for (std::string& a : with_env(argv, env)) full.push_back(std::move(a));
  return full;
}

std::vector<int> NetnsCluster::pids(int host) const {
  std::vector<int> out;
  for (const std::string& pid : words(run_ip({"netns", "pids", hosts_.at(host)}).text)) {
    try {
      out.push_back(std::stoi(pid));
    } catch (const std::exception&) {
    }
  }
  return out;
}

void NetnsCluster::cut(int host) {
  const int networks = second_network_ ? 2 : 1;
  for (int net = 0; net < networks; ++net) {
    ip({"-n", switch_ns_, "link", "set", fmt::format("p{}n{}", host, net), "down"});
  }
}

void NetnsCluster::restore(int host) {
  const int networks = second_network_ ? 2 : 1;
  for (int net = 0; net < networks; ++net) {
    ip({"-n", switch_ns_, "link", "set", fmt::format("p{}n{}", host, net), "up"});
  }
}

void NetnsCluster::partition(const std::vector<std::vector<int>>& sides) {
  for (size_t a = 0; a < sides.size(); ++a) {
    for (size_t b = 0; b < sides.size(); ++b) {
      if (a == b) continue;
      for (int from : sides[a]) {
        for (int to : sides[b]) {
          std::vector<std::string> addresses = {address(to)};
          if (second_network_) addresses.push_back(address2(to));
          for (const std::string& addr : addresses) {
            ip({"-n", hosts_.at(from), "route", "add", "blackhole", addr + "/32"});
            blackholes_.emplace_back(from, addr);
          }
        }
      }
    }
  }
}

void NetnsCluster::heal() {
  for (const auto& [host, addr] : blackholes_) {
    ip({"-n", hosts_.at(host), "route", "del", "blackhole", addr + "/32"});
  }
  blackholes_.clear();
}

}  // namespace switchboard::netns
