#include "common/listen_address.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <set>
#include <stdexcept>
#include <utility>

#include "common/mutex.h"

namespace switchboard {
namespace {

bool is_numeric_address(const std::string& text) {
  in_addr v4{};
  in6_addr v6{};
  return inet_pton(AF_INET, text.c_str(), &v4) == 1 ||
         inet_pton(AF_INET6, text.c_str(), &v6) == 1;
}

std::string numeric(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(address)->sin_addr, text,
              sizeof(text));
  } else if (address->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr, text,
              sizeof(text));
  }
  return text;
}

bool is_loopback(const sockaddr* address) {
  if (address->sa_family == AF_INET) {
    const uint32_t host =
        ntohl(reinterpret_cast<const sockaddr_in*>(address)->sin_addr.s_addr);
    return (host >> 24) == 127;
  }
  if (address->sa_family == AF_INET6) {
    return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr);
  }
  return false;
}

// Calls `f(const addrinfo&)` for each address `host` resolves to, until it
// returns true; false when none did (or `host` does not resolve).
template <typename F>
bool for_each_resolved(const std::string& host, int socktype, F&& f) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = socktype;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  bool done = false;
  for (addrinfo* it = found; it != nullptr && !done; it = it->ai_next) done = f(*it);
  freeaddrinfo(found);
  return done;
}

bool bindable(const addrinfo& ai) {
  const int fd = ::socket(ai.ai_family, ai.ai_socktype, ai.ai_protocol);
  if (fd < 0) return false;
  const bool ok = ::bind(fd, ai.ai_addr, ai.ai_addrlen) == 0;
  ::close(fd);
  return ok;
}

// The host name's first address that is not loopback and can be bound.
std::string host_name_address() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return {};
  std::string address;
  for_each_resolved(name, SOCK_STREAM, [&](const addrinfo& ai) {
    if (is_loopback(ai.ai_addr) || !bindable(ai)) return false;
    address = numeric(ai.ai_addr);
    return true;
  });
  return address;
}

// The first up, non-loopback interface's IPv4 address, or empty.
std::string first_interface_address() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return {};
  std::string address;
  for (ifaddrs* it = list; it != nullptr && address.empty(); it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    if ((it->ifa_flags & IFF_UP) == 0 || (it->ifa_flags & IFF_LOOPBACK) != 0) continue;
    address = numeric(it->ifa_addr);
  }
  freeifaddrs(list);
  return address;
}

// `value` of `where` (an option or variable): an address, or an interface
// (or, with `host_name`, a host name).
ListenAddress from_setting(const std::string& component, const std::string& where,
                           const std::string& value, bool host_name = false) {
  if (is_numeric_address(value)) return {value, fmt::format("{} is {}", where, value)};
  if (host_name) {
    std::string resolved;
    for_each_resolved(value, SOCK_STREAM, [&](const addrinfo& ai) {
      resolved = numeric(ai.ai_addr);
      return true;
    });
    if (!resolved.empty()) return {resolved, fmt::format("{} names host {}", where, value)};
    throw std::invalid_argument(fmt::format(
        "{}: {} is \"{}\", which is neither an address nor a host name that resolves",
        component, where, value));
  }
  if (std::string address = interface_address(value); !address.empty()) {
    return {address, fmt::format("{} names interface {}", where, value)};
  }
  throw std::invalid_argument(fmt::format(
      "{}: {} is \"{}\", which is neither an address nor an interface that exists and "
      "has an address (see `ip -brief address`)",
      component, where, value));
}

const char* non_empty_env(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  return value != nullptr && *value != '\0' ? value : nullptr;
}

ListenAddress choose(const ListenAddressRequest& request) {
  if (!request.option.empty()) {
    return from_setting(request.component, "the listen address option", request.option);
  }
  if (const char* value = non_empty_env("SWITCHBOARD_IFNAME")) {
    return from_setting(request.component, "SWITCHBOARD_IFNAME", value);
  }
  for (const ListenAddressRequest::Alias& alias : request.aliases) {
    if (const char* value = non_empty_env(alias.variable)) {
      return from_setting(request.component, alias.variable, value, alias.host_name);
    }
  }
  std::string store = request.store_host;
  std::string store_from = "the store";
  if (store.empty()) {
    if (const char* master = non_empty_env("MASTER_ADDR")) {
      store = master;
      store_from = "MASTER_ADDR";
    }
  }
  if (!store.empty()) {
    if (std::string address = route_source_address(store); !address.empty()) {
      return {address,
              fmt::format("the address that routes to the store at {} ({})", store, store_from)};
    }
  }
  if (std::string address = host_name_address(); !address.empty()) {
    return {address, "this host's name"};
  }
  if (std::string address = first_interface_address(); !address.empty()) {
    return {address, "the first interface that is up"};
  }
  return {"127.0.0.1", "no other address found"};
}

}  // namespace

