// Which local address a worker listens on and advertises to its peers: one
// rule for every listener of a worker (PIPE, the Gloo group inside
// PROCESS_GROUP, named collective groups), so that one setting, or none,
// is right for all of them.
//
//   ListenAddress a = choose_listen_address({.component = "PIPE"});
//   // a.address: "198.18.0.2"; a.reason: "the address that routes to the
//   // store at 198.18.0.1 (MASTER_ADDR)"
//
// The first rule that applies:
//   1. `option` (what the program set, e.g. PipeAgentOptions::listen_address);
//   2. the SWITCHBOARD_IFNAME environment variable;
//   3. the component's older variables, `aliases`, in order (PIPE:
//      SWITCHBOARD_PIPE_SOCKET_IFNAME, TP_SOCKET_IFNAME; Gloo:
//      SWITCHBOARD_GLOO_SOCKET_IFNAME, GLOO_SOCKET_IFNAME,
//      SWITCHBOARD_GLOO_HOSTNAME);
//   4. the local address this host uses to reach the store (`store_host`,
//      else MASTER_ADDR): the address a worker reaches the store from is the
//      address its peers can reach it at. Loopback exactly when the store is
//      on loopback;
//   5. this host's name, when it resolves to an address that is not
//      loopback and that this process can bind;
//   6. the first interface that is up, not loopback, with an IPv4 address;
//   7. 127.0.0.1.
// In 1 to 3 a value is an IPv4/IPv6 address (used as is) or an interface
// name (its first IPv4 address, else IPv6); an alias marked `host_name`
// holds an address or a host name (resolved) instead.
//
// Errors: std::invalid_argument naming the option or variable and its value
// when it is neither an address nor an interface with an address (nor, for
// a host-name alias, a name that resolves).
// Thread safety: any thread; reads the environment. The choice is logged
// (info) once per process for each component and address.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace switchboard {

struct ListenAddressRequest {
  struct Alias {
    std::string variable;    // an environment variable's name
    bool host_name = false;  // holds a host name, not an interface name
  };
  std::string component;       // "PIPE", "Gloo": names it in errors and logs
  std::string option;          // rule 1; empty: not set
  std::vector<Alias> aliases;  // rule 3
  std::string store_host;      // rule 4; empty: MASTER_ADDR
};

struct ListenAddress {
  std::string address;  // numeric
  std::string reason;   // which rule chose it, for logs and errors
};

ListenAddress choose_listen_address(const ListenAddressRequest& request);

// The IPv4 (else IPv6) address of interface `name`; empty when it has none
// or does not exist.
std::string interface_address(const std::string& name);

// The local address the kernel would send from to reach `host` (a name or
// address); empty when `host` does not resolve or has no route. Sends
// nothing (a UDP socket that is connected, never written).
std::string route_source_address(const std::string& host);

// The ports a worker's listeners may take (firewalled clusters): `option`
// when non-empty, else the SWITCHBOARD_PORT_RANGE environment variable;
// "LO-HI" (1 <= LO <= HI <= 65535) or a single port "P". nullopt when
// neither is set (listeners take ports the kernel picks).
// Errors: std::invalid_argument naming the option or variable and its value.
struct PortRange {
  uint16_t lo = 0;
  uint16_t hi = 0;
  std::string source;  // "SWITCHBOARD_PORT_RANGE" or "the port_range option"
};
std::optional<PortRange> port_range(const std::string& option = "");

// Binds a listener to the first port of `range` that `try_bind(port)`
// accepts (it returns an empty string on success, else why not) and
// returns that port. Errors: std::runtime_error naming `who`, the range,
// where it came from and why the last ports failed ("... 30000: address
// already in use"), when every port failed.
uint16_t bind_in_range(const PortRange& range, const std::string& who,
                       const std::function<std::string(uint16_t port)>& try_bind);

// Whether `host` (a name or address) is an address of this host: one of
// the addresses it resolves to can be bound here. False when it does not
// resolve.
bool is_local_address(const std::string& host);

}  // namespace switchboard
