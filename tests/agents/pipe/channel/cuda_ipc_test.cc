// The cuda_ipc channel (agents/pipe/channel/cuda_ipc/cuda_ipc.h) on its own, over a
// stand-in DeviceIpc (tests/agents/pipe/fake_device_ipc.h) and connections that
// record what the channel queues on them: the outbox protocol (export
// once, refill only after a release, decline when every outbox is in
// flight, grow by dropping a free one that is too small), what a hostile
// peer's messages and frames do (protocol errors naming the outbox), and
// that a closed connection frees and unmaps everything. The channel
// choice is in the same file (agents/pipe/channel/select.h).
#include "agents/pipe/channel/cuda_ipc/cuda_ipc.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "agents/pipe/channel/select.h"
#include "agents/pipe/channel/cuda_staged/staging.h"
#include "agents/pipe/transport/connection.h"
#include "common/error.h"
#include "core/little_endian.h"
#include "core/tensor.h"
#include "tests/agents/pipe/fake_device_ipc.h"

using namespace switchboard;
using namespace switchboard::agents;
using namespace switchboard::agents::pipe;
using namespace switchboard::agents::pipe::transport;
using Catch::Contains;
using channel::ChannelDescriptor;
using channel::CudaIpcChannel;

namespace {

// Records the kChannel frames queued on it.
class RecordingConnection final : public Connection {
 public:
  bool enqueue(const rpc::Message&, const std::vector<Device>&,
               const std::vector<pipe::wire::TensorRoute>&, bool) override {
    return true;
  }
  bool enqueue_control(pipe::wire::FrameKind kind, const uint8_t* payload, size_t size,
                       uint64_t) override {
    REQUIRE(kind == pipe::wire::FrameKind::kChannel);
    sent.emplace_back(payload, payload + size);
    return true;
  }
  void start_reading() override {}
  void replay(pipe::wire::InboundFrame) override {}
  void close_after_flush() override {}
  bool wait_closed(std::chrono::steady_clock::time_point) override { return true; }
  void close_now() override {}

  // Hands what was queued here to `to`, as the peer would receive it.
  void deliver(CudaIpcChannel& to, const Connection& arrives_on) {
    for (const auto& payload : sent) to.on_frame(arrives_on, payload);
    sent.clear();
  }
  std::vector<std::vector<uint8_t>> sent;
};

// A device "tensor" of the stand-in runtime: host memory tagged cuda:0.
Tensor device_tensor(int64_t n, float first) {
  Tensor t = Tensor::empty({n}, DType::kFloat32, Device::cuda(0));
  auto* p = static_cast<float*>(t.data());
  for (int64_t i = 0; i < n; ++i) p[i] = first + static_cast<float>(i);
  return t;
}

pipe::wire::InboundFrame frame_for(uint64_t outbox, int64_t n,
                                   Device target = Device::cuda(0)) {
  pipe::wire::InboundFrame f;
  f.message.id = 5;
  f.message.tensors.emplace_back();
  f.devices = {target};
  f.channel_tensors.push_back(
      {0, DType::kFloat32, {n}, {pipe::wire::TensorChannel::kCudaIpc, outbox}});
  return f;
}

std::vector<uint8_t> op(uint8_t code, uint64_t id) {
  std::vector<uint8_t> out(9);
  out[0] = code;
  store_le<uint64_t>(out.data() + 1, id);
  return out;
}

// Device memory for the stand-in: Tensor::empty on cuda:N is host memory.
const bool kAllocator = [] {
  set_device_allocator([](size_t nbytes, Device) -> std::shared_ptr<void> {
    return std::shared_ptr<void>(std::malloc(std::max<size_t>(nbytes, 1)), std::free);
  });
  return true;
}();

struct Link {
  std::shared_ptr<sbtest::FakeDeviceIpc> ipc = std::make_shared<sbtest::FakeDeviceIpc>(2);
  CudaIpcChannel sender{"w0", ipc, {.max_outboxes = 2, .max_outbox_bytes = 64 << 20}};
  CudaIpcChannel receiver{"w1", ipc, {}};
  RecordingConnection out;  // the sender's end
  RecordingConnection in;   // the receiver's end

  // Sends `t`, delivers the export (if any) and fetches it at the receiver;
  // the release goes back to the sender.
  Tensor round(const Tensor& t) {
    std::optional<pipe::wire::TensorRoute> route = sender.send(out, t);
    REQUIRE(route);
    out.deliver(receiver, in);
    pipe::wire::InboundFrame f = frame_for(route->buffer, t.numel());
    receiver.check(in, f);
    Tensor got = receiver.fetch(in, f.channel_tensors[0], Device::cuda(1));
    in.deliver(sender, out);
    return got;
  }
};

}  // namespace

