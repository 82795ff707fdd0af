#include "agents/pipe/channel/cuda_ipc/cuda_ipc.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <bit>
#include <cstring>

#include "common/error.h"
#include "core/little_endian.h"

namespace switchboard::agents::pipe::channel {

namespace {

constexpr size_t kExportSize = 1 + 8 + 1 + 1 + 2 + 4 + 8 + 64 + 64;
constexpr size_t kIdSize = 1 + 8;
constexpr size_t kMinOutboxBytes = size_t{1} << 20;

[[noreturn]] void protocol_error(const std::string& what) {
  throw ProtocolError("cuda_ipc channel: " + what);
}

}  // namespace

CudaIpcChannel::CudaIpcChannel(std::string agent_name, std::shared_ptr<DeviceIpc> ipc,
                               Options options)
    : agent_name_(std::move(agent_name)), ipc_(std::move(ipc)), options_(options) {}

std::vector<uint8_t> CudaIpcChannel::encode(Op op, uint64_t id) {
  std::vector<uint8_t> out(kIdSize);
  out[0] = op;
  store_le<uint64_t>(out.data() + 1, id);
  return out;
}

bool CudaIpcChannel::carries(const Ends& ends) const {
  const ChannelDescriptor& mine = ends.mine;
  const ChannelDescriptor& peer = ends.peer;
  return ends.src.is_cuda() && ends.dst.is_cuda() && mine.cuda_ipc && peer.cuda_ipc &&
         mine.host_key == peer.host_key &&
         (mine.pid != peer.pid ||
          (mine.cuda_ipc_own_process && peer.cuda_ipc_own_process)) &&
         ends.nbytes >= kCudaIpcMinBytes;
}

std::string CudaIpcChannel::reason(const Ends& ends) const {
  const ChannelDescriptor& mine = ends.mine;
  const ChannelDescriptor& peer = ends.peer;
  if (!ends.src.is_cuda() || !ends.dst.is_cuda()) return "one end is the CPU";
  if (!mine.cuda_ipc) return "this worker cannot share CUDA memory (no CUDA IPC)";
  if (!peer.cuda_ipc) return "the peer cannot share CUDA memory (no CUDA IPC)";
  if (mine.host_key != peer.host_key) {
    return "the peer runs on another host (or in other namespaces)";
  }
  if (mine.pid == peer.pid && !(mine.cuda_ipc_own_process && peer.cuda_ipc_own_process)) {
    return "the peer is this very process (CUDA IPC cannot open its own memory)";
  }
  if (ends.nbytes < kCudaIpcMinBytes) {
    return fmt::format("{} bytes, under the {} bytes worth an outbox", ends.nbytes,
                       kCudaIpcMinBytes);
  }
  return "same host, both share CUDA memory";
}

std::optional<wire::TensorRoute> CudaIpcChannel::send(transport::Connection& connection,
                                                      Tensor& t, Device dst) {
  (void)dst;
  const size_t n = t.nbytes();
  const Device device = t.device();
  if (n > options_.max_outbox_bytes) return std::nullopt;
  std::shared_ptr<DeviceIpc::Outbox> box;
  uint64_t id = 0;
  std::optional<uint64_t> dropped;
  {
    MutexLock lock(mu_);
    PerConnection& pc = connections_[connection.serial];
    size_t on_device = 0;
    std::optional<uint64_t> too_small;
    for (auto& [oid, o] : pc.outboxes) {
      if (o.box == nullptr || o.box->device != device) {
        if (o.box == nullptr && o.busy)
          ++on_device;  // being made (device unknown: count it)
        continue;
      }
      ++on_device;
      if (o.busy) continue;
      if (o.box->capacity >= n) {
        o.busy = true;
        box = o.box;
        id = oid;
        break;
      }
      too_small = oid;
    }
    if (box == nullptr) {
      if (on_device >= options_.max_outboxes) {
        if (!too_small) return std::nullopt;  // every outbox in flight: staged
        dropped = too_small;
        pc.outboxes.erase(*too_small);
      }
      id = next_id_++;
      pc.outboxes[id] = Outbox{id, nullptr, true};  // reserved while it is made
    }
  }
  // Dropped here, whatever comes of the new one: the receiver unmaps it.
  if (dropped) send_message(connection, encode(kDrop, *dropped));
  try {
    if (box == nullptr) {
      const size_t capacity = std::min(options_.max_outbox_bytes,
                                       std::bit_ceil(std::max(n, kMinOutboxBytes)));
      std::shared_ptr<DeviceIpc::Outbox> made = ipc_->make_outbox(device, capacity);
      {
        MutexLock lock(mu_);
        auto pc = connections_.find(connection.serial);
        if (pc == connections_.end() || !pc->second.outboxes.contains(id)) {
          throw ConnectionError(fmt::format(
              "rpc agent \"{}\": the connection closed while an outbox was made",
              agent_name_));
        }
        pc->second.outboxes[id].box = made;
      }
      box = std::move(made);
      std::vector<uint8_t> out(kExportSize, 0);
      out[0] = kExport;
      store_le<uint64_t>(out.data() + 1, id);
      out[9] = 1;  // cuda
      store_le<int16_t>(out.data() + 11, static_cast<int16_t>(device.index));
      store_le<uint64_t>(out.data() + 17, box->capacity);
      std::memcpy(out.data() + 25, box->memory.data(), 64);
      std::memcpy(out.data() + 89, box->event.data(), 64);
      send_message(connection, out);
    }
    ipc_->fill(*box, t);
  } catch (...) {
    MutexLock lock(mu_);
    auto pc = connections_.find(connection.serial);
    if (pc != connections_.end()) {
      auto o = pc->second.outboxes.find(id);
      if (o != pc->second.outboxes.end()) {
        if (o->second.box == nullptr) {
          pc->second.outboxes.erase(o);  // never made, never exported
        } else {
          o->second.busy = false;
        }
      }
    }
    throw;
  }
  return wire::TensorRoute{wire::TensorChannel::kCudaIpc, id};
}

void CudaIpcChannel::on_message(const transport::Connection& connection,
                                std::span<const uint8_t> payload) {
  if (payload.empty()) protocol_error("an empty message");
  const uint8_t op = payload[0];
  const size_t expected = op == kExport ? kExportSize : kIdSize;
  if (op < kExport || op > kDrop) {
    protocol_error(fmt::format("op {} is not an op (1 export, 2 release, 3 drop)", op));
  }
  if (payload.size() != expected) {
    protocol_error(
        fmt::format("op {} of {} bytes (expected {})", op, payload.size(), expected));
  }
  const uint64_t id = load_le<uint64_t>(payload.data() + 1);
  MutexLock lock(mu_);
  PerConnection& pc = connections_[connection.serial];
  switch (op) {
    case kExport: {
      const uint8_t type = payload[9];
      const auto index = load_le<int16_t>(payload.data() + 11);
      const uint64_t capacity = load_le<uint64_t>(payload.data() + 17);
      if (type != 1 || payload[10] != 0 || index < 0 ||
          load_le<uint32_t>(payload.data() + 13) != 0) {
        protocol_error(fmt::format(
            "outbox {}: device type {} index {} is not a CUDA device", id, type, index));
      }
      if (capacity == 0) protocol_error(fmt::format("outbox {} of 0 bytes", id));
      if (pc.inboxes.contains(id))
        protocol_error(fmt::format("outbox {} exported twice", id));
      Inbox& in = pc.inboxes[id];
      in.device = Device::cuda(index);
      in.capacity = capacity;
      std::memcpy(in.memory.data(), payload.data() + 25, 64);
      std::memcpy(in.event.data(), payload.data() + 89, 64);
      return;
    }
    case kRelease: {
      auto o = pc.outboxes.find(id);
      if (o == pc.outboxes.end() || !o->second.busy || o->second.box == nullptr) {
        protocol_error(fmt::format("a release of outbox {}, which is not in flight", id));
      }
      o->second.busy = false;
      return;
    }
    case kDrop:
      if (pc.inboxes.erase(id) == 0) {
        protocol_error(fmt::format("a drop of outbox {}, which was never exported", id));
      }
      return;
  }
}

void CudaIpcChannel::check(const transport::Connection& connection,
                           const wire::InboundFrame& frame,
                           const wire::InboundFrame::ChannelTensor& t) const {
  const uint64_t id = t.route.buffer;
  uint64_t capacity = 0;
  {
    MutexLock lock(mu_);
    auto pc = connections_.find(connection.serial);
    const Inbox* in = nullptr;
    if (pc != connections_.end()) {
      auto it = pc->second.inboxes.find(id);
      if (it != pc->second.inboxes.end()) in = &it->second;
    }
    if (in == nullptr) {
      protocol_error(
          fmt::format("frame {} tensor {} names outbox {}, which the peer never "
                      "exported",
                      frame.message.id, t.index, id));
    }
    capacity = in->capacity;
  }
  const uint64_t nbytes =
      static_cast<uint64_t>(Tensor::numel_of(t.shape)) * dtype_size(t.dtype);
  if (nbytes > capacity) {
    protocol_error(fmt::format("frame {} tensor {}: {} bytes from outbox {} of {} bytes",
                               frame.message.id, t.index, nbytes, id, capacity));
  }
  if (!frame.devices[t.index].is_cuda()) {
    protocol_error(fmt::format("frame {} tensor {}: CUDA IPC to {}", frame.message.id,
                               t.index, frame.devices[t.index].str()));
  }
}

Tensor CudaIpcChannel::receive(transport::Connection& connection, Arrival arrival) {
  const wire::InboundFrame::ChannelTensor& tensor = arrival.routed;
  const Device device = arrival.device;
  const uint64_t id = tensor.route.buffer;
  // The sender may refill the outbox once this returns, whatever happened.
  struct Release {
    const CudaIpcChannel& channel;
    transport::Connection& connection;
    uint64_t id;
    ~Release() { channel.send_message(connection, encode(kRelease, id)); }
  } release{*this, connection, id};
  std::shared_ptr<DeviceIpc::Inbox> mapped;
  Inbox wanted;
  {
    MutexLock lock(mu_);
    auto pc = connections_.find(connection.serial);
    if (pc == connections_.end() || !pc->second.inboxes.contains(id)) {
      throw ConnectionError(
          fmt::format("rpc agent \"{}\": the connection closed before tensor {} arrived "
                      "from outbox {}",
                      agent_name_, tensor.index, id));
    }
    const Inbox& in = pc->second.inboxes.at(id);
    mapped = in.mapped;
    wanted = in;
  }
  if (mapped == nullptr) {
    mapped = ipc_->open(wanted.memory, wanted.event, wanted.capacity, device);
    MutexLock lock(mu_);
    auto pc = connections_.find(connection.serial);
    if (pc != connections_.end()) {
      auto it = pc->second.inboxes.find(id);
      if (it != pc->second.inboxes.end() && it->second.mapped == nullptr)
        it->second.mapped = mapped;
    }
  }
  Tensor dst = Tensor::empty(tensor.shape, tensor.dtype, device);
  ipc_->drain(*mapped, dst);
  return dst;
}

void CudaIpcChannel::release(transport::Connection& connection,
                             const wire::InboundFrame::ChannelTensor& tensor) {
  send_message(connection, encode(kRelease, tensor.route.buffer));
}

void CudaIpcChannel::forget(const transport::Connection& connection) {
  PerConnection gone;
  {
    MutexLock lock(mu_);
    auto it = connections_.find(connection.serial);
    if (it == connections_.end()) return;
    gone = std::move(it->second);
    connections_.erase(it);
  }
  // Freed and unmapped here, outside the lock.
}

size_t CudaIpcChannel::outbox_count() const {
  MutexLock lock(mu_);
  size_t n = 0;
  for (const auto& [serial, pc] : connections_) n += pc.outboxes.size();
  return n;
}

size_t CudaIpcChannel::inbox_count() const {
  MutexLock lock(mu_);
  size_t n = 0;
  for (const auto& [serial, pc] : connections_) {
    for (const auto& [id, in] : pc.inboxes) n += in.mapped != nullptr;
  }
  return n;
}

}  // namespace switchboard::agents::pipe::channel
