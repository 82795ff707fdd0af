// The cuda_ipc channel (agents/pipe/channel/cuda_ipc/cuda_ipc.h) on its own, over a
// stand-in DeviceIpc (tests/agents/pipe/fake_device_ipc.h) and connections that
// record what the channel queues on them: the outbox protocol (export
// once, refill only after a release, decline when every outbox is in
// flight, grow by dropping a free one that is too small), what a hostile
// peer's messages and frames do (protocol errors naming the outbox), and
// that a closed connection frees and unmaps everything.
#include "agents/pipe/channel/cuda_ipc/cuda_ipc.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "agents/pipe/transport/connection.h"
#include "common/error.h"
#include "core/little_endian.h"
#include "core/tensor.h"
#include "tests/agents/pipe/channel/recording_connection.h"
#include "tests/agents/pipe/fake_device_ipc.h"

using namespace switchboard;
using namespace switchboard::agents;
using namespace switchboard::agents::pipe;
using namespace switchboard::agents::pipe::transport;
using Catch::Contains;
using channel::CudaIpcChannel;

namespace {

// Hands what was queued on `from` to `to`, as the peer would receive it
// (every message the cuda_ipc channel's: tag 1).
void deliver(sbtest::RecordingConnection& from, CudaIpcChannel& to,
             const Connection& arrives_on) {
  for (uint8_t tag : from.tags) REQUIRE(tag == 1);
  for (const auto& message : from.sent) to.on_message(arrives_on, message);
  from.tags.clear();
  from.sent.clear();
}

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

// The Channel interface's calls, as the agent makes them.
std::optional<pipe::wire::TensorRoute> put(CudaIpcChannel& channel,
                                           Connection& connection, Tensor t) {
  return channel.send(connection, t, Device::cuda(0));
}
void check(const CudaIpcChannel& channel, const Connection& connection,
           const pipe::wire::InboundFrame& frame) {
  for (const auto& t : frame.channel_tensors) channel.check(connection, frame, t);
}
Tensor fetch(CudaIpcChannel& channel, Connection& connection,
             const pipe::wire::InboundFrame::ChannelTensor& tensor, Device device) {
  channel::Arrival arrival;
  arrival.index = tensor.index;
  arrival.device = device;
  arrival.routed = tensor;
  return channel.receive(connection, std::move(arrival));
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
  sbtest::RecordingConnection out;  // the sender's end
  sbtest::RecordingConnection in;   // the receiver's end

  // Sends `t`, delivers the export (if any) and fetches it at the receiver;
  // the release goes back to the sender.
  Tensor round(const Tensor& t) {
    std::optional<pipe::wire::TensorRoute> route = put(sender, out, t);
    REQUIRE(route);
    deliver(out, receiver, in);
    pipe::wire::InboundFrame f = frame_for(route->buffer, t.numel());
    check(receiver, in, f);
    Tensor got = fetch(receiver, in, f.channel_tensors[0], Device::cuda(1));
    deliver(in, sender, out);
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
  const auto a = put(link.sender, link.out, device_tensor(100, 0));
  const auto b = put(link.sender, link.out, device_tensor(100, 0));
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a->buffer != b->buffer);
  // Both in flight (max_outboxes 2): the caller stages this one.
  CHECK_FALSE(put(link.sender, link.out, device_tensor(100, 0)));
  deliver(link.out, link.receiver, link.in);
  link.sender.on_message(link.out, op(2, a->buffer));  // a released
  // Larger than a's 1 MiB: a is dropped (the receiver is told), a new one made.
  const auto c = put(link.sender, link.out, device_tensor(1 << 19, 0));  // 2 MiB
  REQUIRE(c);
  CHECK(c->buffer != a->buffer);
  REQUIRE(link.out.sent.size() == 2);
  CHECK(link.out.sent[0] == op(3, a->buffer));
  CHECK(link.out.sent[1][0] == 1);  // the export of c
  deliver(link.out, link.receiver, link.in);
  // Above max_outbox_bytes: staged.
  CHECK_FALSE(put(link.sender, link.out, device_tensor(int64_t{17} << 20, 0)));
}

TEST_CASE(
    "an outbox dropped for a larger one is unmapped by the receiver even when the larger "
    "one cannot be made",
    "[cuda_ipc]") {
  Link link;
  const auto a = put(link.sender, link.out, device_tensor(100, 0));
  const auto b = put(link.sender, link.out, device_tensor(100, 0));
  REQUIRE(a);
  REQUIRE(b);
  deliver(link.out, link.receiver, link.in);
  check(link.receiver, link.in, frame_for(a->buffer, 100));  // a is known there
  link.sender.on_message(link.out, op(2, a->buffer));        // and released
  link.ipc->out_of_memory = true;
  CHECK_THROWS_WITH(put(link.sender, link.out, device_tensor(1 << 19, 0)),
                    Contains("out of memory"));
  REQUIRE(link.out.sent.size() == 1);
  CHECK(link.out.sent[0] == op(3, a->buffer));
  deliver(link.out, link.receiver, link.in);
  CHECK_THROWS_WITH(check(link.receiver, link.in, frame_for(a->buffer, 100)),
                    Contains("never exported"));
  link.ipc->out_of_memory = false;
  CHECK(put(link.sender, link.out, device_tensor(1 << 19, 0)));  // room again
}

TEST_CASE(
    "a hostile peer's channel messages and routes are protocol errors naming the outbox",
    "[cuda_ipc]") {
  Link link;
  const auto a = put(link.sender, link.out, device_tensor(100, 0));
  REQUIRE(a);
  const std::vector<uint8_t> export_a = link.out.sent.at(0);
  deliver(link.out, link.receiver, link.in);
  SECTION("an outbox never exported") {
    CHECK_THROWS_WITH(check(link.receiver, link.in, frame_for(a->buffer + 7, 10)),
                      Contains("names outbox " + std::to_string(a->buffer + 7) +
                               ", which the peer never exported"));
  }
  SECTION("more bytes than the outbox holds") {
    CHECK_THROWS_WITH(check(link.receiver, link.in, frame_for(a->buffer, 1 << 20)),
                      Contains("4194304 bytes from outbox"));
  }
  SECTION("a CPU target") {
    CHECK_THROWS_WITH(
        check(link.receiver, link.in, frame_for(a->buffer, 10, Device::cpu())),
        Contains("CUDA IPC to cpu"));
  }
  SECTION("an export twice, a bad op, a bad length") {
    CHECK_THROWS_WITH(link.receiver.on_message(link.in, export_a),
                      Contains("exported twice"));
    CHECK_THROWS_WITH(link.receiver.on_message(link.in, op(9, 1)),
                      Contains("op 9 is not an op"));
    CHECK_THROWS_WITH(link.receiver.on_message(link.in, std::vector<uint8_t>{2, 0}),
                      Contains("op 2 of 2 bytes"));
    CHECK_THROWS_AS(link.receiver.on_message(link.in, std::vector<uint8_t>{}),
                    ProtocolError);
  }
  SECTION("a release of an outbox not in flight") {
    link.sender.on_message(link.out, op(2, a->buffer));
    CHECK_THROWS_WITH(link.sender.on_message(link.out, op(2, a->buffer)),
                      Contains("a release of outbox " + std::to_string(a->buffer) +
                               ", which is not in flight"));
  }
  SECTION("handles that name nothing fail the fetch, which still releases the outbox") {
    std::vector<uint8_t> forged = export_a;
    forged[1] ^= 0x40;   // another outbox id, the same handles
    forged[30] ^= 0xff;  // and handles that name nothing
    const uint64_t forged_id = load_le<uint64_t>(forged.data() + 1);
    link.receiver.on_message(link.in, forged);
    pipe::wire::InboundFrame f = frame_for(forged_id, 10);
    check(link.receiver, link.in, f);
    CHECK_THROWS_WITH(
        fetch(link.receiver, link.in, f.channel_tensors[0], Device::cuda(0)),
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
  const auto in_flight = put(link.sender, link.out, device_tensor(1000, 0));
  REQUIRE(in_flight);
  CHECK(link.ipc->outboxes_alive == 1);
  CHECK(link.ipc->inboxes_alive == 1);
  link.receiver.forget(link.in);
  CHECK(link.ipc->inboxes_alive == 0);
  pipe::wire::InboundFrame f = frame_for(in_flight->buffer, 1000);
  CHECK_THROWS_AS(fetch(link.receiver, link.in, f.channel_tensors[0], Device::cuda(0)),
                  ConnectionError);
  link.sender.forget(link.out);
  CHECK(link.ipc->outboxes_alive == 0);
  CHECK(link.sender.outbox_count() == 0);
}
