#include "agents/pipe_address.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace switchboard::agents {
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

// The host name's first non-loopback address, or empty.
std::string host_name_address() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return {};
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(name, nullptr, &hints, &found) != 0) return {};
  std::string address;
  for (addrinfo* it = found; it != nullptr && address.empty(); it = it->ai_next) {
    if (!is_loopback(it->ai_addr)) address = numeric(it->ai_addr);
  }
  freeaddrinfo(found);
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

std::string from_interface(const std::string& name, const std::string& where) {
  std::string address = interface_address(name);
  if (address.empty()) {
    throw std::invalid_argument(fmt::format(
        "PIPE agent: {} names interface \"{}\", which does not exist or has no address",
        where, name));
  }
  return address;
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

std::string resolve_listen_address(const std::string& option) {
  if (!option.empty()) {
    if (is_numeric_address(option)) return option;
    return from_interface(option, "listen_address");
  }
  for (const char* variable : {"SWITCHBOARD_PIPE_SOCKET_IFNAME", "TP_SOCKET_IFNAME"}) {
    const char* value = std::getenv(variable);
    if (value != nullptr && *value != '\0') return from_interface(value, variable);
  }
  if (std::string address = host_name_address(); !address.empty()) return address;
  if (std::string address = first_interface_address(); !address.empty()) return address;
  return "127.0.0.1";
}

}  // namespace switchboard::agents
