#include "agents/pipe/address.h"

#include "common/listen_address.h"

namespace switchboard::agents::pipe {

std::string resolve_listen_address(const std::string& option, const std::string& store_host) {
  ListenAddressRequest request;
  request.component = "PIPE";
  request.option = option;
  request.aliases = {{"SWITCHBOARD_PIPE_SOCKET_IFNAME"}, {"TP_SOCKET_IFNAME"}};
  request.store_host = store_host;
  return choose_listen_address(request).address;
}

}  // namespace switchboard::agents::pipe
