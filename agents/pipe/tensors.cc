// The PIPE agent's tensors on their way (agents/pipe/agent_impl.h): which
// channel each takes to a peer, staging on the CPU, and placing received
// tensors on their devices. Split from agent.cc, which wires the rest.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "agents/pipe/agent_impl.h"
#include "agents/pipe/channel/cuda_staged/staging.h"
#include "common/check.h"
#include "common/host_key.h"
#include "core/device_ipc.h"

namespace switchboard::agents::pipe {

using rpc::Message;

namespace {

// Replaces tensor `i` of `m`, when on a CUDA device, with a CPU tensor in a
// pinned buffer of `buffers` (copies run at the bus's speed), which is what
// travels (the frame's descriptors name the device the receiver puts it
// on), and when a non-contiguous CPU tensor, with a contiguous copy. A
// large CUDA tensor is copied chunk by chunk as the connection sends it:
// the source that does so is returned (null when the bytes are all there).
// A tensor that cannot be copied (no CUDA runtime linked, not contiguous)
// throws std::invalid_argument naming the target worker `to`.
std::shared_ptr<wire::ChunkedSource> stage_on_cpu(Message& m, size_t i,
                                                  const std::string& to,
                                                  HostBufferCache& buffers) {
  Tensor& t = m.tensors[i];
  if (t.device().is_cpu()) {
    if (!t.is_contiguous()) t = t.clone();  // contiguous is what travels
    return nullptr;
  }
  try {
    SB_REQUIRE(t.is_contiguous(), "{} is not contiguous", t.describe());
    SB_REQUIRE(has_device_copier(),
               "no device copier is registered (link //core:cuda_allocator)");
    Tensor staged = buffers.empty(t.shape(), t.dtype(), /*pinned=*/true);
    std::shared_ptr<wire::ChunkedSource> source;
    if (t.nbytes() >= channel::DeviceStager::kMinBytes) {
      source = std::make_shared<channel::DeviceStager>(t, staged);
    } else {
      copy_bytes(staged, t);
    }
    t = std::move(staged);
    return source;
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(
        fmt::format("rpc to \"{}\": tensor {} cannot be staged: {}", to, i, e.what()));
  }
}

}  // namespace

// A self-send's message with its own copies of the tensors, each on
// devices[i] (the device map's target) or, when `devices` is empty, on the
// CPU.
Message copy_tensors(Message m, const std::vector<Device>& devices) {
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    m.tensors[i] = m.tensors[i].to(devices.empty() ? Device::cpu() : devices[i]);
  }
  return m;
}

// What this worker's channels can do, and its cuda_ipc channel when it has
// one (a DeviceIpc registered, CUDA devices, the option on).
ChannelDescriptor describe_channels(const std::string& name, const PipeAgentOptions& options,
                                    int device_count,
                                    std::unique_ptr<channel::CudaIpcChannel>* cuda_ipc) {
  ChannelDescriptor mine;
  mine.host_key = host_key();
  mine.pid = ::getpid();
  const char* variable = std::getenv("SWITCHBOARD_PIPE_CUDA_IPC");
  const bool allowed =
      options.cuda_ipc.value_or(variable == nullptr || std::string_view(variable) != "0");
  std::shared_ptr<DeviceIpc> ipc = device_ipc();
  if (!allowed || ipc == nullptr || device_count == 0) return mine;
  *cuda_ipc = std::make_unique<channel::CudaIpcChannel>(name, ipc,
                                                        channel::CudaIpcChannel::Options{});
  mine.cuda_ipc = true;
  mine.cuda_ipc_own_process = ipc->opens_own_process();
  for (int d = 0; d < device_count; ++d) mine.device_uuids.push_back(ipc->device_uuid(d));
  return mine;
}

// A response whose tensors go to CUDA devices is placed there on the pool
// (the copies must not hold up this connection's reads); any other
// completes here.
void PipeAgent::Impl::complete(wire::InboundFrame response,
                               std::shared_ptr<transport::Connection> connection) {
  const bool placed = std::any_of(response.devices.begin(), response.devices.end(),
                                  [](const Device& d) { return !d.is_cpu(); });
  if (!placed) {
    complete_now(std::move(response.message));
    return;
  }
  // Destroyed with `place`, run or not: what it still holds goes back.
  auto unfetched = std::make_shared<Unfetched>(weak_from_this(), std::move(connection),
                                               std::move(response.channel_tensors));
  auto place = [self = shared_from_this(), response = std::move(response),
                unfetched = std::move(unfetched)]() mutable {
    const uint64_t id = response.message.id;
    const std::optional<int> from = self->calls.destination(id);
    if (!from) return;  // timed out or cancelled
    try {
      self->receive_tensors(response.message, response.devices, *unfetched, *from);
    } catch (...) {
      self->calls.fail(id, std::current_exception());
      return;
    }
    self->complete_now(std::move(response.message));
  };
  try {
    owner.pool()->post(std::move(place));
  } catch (const std::exception& e) {  // the pool is shutting down
    spdlog::debug("rpc agent \"{}\": response dropped: {}", name, e.what());
  }
}