TEST_CASE("an outbox is exported once, refilled only after its release, and mapped once",
          "[cuda_ipc]") {
  Link link;
  for (int k = 0; k < 3; ++k) {
    const Tensor got = link.round(device_tensor(1000, static_cast<float>(k)));
    CHECK(got.device() == Device::cuda(1));
    CHECK(static_cast<const float*>(got.data())[999] == static_cast<float>(k + 999));
  }
  CHECK(link.ipc->outboxes_made == 1);
  CHECK(link.ipc->opens == 1);
  CHECK(link.sender.outbox_count() == 1);
  CHECK(link.receiver.inbox_count() == 1);
}

TEST_CASE(
    "with every outbox in flight send declines, and a free one too small is dropped "
    "for a larger one",
    "[cuda_ipc]") {
  Link link;
  const auto a = link.sender.send(link.out, device_tensor(100, 0));
  const auto b = link.sender.send(link.out, device_tensor(100, 0));
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a->buffer != b->buffer);
  // Both in flight (max_outboxes 2): the caller stages this one.
  CHECK_FALSE(link.sender.send(link.out, device_tensor(100, 0)));
  link.out.deliver(link.receiver, link.in);
  link.sender.on_frame(link.out, op(2, a->buffer));  // a released
  // Larger than a's 1 MiB: a is dropped (the receiver is told), a new one made.
  const auto c = link.sender.send(link.out, device_tensor(1 << 19, 0));  // 2 MiB
  REQUIRE(c);
  CHECK(c->buffer != a->buffer);
  REQUIRE(link.out.sent.size() == 2);
  CHECK(link.out.sent[0] == op(3, a->buffer));
  CHECK(link.out.sent[1][0] == 1);  // the export of c
  link.out.deliver(link.receiver, link.in);
  // Above max_outbox_bytes: staged.
  CHECK_FALSE(link.sender.send(link.out, device_tensor(int64_t{17} << 20, 0)));
}

TEST_CASE(
    "an outbox dropped for a larger one is unmapped by the receiver even when the larger "
    "one cannot be made",
    "[cuda_ipc]") {
  Link link;
  const auto a = link.sender.send(link.out, device_tensor(100, 0));
  const auto b = link.sender.send(link.out, device_tensor(100, 0));
  REQUIRE(a);
  REQUIRE(b);
  link.out.deliver(link.receiver, link.in);
  link.receiver.check(link.in, frame_for(a->buffer, 100));  // a is known there
  link.sender.on_frame(link.out, op(2, a->buffer));         // and released
  link.ipc->out_of_memory = true;
  CHECK_THROWS_WITH(link.sender.send(link.out, device_tensor(1 << 19, 0)),
                    Contains("out of memory"));
  REQUIRE(link.out.sent.size() == 1);
  CHECK(link.out.sent[0] == op(3, a->buffer));
  link.out.deliver(link.receiver, link.in);
  CHECK_THROWS_WITH(link.receiver.check(link.in, frame_for(a->buffer, 100)),
                    Contains("never exported"));
  link.ipc->out_of_memory = false;
  CHECK(link.sender.send(link.out, device_tensor(1 << 19, 0)));  // room again
}

TEST_CASE(
    "a hostile peer's channel messages and routes are protocol errors naming the outbox",
    "[cuda_ipc]") {
  Link link;
  const auto a = link.sender.send(link.out, device_tensor(100, 0));
  REQUIRE(a);
  const std::vector<uint8_t> export_a = link.out.sent.at(0);
  link.out.deliver(link.receiver, link.in);
  SECTION("an outbox never exported") {
    CHECK_THROWS_WITH(link.receiver.check(link.in, frame_for(a->buffer + 7, 10)),
                      Contains("names outbox " + std::to_string(a->buffer + 7) +
                               ", which the peer never exported"));
  }
  SECTION("more bytes than the outbox holds") {
    CHECK_THROWS_WITH(link.receiver.check(link.in, frame_for(a->buffer, 1 << 20)),
                      Contains("4194304 bytes from outbox"));
  }
  SECTION("a CPU target") {
    CHECK_THROWS_WITH(
        link.receiver.check(link.in, frame_for(a->buffer, 10, Device::cpu())),
        Contains("CUDA IPC to cpu"));
  }
  SECTION("an export twice, a bad op, a bad length") {
    CHECK_THROWS_WITH(link.receiver.on_frame(link.in, export_a),
                      Contains("exported twice"));
    CHECK_THROWS_WITH(link.receiver.on_frame(link.in, op(9, 1)),
                      Contains("op 9 is not an op"));
    CHECK_THROWS_WITH(link.receiver.on_frame(link.in, {2, 0}),
                      Contains("op 2 of 2 bytes"));
    CHECK_THROWS_AS(link.receiver.on_frame(link.in, {}), ProtocolError);
  }
  SECTION("a release of an outbox not in flight") {
    link.sender.on_frame(link.out, op(2, a->buffer));
    CHECK_THROWS_WITH(link.sender.on_frame(link.out, op(2, a->buffer)),
                      Contains("a release of outbox " + std::to_string(a->buffer) +
                               ", which is not in flight"));
  }
  SECTION("handles that name nothing fail the fetch, which still releases the outbox") {
    std::vector<uint8_t> forged = export_a;
    forged[1] ^= 0x40;   // another outbox id, the same handles
    forged[30] ^= 0xff;  // and handles that name nothing
    const uint64_t forged_id = load_le<uint64_t>(forged.data() + 1);
    link.receiver.on_frame(link.in, forged);
    pipe::wire::InboundFrame f = frame_for(forged_id, 10);
    link.receiver.check(link.in, f);
    CHECK_THROWS_WITH(link.receiver.fetch(link.in, f.channel_tensors[0], Device::cuda(0)),
                      Contains("invalid handle"));
    CHECK(link.in.sent.back() == op(2, forged_id));
  }
}