std::string interface_address(const std::string& name) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return {};
  std::string v4;
  std::string v6;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || name != it->ifa_name) continue;
    if (it->ifa_addr->sa_family == AF_INET && v4.empty()) v4 = numeric(it->ifa_addr);
    if (it->ifa_addr->sa_family == AF_INET6 && v6.empty()) v6 = numeric(it->ifa_addr);
  }
  freeifaddrs(list);
  return v4.empty() ? v6 : v4;
}

std::string route_source_address(const std::string& host) {
  std::string address;
  for_each_resolved(host, SOCK_DGRAM, [&](const addrinfo& ai) {
    const int fd = ::socket(ai.ai_family, SOCK_DGRAM, 0);
    if (fd < 0) return false;
    // A connected UDP socket has a source address once the kernel found a
    // route; nothing is sent. The port only has to be non-zero.
    sockaddr_storage target{};
    std::memcpy(&target, ai.ai_addr, ai.ai_addrlen);
    if (target.ss_family == AF_INET) {
      reinterpret_cast<sockaddr_in*>(&target)->sin_port = htons(9);
    } else {
      reinterpret_cast<sockaddr_in6*>(&target)->sin6_port = htons(9);
    }
    sockaddr_storage local{};
    socklen_t length = sizeof(local);
    const bool ok =
        ::connect(fd, reinterpret_cast<const sockaddr*>(&target), ai.ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0;
    ::close(fd);
    if (!ok) return false;
    address = numeric(reinterpret_cast<const sockaddr*>(&local));
    return !address.empty();
  });
  return address;
}

std::optional<PortRange> port_range(const std::string& option) {
  std::string value = option;
  std::string source = "the port_range option";
  if (value.empty()) {
    const char* env = non_empty_env("SWITCHBOARD_PORT_RANGE");
    if (env == nullptr) return std::nullopt;
    value = env;
    source = "SWITCHBOARD_PORT_RANGE";
  }
  auto number = [](const std::string& text, int* out) {
    if (text.empty() || text.size() > 5 ||
        text.find_first_not_of("0123456789") != std::string::npos) {
      return false;
    }
    *out = std::stoi(text);
    return *out >= 1 && *out <= 65535;
  };
  const size_t dash = value.find('-');
  int lo = 0;
  int hi = 0;
  const bool ok = dash == std::string::npos
                      ? number(value, &lo) && number(value, &hi)
                      : number(value.substr(0, dash), &lo) && number(value.substr(dash + 1), &hi);
  if (!ok || lo > hi) {
    throw std::invalid_argument(fmt::format(
        "{} is \"{}\": want LO-HI with 1 <= LO <= HI <= 65535 (or one port)", source, value));
  }
  return PortRange{static_cast<uint16_t>(lo), static_cast<uint16_t>(hi), source};
}

uint16_t bind_in_range(const PortRange& range, const std::string& who,
                       const std::function<std::string(uint16_t port)>& try_bind) {
  std::string last;
  for (uint32_t port = range.lo; port <= range.hi; ++port) {
    const std::string why = try_bind(static_cast<uint16_t>(port));
    if (why.empty()) return static_cast<uint16_t>(port);
    last = fmt::format("{}: {}", port, why);
  }
  throw std::runtime_error(fmt::format(
      "{}: no free port in {}-{} ({}); the last one tried, {}", who, range.lo, range.hi,
      range.source, last));
}

bool is_local_address(const std::string& host) {
  return for_each_resolved(host, SOCK_STREAM, [](const addrinfo& ai) { return bindable(ai); });
}

ListenAddress choose_listen_address(const ListenAddressRequest& request) {
  ListenAddress chosen = choose(request);
  static Mutex mu;
  static std::set<std::pair<std::string, std::string>>* logged =
      new std::set<std::pair<std::string, std::string>>();
  bool first = false;
  {
    MutexLock lock(mu);
    first = logged->emplace(request.component, chosen.address).second;
  }
  if (first) {
    spdlog::info("{} listens on {}: {}", request.component, chosen.address, chosen.reason);
  }
  return chosen;
}

}  // namespace switchboard