PipeAgent::Impl::Unfetched::~Unfetched() {
  if (tensors.empty() || connection == nullptr) return;
  if (std::shared_ptr<Impl> self = impl.lock(); self && self->cuda_ipc) {
    for (const auto& t : tensors) self->cuda_ipc->release(*connection, t);
  }
}

void PipeAgent::Impl::receive_tensors(Message& m, const std::vector<Device>& devices,
                                      Unfetched& unfetched, int from) const {
  std::exception_ptr failure;
  std::vector<wire::InboundFrame::ChannelTensor> tensors;
  tensors.swap(unfetched.tensors);  // each is fetched or released below
  for (const auto& t : tensors) {
    // Every outbox goes back to the sender, also after a failure.
    try {
      if (!failure) {
        m.tensors[t.index] = cuda_ipc->fetch(*unfetched.connection, t, devices[t.index]);
      } else {
        cuda_ipc->release(*unfetched.connection, t);
      }
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
  place_tensors(m, devices, from);
}

// Moves each tensor of `m` (received on the CPU) to the device its
// descriptor named. Throws std::invalid_argument naming the sender, the
// tensor and the device when this worker cannot hold it there.
void PipeAgent::Impl::place_tensors(Message& m, const std::vector<Device>& wire,
                                    int from) const {
  int count = -1;
  for (size_t i = 0; i < wire.size() && i < m.tensors.size(); ++i) {
    if (wire[i].is_cpu() || m.tensors[i].device() == wire[i]) continue;  // there already
    if (count < 0) count = device_count;
    SB_REQUIRE(
        wire[i].index < count,
        "rpc agent \"{}\": tensor {} from \"{}\" is for {}, but this worker has {} "
        "CUDA device(s){}",
        name, i, peers.name_of(from), wire[i].str(), count,
        count == 0 ? " (a build without //core:cuda_allocator, or no GPU)" : "");
    if (channel::DeviceLanding* landing = channel::DeviceLanding::of(m.tensors[i])) {
      m.tensors[i] = landing->finish();  // most of it is there already
    } else {
      m.tensors[i] = m.tensors[i].to(wire[i]);
    }
  }
}

std::vector<wire::TensorRoute> PipeAgent::Impl::route_tensors(
    Message& m, const std::vector<Device>& wire, int to,
    transport::Connection& connection) {
  std::vector<wire::TensorRoute> routes;
  const std::string& peer_name = peers.name_of(to);
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const Tensor& t = m.tensors[i];
    if (t.device().is_cuda() && !wire.empty()) {
      const channel::Choice choice =
          channel::choose(channels, peers.info(to).announcement.channels, t.device(), wire[i],
                          t.is_contiguous() ? t.nbytes() : 0);
      log_choice(to, t.device(), wire[i], choice);
      if (choice.channel == wire::TensorChannel::kCudaIpc) {
        if (std::optional<wire::TensorRoute> route = cuda_ipc->send(connection, t)) {
          routes.resize(m.tensors.size());
          routes[i] = *route;
          continue;
        }
      }
    }
    if (std::shared_ptr<wire::ChunkedSource> source =
            stage_on_cpu(m, i, peer_name, *buffers)) {
      routes.resize(m.tensors.size());
      routes[i].source = std::move(source);
    }
  }
  return routes;
}

void PipeAgent::Impl::log_choice(int to, Device src, Device dst, const channel::Choice& choice) {
  const std::string key = fmt::format("{} {} {} {}", to, src.str(), dst.str(), choice.name);
  {
    MutexLock lock(choices_mu);
    if (!logged_choices.insert(key).second) return;
  }
  spdlog::info("rpc agent \"{}\": tensors from {} to {} of \"{}\" go by {} ({})", name,
               src.str(), dst.str(), peers.name_of(to), choice.name, choice.why);
}

std::vector<Device> PipeAgent::Impl::wire_devices(const Message& m, int to,
                                                  bool reply) const {
  std::vector<Device> wire;
  bool any_cuda = false;
  for (const Tensor& t : m.tensors) any_cuda = any_cuda || t.device().is_cuda();
  if (!any_cuda) return wire;
  // A dynamic group's reverse maps change as workers join: a copy.
  const rpc::DeviceMaps reverse = reply ? peers.reverse_maps() : rpc::DeviceMaps();
  const rpc::DeviceMaps& maps = reply ? reverse : options.device_maps;
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    wire.push_back(rpc::target_device(maps, peers.name_of(to), m.tensors[i].device(), i));
  }
  return wire;
}

}  // namespace switchboard::agents::pipe