TEST_CASE(
    "a closed connection frees its outboxes and unmaps its inboxes; a fetch after it "
    "fails with ConnectionError",
    "[cuda_ipc]") {
  Link link;
  link.round(device_tensor(1000, 0));
  const auto in_flight = link.sender.send(link.out, device_tensor(1000, 0));
  REQUIRE(in_flight);
  CHECK(link.ipc->outboxes_alive == 1);
  CHECK(link.ipc->inboxes_alive == 1);
  link.receiver.forget(link.in);
  CHECK(link.ipc->inboxes_alive == 0);
  pipe::wire::InboundFrame f = frame_for(in_flight->buffer, 1000);
  CHECK_THROWS_AS(link.receiver.fetch(link.in, f.channel_tensors[0], Device::cuda(0)),
                  ConnectionError);
  link.sender.forget(link.out);
  CHECK(link.ipc->outboxes_alive == 0);
  CHECK(link.sender.outbox_count() == 0);
}

TEST_CASE("the channel is chosen per device pair, with the reason",
          "[cuda_ipc][select]") {
  ChannelDescriptor mine{"host A", 10, true, false, {"GPU-0"}};
  ChannelDescriptor peer{"host A", 11, true, false, {"GPU-0"}};
  const size_t big = 1 << 20;
  using channel::choose;
  CHECK(std::string(choose(mine, peer, Device::cpu(), Device::cpu(), big).name) == "cpu");
  CHECK(std::string(choose(mine, peer, Device::cuda(0), Device::cuda(0), big).name) ==
        "cuda_ipc");
  CHECK(std::string(choose(mine, peer, Device::cuda(0), Device::cpu(), big).name) ==
        "cuda_staged");
  CHECK_THAT(choose(mine, peer, Device::cuda(0), Device::cuda(0), 100).why,
             Contains("under the 524288 bytes"));
  ChannelDescriptor far = peer;
  far.host_key = "host B";
  CHECK_THAT(choose(mine, far, Device::cuda(0), Device::cuda(0), big).why,
             Contains("another host"));
  ChannelDescriptor same = peer;
  same.pid = 10;
  CHECK_THAT(choose(mine, same, Device::cuda(0), Device::cuda(0), big).why,
             Contains("this very process"));
  ChannelDescriptor none = peer;
  none.cuda_ipc = false;
  CHECK_THAT(choose(mine, none, Device::cuda(0), Device::cuda(0), big).why,
             Contains("the peer cannot share CUDA memory"));
}

TEST_CASE(
    "a staged CUDA tensor is copied chunk by chunk, each copy making the next bytes "
    "ready",
    "[cuda_staged]") {
  int copies = 0;
  set_device_copier([&](const Tensor& dst, const Tensor& src) {
    ++copies;
    std::memcpy(dst.data(), src.data(), src.nbytes());
  });
  const Tensor device = device_tensor(int64_t{10} << 18, 3);  // 10 MiB of floats
  const Tensor host = Tensor::empty({int64_t{10} << 18}, DType::kFloat32);
  channel::DeviceStager stager(device, host, size_t{4} << 20);
  CHECK(stager.size() == size_t{10} << 20);
  CHECK(stager.ready() == 0);
  stager.advance();
  CHECK(stager.ready() == size_t{4} << 20);
  stager.advance();
  stager.advance();
  CHECK(stager.ready() == size_t{10} << 20);
  stager.advance();  // nothing left: no copy
  CHECK(copies == 3);
  CHECK(std::memcmp(stager.data(), device.data(), device.nbytes()) == 0);
  // A copy that fails reaches the writer (which then fails the connection).
  set_device_copier([](const Tensor&, const Tensor&) {
    throw Error(ErrorCode::kFailedPrecondition, "fake copy failed");
  });
  channel::DeviceStager failing(device, host);
  CHECK_THROWS_WITH(failing.advance(), Contains("fake copy failed"));
  CHECK(failing.ready() == 0);
  set_device_copier(nullptr);
}

