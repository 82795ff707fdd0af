// The channel conformance suite: what every channel in the registry
// (agents/pipe/channel/registry.h) must do, run over each, between two
// workers of this process over connections that hand each other what the
// channels queue on them, with the CUDA runtime a stand-in (host memory
// tagged cuda:N, memcpy copies, a FakeDeviceIpc: two devices).
//
// For each channel, each (source, target) pair among the CPU and two CUDA
// devices that it carries, and tensors from 4 bytes to 10 MiB:
//   - a tensor sent, its bytes carried as a frame would (inline: into the
//     receiver's allocate()d tensor in pieces, told to the progress hook;
//     routed: checked, then received) arrives equal, on its target;
//   - a routed tensor released instead of received frees what it held at
//     the sender (sending again and again never declines);
//   - a closed connection leaves nothing behind at either end.
// And for each channel: hostile messages are protocol errors; a
// non-contiguous tensor travels as its contiguous copy or is refused with
// std::invalid_argument; it carries something.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agents/pipe/channel/channel.h"
#include "agents/pipe/channel/registry.h"
#include "agents/pipe/transport/connection.h"
#include "common/error.h"
#include "core/device_ipc.h"
#include "core/host_buffer_cache.h"
#include "core/tensor.h"
#include "tests/agents/pipe/channel/recording_connection.h"
#include "tests/agents/pipe/fake_device_ipc.h"

using namespace switchboard;
using namespace switchboard::agents::pipe;
using Catch::Contains;
using channel::Arrival;
using channel::Channel;
using channel::Channels;
using channel::Ends;

