#include "core/device_ipc.h"

#include <atomic>

namespace switchboard {

namespace {
std::shared_ptr<DeviceIpc>& registered() {
  static std::shared_ptr<DeviceIpc> ipc;
  return ipc;
}
}  // namespace

void set_device_ipc(std::shared_ptr<DeviceIpc> ipc) {
  std::atomic_store(&registered(), std::move(ipc));
}

std::shared_ptr<DeviceIpc> device_ipc() { return std::atomic_load(&registered()); }

}  // namespace switchboard