TEST_CASE(
    "a small tensor bound for a CUDA device lands in a padded buffer copied whole in "
    "one copy of kMinCopyBytes",
    "[cuda_staged]") {
  std::vector<size_t> copied;
  set_device_copier([&](const Tensor& dst, const Tensor& src) {
    copied.push_back(src.nbytes());
    std::memcpy(dst.data(), src.data(), src.nbytes());
  });
  constexpr size_t kSpan = channel::DeviceLanding::kMinCopyBytes;
  const Tensor pattern = device_tensor(1000, 7);  // 4000 bytes of floats
  Tensor host = channel::DeviceLanding::receive_padded(
      Tensor::empty({static_cast<int64_t>(kSpan)}, DType::kUInt8), {10, 100},
      DType::kFloat32, Device::cuda(1));
  CHECK(host.device() == Device::cpu());
  CHECK(host.shape() == Tensor::Shape{10, 100});
  std::memcpy(host.data(), pattern.data(), pattern.nbytes());
  channel::DeviceLanding* landing = channel::DeviceLanding::of(host);
  REQUIRE(landing != nullptr);
  landing->arrived(pattern.nbytes());
  CHECK(copied.empty());  // nothing before the frame is complete
  const Tensor on_device = landing->finish();
  CHECK(copied == std::vector<size_t>{kSpan});
  CHECK(on_device.device() == Device::cuda(1));
  CHECK(on_device.dtype() == DType::kFloat32);
  CHECK(on_device.shape() == Tensor::Shape{10, 100});
  CHECK(on_device.storage()->nbytes() >= pattern.nbytes());
  CHECK(std::memcmp(on_device.data(), pattern.data(), pattern.nbytes()) == 0);
  CHECK_THROWS_WITH(channel::DeviceLanding::receive_padded(
                        Tensor::empty({16}, DType::kUInt8), {5}, DType::kFloat32,
                        Device::cuda(0)),
                    Contains("cannot hold"));
  set_device_copier(nullptr);
}

TEST_CASE(
    "a tensor bound for a CUDA device is copied there chunk by chunk as its bytes "
    "arrive, the rest when all did",
    "[cuda_staged]") {
  int copies = 0;
  set_device_copier([&](const Tensor& dst, const Tensor& src) {
    ++copies;
    std::memcpy(dst.data(), src.data(), src.nbytes());
  });
  const Tensor pattern =
      device_tensor(int64_t{10} << 18, 5);  // 10 MiB of floats, the bytes to arrive
  Tensor host = channel::DeviceLanding::receive_into(
      Tensor::empty({int64_t{10} << 18}, DType::kFloat32), Device::cuda(1),
      size_t{4} << 20);
  channel::DeviceLanding* landing = channel::DeviceLanding::of(host);
  REQUIRE(landing != nullptr);
  CHECK(channel::DeviceLanding::of(Tensor::empty({4}, DType::kFloat32)) == nullptr);
  CHECK(channel::DeviceLanding::of(Tensor()) == nullptr);
  // The bytes arrive in pieces that do not fall on chunk boundaries.
  size_t filled = 0;
  for (size_t piece :
       {size_t{3} << 20, size_t{2} << 20, size_t{4} << 20, size_t{1} << 20}) {
    std::memcpy(static_cast<uint8_t*>(host.data()) + filled,
                static_cast<const uint8_t*>(pattern.data()) + filled, piece);
    filled += piece;
    landing->arrived(filled);
  }
  CHECK(copies == 2);  // the two whole chunks: 0-4 and 4-8 MiB
  const Tensor on_device = landing->finish();
  CHECK(copies == 3);  // the last 2 MiB
  CHECK(on_device.device() == Device::cuda(1));
  CHECK(std::memcmp(on_device.data(), pattern.data(), pattern.nbytes()) == 0);

  SECTION(
      "a copy that fails on the way is made anew by finish(), which throws what it "
      "throws") {
    set_device_copier([](const Tensor&, const Tensor&) {
      throw Error(ErrorCode::kFailedPrecondition, "fake copy failed");
    });
    Tensor again = channel::DeviceLanding::receive_into(
        Tensor::empty({int64_t{10} << 18}, DType::kFloat32), Device::cuda(0),
        size_t{4} << 20);
    channel::DeviceLanding::of(again)->arrived(size_t{10} << 20);  // does not throw
    CHECK_THROWS_WITH(channel::DeviceLanding::of(again)->finish(),
                      Contains("fake copy failed"));
  }
  set_device_copier(nullptr);
}