namespace {

// The stand-in CUDA runtime, for one test case.
struct FakeCuda {
  FakeCuda() {
    set_device_allocator([](size_t nbytes, Device) -> std::shared_ptr<void> {
      return std::shared_ptr<void>(std::malloc(std::max<size_t>(nbytes, 1)), std::free);
    });
    set_device_copier([](const Tensor& dst, const Tensor& src) {
      std::memcpy(dst.data(), src.data(), src.nbytes());
    });
    set_device_ipc(ipc);
  }
  ~FakeCuda() {
    set_device_ipc(nullptr);
    set_device_copier(nullptr);
    set_device_allocator(nullptr);
  }
  FakeCuda(const FakeCuda&) = delete;
  FakeCuda& operator=(const FakeCuda&) = delete;
  std::shared_ptr<sbtest::FakeDeviceIpc> ipc = std::make_shared<sbtest::FakeDeviceIpc>(2);
};

// One end of a connection.
class End final {
 public:
  // Hands the messages queued here to the other end's channels.
  void deliver(const Channels& to, const transport::Connection& arrives_on) {
    for (const auto& payload : connection.take_payloads())
      to.on_message(arrives_on, payload);
  }
  sbtest::RecordingConnection connection;
};

struct Worker {
  explicit Worker(const std::string& name) : channels(make(name)) {}
  static Channels make(const std::string& name) {
    channel::ChannelContext context;
    context.agent_name = name;
    context.device_count = 2;
    context.buffers = HostBufferCache::create();
    return channel::builtin_channels().make(context);
  }
  Channels channels;
};

struct Pair {
  Worker a{"w0"};
  Worker b{"w1"};
  End a_end;  // a's end of the connection
  End b_end;  // b's
};

// A contiguous tensor on `device` of `n` elements (int64 when `n` is odd,
// else float32 in two rows) whose bytes count up from `seed`.
Tensor pattern(int64_t n, Device device, uint8_t seed) {
  const bool odd = n % 2 != 0;
  const Tensor::Shape shape = odd ? Tensor::Shape{n} : Tensor::Shape{2, n / 2};
  Tensor t = Tensor::empty(shape, odd ? DType::kInt64 : DType::kFloat32, device);
  auto* p = static_cast<uint8_t*>(t.data());
  const size_t n_bytes = t.nbytes();
  // A 251-byte period (prime: no chunk boundary falls on it), doubled.
  for (size_t i = 0; i < std::min<size_t>(n_bytes, 251); ++i)
    p[i] = static_cast<uint8_t>(seed + i * 7);
  for (size_t have = 251; have < n_bytes; have *= 2)
    std::memcpy(p + have, p, std::min(have, n_bytes - have));
  return t;
}

size_t bytes_of(int64_t n) { return static_cast<size_t>(n) * (n % 2 != 0 ? 8 : 4); }

// Sends `t` from `sender` (a channel of pair.a) to pair.b's `dst`, carries
// it as a frame would, and returns what pair.b's channels receive (the
// route when asked). Releases instead of receiving when `release`.
Tensor carry(Pair& pair, Channel& sender, Tensor t, Device dst, bool release = false,
             std::optional<wire::TensorRoute>* route_out = nullptr) {
  std::optional<wire::TensorRoute> route = sender.send(pair.a_end.connection, t, dst);
  if (route_out) *route_out = route;
  if (!route) return Tensor();
  CHECK(route->channel == sender.tag());
  pair.a_end.deliver(pair.b.channels, pair.b_end.connection);
  wire::InboundFrame frame;
  frame.message.id = 1;
  frame.devices = {dst};
  Arrival arrival;
  arrival.device = dst;
  if (route->channel == wire::TensorChannel::kInline) {
    REQUIRE(t.device().is_cpu());
    REQUIRE(t.is_contiguous());
    const uint8_t* bytes = static_cast<const uint8_t*>(t.data());
    if (route->source) {
      REQUIRE(route->source->size() == t.nbytes());
      while (route->source->ready() < route->source->size()) route->source->advance();
      bytes = route->source->data();
    }
    Tensor into = pair.b.channels.allocator()(t.dtype(), t.shape(), dst);
    REQUIRE(into.device().is_cpu());
    REQUIRE(into.is_contiguous());
    REQUIRE(into.dtype() == t.dtype());
    REQUIRE(into.shape() == t.shape());
    // In two pieces, the second not on any chunk's boundary.
    const size_t n = t.nbytes();
    const size_t first = n / 3;
    const auto progress = pair.b.channels.progress();
    std::memcpy(into.data(), bytes, first);
    if (progress) progress(into, first);
    std::memcpy(static_cast<uint8_t*>(into.data()) + first, bytes + first, n - first);
    if (progress) progress(into, n);
    arrival.bytes = std::move(into);
  } else {
    frame.message.tensors.emplace_back();
    frame.channel_tensors.push_back({0, t.dtype(), t.shape(), *route});
    pair.b.channels.check(pair.b_end.connection, frame);
    if (release) {
      pair.b.channels.release(pair.b_end.connection, frame.channel_tensors[0]);
      pair.b_end.deliver(pair.a.channels, pair.a_end.connection);
      return Tensor();
    }
    arrival.routed = frame.channel_tensors[0];
  }
  Tensor got = pair.b.channels.receive(pair.b_end.connection, std::move(arrival));
  pair.b_end.deliver(pair.a.channels, pair.a_end.connection);
  return got;
}

// The name of every registered channel; each must be available to a
// worker with the stand-in runtime (else the suite would skip it).
std::vector<std::string> registered() {
  Worker w("names");
  std::vector<std::string> out;
  for (const auto& c : w.channels.all()) out.push_back(c->name());
  REQUIRE(out.size() == channel::builtin_channels().entries().size());
  return out;
}

const Device kDevices[] = {Device::cpu(), Device::cuda(0), Device::cuda(1)};
// 4 bytes; 12 KB (padded landing); 1.2 MB (enough for an outbox); 10 MiB
// (staged and landed chunk by chunk).
const int64_t kSizes[] = {1, 3000, 300'001, 2'621'440};

}  // namespace

TEST_CASE("every registered channel carries each tensor it takes, equal, to its target",
          "[pipe][channel][conformance]") {
  FakeCuda cuda;
  for (const std::string& name : registered()) {
    DYNAMIC_SECTION(name) {
      Pair pair;
      Channel* sender = pair.a.channels.find(name);
      REQUIRE(sender != nullptr);
      int carried = 0;
      for (Device src : kDevices) {
        for (Device dst : kDevices) {
          for (int64_t n : kSizes) {
            const Ends ends{pair.a.channels.descriptor(), pair.b.channels.descriptor(),
                            src, dst, bytes_of(n)};
            if (!sender->carries(ends)) continue;
            const Tensor t = pattern(n, src, static_cast<uint8_t>(n));
            REQUIRE(t.nbytes() == bytes_of(n));
            INFO(name << ": " << t.describe() << " to " << dst.str());
            CHECK_FALSE(sender->reason(ends).empty());
            const Tensor got = carry(pair, *sender, t, dst);
            REQUIRE(got.defined());
            CHECK(got.device() == dst);
            CHECK(got.dtype() == t.dtype());
            CHECK(got.shape() == t.shape());
            REQUIRE(got.is_contiguous());
            CHECK(std::memcmp(got.data(), t.data(), t.nbytes()) == 0);
            ++carried;
          }
        }
      }
      CHECK(carried > 0);  // a channel that carries nothing tests nothing
    }
  }
}

TEST_CASE(
    "every registered channel frees at the sender what a released tensor held, and "
    "nothing outlives a closed connection",
    "[pipe][channel][conformance]") {
  FakeCuda cuda;
  for (const std::string& name : registered()) {
    DYNAMIC_SECTION(name) {
      {
        Pair pair;
        Channel* sender = pair.a.channels.find(name);
        REQUIRE(sender != nullptr);
        for (Device src : kDevices) {
          for (Device dst : kDevices) {
            const Tensor t = pattern(300'001, src, 9);
            const Ends ends{pair.a.channels.descriptor(), pair.b.channels.descriptor(),
                            src, dst, t.nbytes()};
            if (!sender->carries(ends)) continue;
            INFO(name << ": " << t.describe() << " to " << dst.str());
            // More than any channel keeps in flight: each send must find
            // what the release before it gave back.
            for (int k = 0; k < 12; ++k) {
              std::optional<wire::TensorRoute> route;
              carry(pair, *sender, t, dst, /*release=*/true, &route);
              REQUIRE(route.has_value());
            }
            // One in flight when the connection closes.
            Tensor copy = t;
            REQUIRE(sender->send(pair.a_end.connection, copy, dst).has_value());
            pair.a_end.deliver(pair.b.channels, pair.b_end.connection);
          }
        }
        pair.a.channels.forget(pair.a_end.connection);
        pair.b.channels.forget(pair.b_end.connection);
        // The workers are still here; what the connection held is not.
        CHECK(cuda.ipc->outboxes_alive == 0);
        CHECK(cuda.ipc->inboxes_alive == 0);
      }
    }
  }
}

TEST_CASE(
    "every registered channel refuses hostile messages as protocol errors and sends a "
    "non-contiguous tensor as its contiguous copy or refuses it by name",
    "[pipe][channel][conformance]") {
  FakeCuda cuda;
  Pair pair;
  for (const auto& c : pair.a.channels.all()) {
    INFO(c->name());
    for (const std::vector<uint8_t>& message :
         {std::vector<uint8_t>{}, std::vector<uint8_t>{0xff},
          std::vector<uint8_t>(200, 0xee)}) {
      CHECK_THROWS_AS(c->on_message(pair.a_end.connection, message), ProtocolError);
    }
    for (Device src : kDevices) {
      for (Device dst : kDevices) {
        // Columns of a 3x4 int32 matrix: strides {1, 4}.
        const Tensor base = pattern(13, src, 1);  // 13 int64 = 26 int32 (12 used)
        const Tensor t = Tensor::from_blob(base.data(), {4, 3}, DType::kInt32, src,
                                           base.storage(), {1, 4});
        REQUIRE_FALSE(t.is_contiguous());
        const Ends ends{pair.a.channels.descriptor(), pair.b.channels.descriptor(), src,
                        dst, 0};
        if (!c->carries(ends)) continue;
        INFO(t.describe() << " to " << dst.str());
        Tensor sent = t;
        try {
          const std::optional<wire::TensorRoute> route =
              c->send(pair.a_end.connection, sent, dst);
          if (!route) continue;  // declined: the next channel's business
          REQUIRE(sent.is_contiguous());
          REQUIRE(sent.shape() == t.shape());
          if (src.is_cpu()) {
            const auto* from = static_cast<const int32_t*>(t.data());
            const auto* got = static_cast<const int32_t*>(sent.data());
            for (int r = 0; r < 4; ++r) {
              for (int k = 0; k < 3; ++k) CHECK(got[r * 3 + k] == from[r + k * 4]);
            }
          }
        } catch (const std::invalid_argument& e) {
          CHECK_THAT(e.what(), Contains("not contiguous"));
        }
      }
    }
  }
}
