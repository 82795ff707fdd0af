// Which address the PIPE agent listens on (and advertises to its peers):
// the rule every listener of a worker follows (common/listen_address.h),
// with PIPE's older variables as aliases.
//
// resolve_listen_address(option, store_host), first rule that applies:
//   1. `option` (PipeAgentOptions::listen_address) non-empty: an IPv4/IPv6
//      address is used as is; anything else is an interface name whose
//      first IPv4 address (else IPv6) is used;
//   2. SWITCHBOARD_IFNAME (an address or an interface name);
//   3. SWITCHBOARD_PIPE_SOCKET_IFNAME, then TP_SOCKET_IFNAME (TensorPipe's
//      name): older aliases of 2;
//   4. the local address that routes to the store (`store_host`, else
//      MASTER_ADDR): loopback exactly when the store is on loopback;
//   5. this host's name, when it resolves to a bindable address that is not
//      loopback (never 127.0.1.1, which Debian maps the host name to);
//   6. the first interface that is up, not loopback, with an IPv4 address;
//   7. 127.0.0.1 (a single-host group still works).
// The result is a numeric address. Errors: std::invalid_argument naming the
// option or variable and its value when it is neither an address nor an
// interface with an address. Thread safety: reads the environment.
#pragma once

#include <string>

namespace switchboard::agents::pipe {

std::string resolve_listen_address(const std::string& option,
                                   const std::string& store_host = "");

}  // namespace switchboard::agents::pipe
