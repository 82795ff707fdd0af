// Which address the PIPE agent listens on (and advertises to its peers).
//
// resolve_listen_address(option), first rule that applies:
//   1. `option` non-empty: an IPv4/IPv6 address is used as is; anything
//      else is an interface name whose first IPv4 address (else IPv6) is
//      used (std::invalid_argument naming it when it has none or does not
//      exist);
//   2. the SWITCHBOARD_PIPE_SOCKET_IFNAME environment variable, then
//      TP_SOCKET_IFNAME (TensorPipe's name): an interface name, as in 1;
//   3. this host's name, when it resolves to an address that is not
//      loopback (so a multi-host group never advertises 127.0.1.1, which
//      Debian maps the host name to);
//   4. the first interface that is up, not loopback, with an IPv4 address;
//   5. 127.0.0.1 (a single-host group still works).
// The result is a numeric address. Thread safety: reads the environment.
#pragma once

#include <string>

namespace switchboard::agents {

std::string resolve_listen_address(const std::string& option);

// The IPv4 (else IPv6) address of interface `name`; empty when it has none.
std::string interface_address(const std::string& name);

}  // namespace switchboard::agents
