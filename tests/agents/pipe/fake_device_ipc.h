// A stand-in DeviceIpc (core/device_ipc.h) for tests on machines without a
// GPU: "device memory" is host memory, a handle names an outbox in a
// process-wide registry, and events are implicit (copies are synchronous).
// It counts what the channel does with it, and refuses what CUDA refuses:
// a handle that names no live outbox, a device that does not exist, a copy
// larger than the memory.
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"
#include "core/device_ipc.h"
#include "core/tensor.h"

namespace sbtest {

class FakeDeviceIpc final : public switchboard::DeviceIpc {
 public:
  explicit FakeDeviceIpc(int devices) : devices_(devices) {}

  std::atomic<int> outboxes_made{0}, outboxes_alive{0}, fills{0}, opens{0},
      inboxes_alive{0}, drains{0};
  // Makes make_outbox() fail as cudaMalloc does when the device is full.
  std::atomic<bool> out_of_memory{false};

  std::string device_uuid(int device) override {
    return fmt::format("GPU-fake-{}", device);
  }
  bool opens_own_process() const override { return true; }

  std::unique_ptr<Outbox> make_outbox(switchboard::Device device,
                                      size_t capacity) override {
    if (out_of_memory) {
      throw switchboard::Error(
          switchboard::ErrorCode::kResourceExhausted,
          fmt::format("fake cudaMalloc of {} bytes on {}: out of memory", capacity,
                      device.str()));
    }
    if (!device.is_cuda() || device.index >= devices_) {
      throw switchboard::Error(
          switchboard::ErrorCode::kFailedPrecondition,
          fmt::format("fake cudaMalloc on {}: no such device", device.str()));
    }
    auto box = std::make_unique<FakeOutbox>(*this);
    box->device = device;
    box->capacity = capacity;
    box->bytes = std::make_shared<std::vector<uint8_t>>(capacity);
    std::lock_guard<std::mutex> lock(mu_);
    box->id = ++last_id_;
    registry_[box->id] = box->bytes;
    std::memcpy(box->memory.data(), "FAKEIPC", 7);
    std::memcpy(box->memory.data() + 8, &box->id, sizeof box->id);
    box->event = box->memory;
    ++outboxes_made;
    return box;
  }

  void fill(Outbox& outbox, const switchboard::Tensor& src) override {
    auto& box = static_cast<FakeOutbox&>(outbox);
    if (src.device() != box.device || src.nbytes() > box.capacity) {
      throw std::invalid_argument(
          fmt::format("fake fill: {} into an outbox of {} bytes on {}", src.describe(),
                      box.capacity, box.device.str()));
    }
    std::memcpy(box.bytes->data(), src.data(), src.nbytes());
    ++fills;
  }

  std::unique_ptr<Inbox> open(const switchboard::IpcHandle& memory,
                              const switchboard::IpcHandle&, size_t capacity,
                              switchboard::Device device) override {
    uint64_t id = 0;
    std::memcpy(&id, memory.data() + 8, sizeof id);
    std::shared_ptr<std::vector<uint8_t>> bytes;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = registry_.find(id);
      if (std::memcmp(memory.data(), "FAKEIPC", 7) == 0 && it != registry_.end()) {
        bytes = it->second.lock();
      }
    }
    if (bytes == nullptr || bytes->size() < capacity || device.index >= devices_) {
      throw switchboard::Error(switchboard::ErrorCode::kFailedPrecondition,
                               "fake cudaIpcOpenMemHandle: invalid handle");
    }
    auto inbox = std::make_unique<FakeInbox>(*this);
    inbox->capacity = capacity;
    inbox->bytes = std::move(bytes);
    ++opens;
    return inbox;
  }

  void drain(Inbox& inbox, const switchboard::Tensor& dst) override {
    auto& in = static_cast<FakeInbox&>(inbox);
    if (dst.nbytes() > in.capacity || !dst.device().is_cuda()) {
      throw std::invalid_argument("fake drain: does not fit");
    }
    std::memcpy(dst.data(), in.bytes->data(), dst.nbytes());
    ++drains;
  }

 private:
  struct FakeOutbox final : Outbox {
    explicit FakeOutbox(FakeDeviceIpc& owner) : owner(owner) { ++owner.outboxes_alive; }
    ~FakeOutbox() override {
      std::lock_guard<std::mutex> lock(owner.mu_);
      owner.registry_.erase(id);
      --owner.outboxes_alive;
    }
    FakeDeviceIpc& owner;
    uint64_t id = 0;
    std::shared_ptr<std::vector<uint8_t>> bytes;
  };
  struct FakeInbox final : Inbox {
    explicit FakeInbox(FakeDeviceIpc& owner) : owner(owner) { ++owner.inboxes_alive; }
    ~FakeInbox() override { --owner.inboxes_alive; }
    FakeDeviceIpc& owner;
    std::shared_ptr<std::vector<uint8_t>> bytes;
  };

  const int devices_;
  std::mutex mu_;
  uint64_t last_id_ = 0;
  std::map<uint64_t, std::weak_ptr<std::vector<uint8_t>>> registry_;
};

}  // namespace sbtest
