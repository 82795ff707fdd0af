// Devices and the device hooks (core/tensor.h): parsing and naming devices,
// the registered allocator, copier, device counter and host pinner (which
// //core:cuda_allocator installs), and copy_bytes() over them.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <utility>

#include "common/check.h"
#include "common/mutex.h"
#include "core/tensor.h"
#include "core/tensor_internal.h"

namespace switchboard {
namespace {

struct DeviceHooks {
  DeviceAllocator allocator;
  DeviceCopier copier;
  DeviceCounter counter;
};

struct AllocatorRegistry {
  Mutex mutex;
  // One guarded member, so that the analysis checks the accesses through
  // pointers to DeviceHooks' members below.
  DeviceHooks hooks SB_GUARDED_BY(mutex);
};

AllocatorRegistry& allocator_registry() {
  static AllocatorRegistry registry;
  return registry;
}

// Copies a registered hook out of the registry, so that user code never
// runs under its lock.
template <typename Hook>
Hook current(Hook DeviceHooks::*member) {
  auto& registry = allocator_registry();
  MutexLock lock(registry.mutex);
  return registry.hooks.*member;
}

template <typename Hook>
void install(Hook DeviceHooks::*member, Hook hook) {
  auto& registry = allocator_registry();
  Hook previous;  // destroyed outside the lock
  MutexLock lock(registry.mutex);
  previous = std::exchange(registry.hooks.*member, std::move(hook));
}

DeviceAllocator current_allocator() { return current(&DeviceHooks::allocator); }

}  // namespace

std::shared_ptr<Storage> tensor_internal::allocate_device(size_t nbytes, Device device) {
  DeviceAllocator allocator = current_allocator();
  SB_REQUIRE(allocator != nullptr,
             "Tensor::empty: no allocator for {} (link //core:cuda_allocator)",
             device.str());
  std::shared_ptr<void> owner = allocator(nbytes, device);
  SB_ASSERT(owner != nullptr || nbytes == 0,
            "the device allocator returned null for {} bytes on {}", nbytes,
            device.str());
  void* data = owner.get();
  return std::make_shared<Storage>(std::move(owner), data, nbytes, device);
}

DeviceCopier tensor_internal::registered_copier() {
  return current(&DeviceHooks::copier);
}

// ---------------------------------------------------------------------------
// Devices

Device Device::parse(std::string_view text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  constexpr std::string_view kPrefix = "cuda:";
  if (text.starts_with(kPrefix) && text.size() > kPrefix.size()) {
    std::string_view digits = text.substr(kPrefix.size());
    int index = -1;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (ec == std::errc() && end == digits.data() + digits.size() && index >= 0 &&
        digits[0] != '+') {
      return cuda(index);
    }
  }
  SB_REQUIRE(false, "Device::parse: expected \"cpu\", \"cuda\" or \"cuda:N\", got \"{}\"",
             text);
  return cpu();  // unreachable
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : fmt::format("cuda:{}", index);
}

void set_device_allocator(DeviceAllocator allocator) {
  install(&DeviceHooks::allocator, std::move(allocator));
}

bool has_device_allocator() { return current_allocator() != nullptr; }

void set_device_copier(DeviceCopier copier) {
  install(&DeviceHooks::copier, std::move(copier));
}

bool has_device_copier() { return current(&DeviceHooks::copier) != nullptr; }

void set_device_counter(DeviceCounter counter) {
  install(&DeviceHooks::counter, std::move(counter));
}

namespace {
struct PinnerRegistry {
  Mutex mutex;
  HostPinner pinner SB_GUARDED_BY(mutex);
};
PinnerRegistry& pinner_registry() {
  static PinnerRegistry registry;
  return registry;
}
}  // namespace

void set_host_pinner(HostPinner pinner) {
  PinnerRegistry& registry = pinner_registry();
  MutexLock lock(registry.mutex);
  registry.pinner = std::move(pinner);
}

HostPinner host_pinner() {
  PinnerRegistry& registry = pinner_registry();
  MutexLock lock(registry.mutex);
  return registry.pinner;
}

void copy_bytes(const Tensor& dst, const Tensor& src) {
  SB_REQUIRE(dst.defined() && src.defined() && dst.dtype() == src.dtype() &&
                 dst.numel() == src.numel() && dst.is_contiguous() && src.is_contiguous(),
             "copy_bytes: {} into {} (both contiguous, equal dtype and element count)",
             src.describe(), dst.describe());
  if (dst.device().is_cpu() && src.device().is_cpu()) {
    if (dst.nbytes() > 0) std::memmove(dst.data(), src.data(), dst.nbytes());
    return;
  }
  DeviceCopier copier = tensor_internal::registered_copier();
  SB_REQUIRE(copier != nullptr,
             "copy_bytes: cannot copy {} to {}: no device copier is registered (link "
             "//core:cuda_allocator)",
             src.describe(), dst.device().str());
  copier(dst, src);
}

int registered_cuda_device_count() {
  DeviceCounter counter = current(&DeviceHooks::counter);
  if (counter == nullptr) return 0;
  try {
    return std::max(0, counter());
  } catch (...) {
    return 0;
  }
}

}  // namespace switchboard
