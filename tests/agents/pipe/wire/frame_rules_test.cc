// PIPE's frame codec refusing what no correct peer sends (header and
// descriptor rules, the limits and the flags), and what a header may
// announce before its bytes come. The round trips are in pipe_frame_test.cc.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "agents/pipe/wire/frame.h"
#include "common/error.h"
#include "core/message.h"
#include "core/tensor.h"
#include "tests/agents/pipe/wire/frame_test_util.h"

using namespace switchboard;
using namespace switchboard::agents;
using namespace switchboard::agents::pipe::wire;
using namespace switchboard::agents::pipe::wire::frame_test;

TEST_CASE("header rules are enforced with messages naming field, value and limit",
          "[pipe_frame]") {
  Bytes b = valid_request();
  SECTION("magic") {
    patch<uint32_t>(b, 0, 0x12345678);
    require_frame_error(b, "pipe frame: bad magic 0x12345678 (expected 0x49504253");
  }
  SECTION("version") {
    b[4] = 2;
    require_frame_error(b, "pipe frame: version 2 is not supported (expected 1)");
  }
  SECTION("kind") {
    b[kKindAt] = 0;
    require_frame_error(b, "pipe frame: kind 0 is not a frame kind (1 to 9)");
    b[kKindAt] = 10;
    require_frame_error(b, "pipe frame: kind 10 is not a frame kind (1 to 9)");
  }
  SECTION("flags") {
    // A request may say that its timeout comes first (kFlagTimeout);
    // requests, responses and errors may carry routes (kFlagChannel); no
    // other flag exists, and no other kind may say them.
    patch<uint16_t>(b, kFlagsAt, 4);
    require_frame_error(b, "pipe frame: flags 0x0004 on a request frame (allowed: 0x0003)");
    Bytes response = wire(make_message(MessageType::kResponse, 3, "", {1}));
    patch<uint16_t>(response, kFlagsAt, 1);
    require_frame_error(response, "pipe frame: flags 0x0001 on a response frame (allowed: "
                                  "0x0002)");
    Bytes heartbeat;
    append_control_frame(heartbeat, FrameKind::kHeartbeat, 1);
    patch<uint16_t>(heartbeat, kFlagsAt, 2);
    require_frame_error(heartbeat, "pipe frame: flags 0x0002 on a heartbeat frame (allowed: "
                                   "0x0000)");
  }
  SECTION("function_length") {
    patch<uint32_t>(b, kFunctionAt, 70000);
    require_frame_error(b, "pipe frame: function_length 70000 exceeds the limit 65536");
  }
  SECTION("payload_length") {
    FrameLimits limits;
    limits.max_payload_bytes = 2;
    require_frame_error(b, "pipe frame: payload_length 3 exceeds the limit 2", limits);
  }
  SECTION("tensor_count") {
    FrameLimits limits;
    limits.max_tensors = 1;
    require_frame_error(b, "pipe frame: tensor_count 2 exceeds the limit 1", limits);
  }
  SECTION("descriptors_length below tensor_count * 8") {
    patch<uint32_t>(b, kDescriptorsAt, 15);
    require_frame_error(b,
                        "pipe frame: descriptors_length 15 is out of range for "
                        "tensor_count 2 (must be between 16 and 1040)");
  }
  SECTION("descriptors_length above tensor_count * (8 + 8 * kMaxTensorDims)") {
    patch<uint32_t>(b, kDescriptorsAt, 1041);
    require_frame_error(b, "descriptors_length 1041 is out of range for tensor_count 2");
  }
  SECTION("descriptors without tensors") {
    patch<uint32_t>(b, kTensorCountAt, 0);
    require_frame_error(b,
                        "descriptors_length 40 is out of range for tensor_count 0 "
                        "(must be between 0 and 0)");
  }
  SECTION("a request with an empty function") {
    Bytes r = wire(make_message(MessageType::kResponse, 4, "", {1}));
    r[kKindAt] = 1;
    require_frame_error(r, "pipe frame: request frame 4 has function_length 0");
  }
  SECTION("a response or an error with a function") {
    b[kKindAt] = 2;
    require_frame_error(b,
                        "pipe frame: response frame 7 has function_length 2 (must be 0)");
    b[kKindAt] = 3;
    require_frame_error(b, "pipe frame: error frame 7 has function_length 2 (must be 0)");
  }
  SECTION("control frames with tensors") {
    for (uint8_t kind : {4, 5, 6}) {
      b[kKindAt] = kind;
      require_frame_error(
          b, fmt::format("pipe frame: {} frame 7 has tensor_count 2 (must be 0)",
                         kind_name(static_cast<FrameKind>(kind))));
    }
  }
  SECTION("a hello with a function") {
    Bytes h;
    append_control_frame(h, FrameKind::kHello, 9);
    patch<uint32_t>(h, kFunctionAt, 1);
    h.push_back('x');
    require_frame_error(h, "pipe frame: hello frame 9 has function_length 1 (must be 0)");
  }
  SECTION("heartbeat and goodbye with a body") {
    for (FrameKind kind : {FrameKind::kHeartbeat, FrameKind::kGoodbye}) {
      Bytes h;
      const uint8_t x = 'x';
      append_control_frame(h, FrameKind::kHello, 9, &x, 1);
      h[kKindAt] = static_cast<uint8_t>(kind);
      require_frame_error(h, fmt::format("pipe frame: {} frame 9 has payload_length 1 "
                                         "(must be 0)",
                                         kind_name(kind)));
      patch<uint32_t>(h, kPayloadAt, 0);
      patch<uint32_t>(h, kFunctionAt, 1);
      require_frame_error(h, "has function_length 1 (must be 0)");
    }
  }
  SECTION("decode_header() applies the same rules") {
    patch<uint32_t>(b, kFunctionAt, 70000);
    REQUIRE_THROWS_AS(decode_header(b.data(), FrameLimits{}), ProtocolError);
  }
}

TEST_CASE("FrameLimits::max_tensors lowers the shared tensor limit but cannot raise it",
          "[pipe_frame]") {
  FrameHeader h;
  h.kind = FrameKind::kResponse;
  h.id = 5;
  h.tensor_count = kMaxTensorsPerMessage;
  h.descriptors_length = kMaxTensorsPerMessage * descriptor_size(0);
  Bytes b(kHeaderSize);
  encode_header(h, b.data());
  FrameLimits limits;
  REQUIRE(limits.max_tensors == kMaxTensorsPerMessage);
  limits.max_tensors = 1 << 20;
  REQUIRE(decode_header(b.data(), limits).tensor_count == kMaxTensorsPerMessage);
  h.tensor_count = kMaxTensorsPerMessage + 1;
  h.descriptors_length += descriptor_size(0);
  encode_header(h, b.data());
  REQUIRE_THROWS_WITH(decode_header(b.data(), limits),
                      "pipe frame: tensor_count 65537 exceeds the limit 65536 "
                      "(kMaxTensorsPerMessage)");
  limits.max_tensors = 10;
  REQUIRE_THROWS_WITH(
      decode_header(b.data(), limits),
      "pipe frame: tensor_count 65537 exceeds the limit 10 (max_tensors)");
}

TEST_CASE("descriptor rules are enforced with messages naming tensor, value and limit",
          "[pipe_frame]") {
  Bytes b = valid_request();
  SECTION("dtype") {
    b[kDescriptor1] = 9;
    require_frame_error(b,
                        "pipe frame: frame 7 tensor 1: dtype 9 is not a dtype (0 to 8)");
  }
  SECTION("device type") {
    b[kDescriptor0 + 1] = 2;
    require_frame_error(b,
                        "pipe frame: frame 7 tensor 0: device type 2 is not a device "
                        "type (0 cpu, 1 cuda)");
  }
  SECTION("device index") {
    patch<int16_t>(b, kDescriptor0 + 2, 1);
    require_frame_error(
        b, "pipe frame: frame 7 tensor 0: device index 1 for cpu (must be 0)");
    b[kDescriptor0 + 1] = 1;
    patch<int16_t>(b, kDescriptor0 + 2, -1);
    require_frame_error(
        b, "pipe frame: frame 7 tensor 0: device index -1 for cuda is negative");
  }
  SECTION("ndim") {
    patch<uint32_t>(b, kDescriptor1 + 4, 65);
    require_frame_error(b, "pipe frame: frame 7 tensor 1: ndim 65 exceeds the limit 64");
    // 64 is within the limit: only the extents are missing.
    patch<uint32_t>(b, kDescriptor1 + 4, 64);
    require_frame_error(b,
                        "pipe frame: frame 7: descriptors_length 40 is too short for "
                        "tensor 1's 64 extents");
  }
  SECTION("negative extent") {
    patch<int64_t>(b, kDescriptor0 + 16, -3);
    require_frame_error(b,
                        "pipe frame: frame 7 tensor 0: extent -3 in dimension 1 is "
                        "negative");
  }
  SECTION("numel overflow") {
    patch<int64_t>(b, kDescriptor0 + 8, int64_t{1} << 40);
    patch<int64_t>(b, kDescriptor0 + 16, int64_t{1} << 40);
    require_frame_error(b,
                        "pipe frame: frame 7 tensor 0: numel of shape [1099511627776, "
                        "1099511627776] overflows int64");
  }
  SECTION("strides overflow in a shape with no elements") {
    // [0, 2^40, 2^40]: numel 0, but the contiguous strides overflow
    // (regression: found by tests/agents/pipe/fuzz/fuzz_pipe_frame, UB in Tensor::empty).
    Bytes r = wire(make_message(MessageType::kResponse, 6, "", {},
                                {make_tensor(DType::kInt8, {0, 1, 1}, 1)}));
    patch<int64_t>(r, kHeaderSize + 8 + 8, int64_t{1} << 40);
    patch<int64_t>(r, kHeaderSize + 8 + 16, int64_t{1} << 40);
    require_frame_error(r,
                        "pipe frame: frame 6 tensor 0: the strides of shape [0, "
                        "1099511627776, 1099511627776] overflow int64");
    patch<int64_t>(r, kHeaderSize + 8 + 16, int64_t{1} << 20);
    auto frames = decode_all(r.data(), r.size());
    REQUIRE(frames[0].message.tensors[0].shape() ==
            Tensor::Shape{0, int64_t{1} << 40, int64_t{1} << 20});
  }
  SECTION("nbytes overflow") {
    patch<int64_t>(b, kDescriptor1 + 8, int64_t{1} << 62);
    require_frame_error(
        b,
        "pipe frame: frame 7 tensor 1: nbytes of int64[4611686018427387904] "
        "overflows");
  }
  SECTION("the sum of tensor bytes") {
    FrameLimits limits;
    limits.max_tensor_bytes = 40;  // 24 + 32 bytes in valid_request()
    require_frame_error(b,
                        "pipe frame: frame 7: tensor bytes 56 (the sum through tensor 1) "
                        "exceed the limit 40 (max_tensor_bytes)",
                        limits);
    limits.max_tensor_bytes = 56;
    REQUIRE(decode_all(b.data(), b.size(), limits).size() == 1);
  }
  SECTION("descriptors_length shorter than the descriptors") {
    // Tensor 1 claims 2 dims where its descriptor has room for 1.
    patch<uint32_t>(b, kDescriptor1 + 4, 2);
    require_frame_error(b,
                        "pipe frame: frame 7: descriptors_length 40 is too short for "
                        "tensor 1's 2 extents");
  }
  SECTION("descriptors_length longer than the descriptors") {
    patch<uint32_t>(b, kDescriptor1 + 4, 0);  // a scalar: 8 bytes left over
    require_frame_error(
        b,
        "pipe frame: frame 7: descriptors_length 40 does not match the 32 "
        "bytes of the descriptors of its 2 tensors");
  }
  SECTION("descriptors_length too short for the next descriptor") {
    patch<uint32_t>(b, kTensorCountAt, 3);  // a third tensor, with no descriptor
    require_frame_error(b,
                        "pipe frame: frame 7: descriptors_length 40 is too short for "
                        "tensor_count 3 (tensor 2's descriptor starts at byte 40)");
  }
}

TEST_CASE("a header announcing a large body makes the reader offer room only as the body's "
          "bytes arrive",
          "[pipe_frame][limits]") {
  FrameHeader header;
  header.kind = FrameKind::kHello;
  header.payload_length = static_cast<uint32_t>(FrameLimits{}.max_payload_bytes);
  Bytes bytes(kHeaderSize);
  encode_header(header, bytes.data());
  FrameReader reader;
  auto [at, room] = reader.next_buffer();
  REQUIRE(room >= bytes.size());
  std::memcpy(at, bytes.data(), bytes.size());
  reader.commit(bytes.size());
  // Nothing of the 1 GiB body came yet: no gigabyte buffer.
  size_t received = 0;
  for (int step = 0; step < 6; ++step) {
    auto [to, offered] = reader.next_buffer();
    INFO("after " << received << " body bytes");
    CHECK(offered <= std::max(received, kReadBufferSize) + kReadBufferSize);
    std::memset(to, 0, offered);
    reader.commit(offered);
    received += offered;
  }
  // It still completes the frame when the bytes do come (a smaller frame
  // than 1 GiB, so that the test stays light: 8 MiB).
  FrameReader small;
  header.payload_length = 8u << 20;
  encode_header(header, bytes.data());
  Bytes frame = bytes;
  frame.resize(kHeaderSize + header.payload_length, 7);
  size_t fed = 0;
  while (fed < frame.size()) {
    auto [to, offered] = small.next_buffer();
    const size_t n = std::min(offered, frame.size() - fed);
    std::memcpy(to, frame.data() + fed, n);
    small.commit(n);
    fed += n;
  }
  InboundFrame out;
  REQUIRE(small.pop(out));
  CHECK(out.message.payload.size() == header.payload_length);
  CHECK(out.message.payload.back() == 7);
}

TEST_CASE("a request's timeout travels before its body, flagged; without one nothing is added",
          "[pipe_frame]") {
  Message m = make_message(MessageType::kRequest, 9, "fn", {1, 2},
                           {make_tensor(DType::kFloat32, {3}, 4)});
  const size_t plain = wire(m).size();
  m.timeout_ms = 1234;
  const Bytes bytes = wire(m);
  CHECK(bytes.size() == plain + 8);
  CHECK(bytes.size() == frame_size(m));
  CHECK((bytes[6] | (bytes[7] << 8)) == kFlagTimeout);
  const std::vector<InboundFrame> frames = decode_all(bytes.data(), bytes.size(), {});
  REQUIRE(frames.size() == 1);
  CHECK(frames[0].message.timeout_ms == 1234);
  require_same(frames[0], m);
  // A response never carries one.
  Message reply = make_message(MessageType::kResponse, 9, "", {3});
  reply.timeout_ms = 99;
  const Bytes reply_bytes = wire(reply);
  CHECK((reply_bytes[6] | (reply_bytes[7] << 8)) == 0);
  CHECK(decode_all(reply_bytes.data(), reply_bytes.size(), {})[0].message.timeout_ms == 0);
  // The flag with a timeout of 0 is refused: one encoding per message.
  Bytes zero = bytes;
  for (int i = 0; i < 8; ++i) zero[kHeaderSize + i] = 0;
  require_frame_error(zero, "request 9 is flagged with a timeout of 0 ms");
}

TEST_CASE("a tensor a channel carries is routed in the frame and sends no bytes; route "
          "records are checked",
          "[pipe_frame]") {
  const Tensor inline_tensor = make_tensor(DType::kFloat32, {3}, 4);
  const Tensor carried = make_tensor(DType::kInt64, {2, 5}, 7);
  Message m = make_message(MessageType::kResponse, 12, "", {1, 2}, {inline_tensor, carried});
  const std::vector<Device> devices = {Device::cpu(), Device::cuda(1)};
  const std::vector<TensorRoute> routes = {{}, {TensorChannel::kCudaIpc, 77}};
  Bytes bytes;
  append_frame(bytes, m, devices, routes);
  // Only the inline tensor's bytes follow.
  bytes.insert(bytes.end(), static_cast<const uint8_t*>(inline_tensor.data()),
               static_cast<const uint8_t*>(inline_tensor.data()) + inline_tensor.nbytes());
  CHECK((bytes[6] | (bytes[7] << 8)) == kFlagChannel);
  const std::vector<InboundFrame> frames = decode_all(bytes.data(), bytes.size(), {});
  REQUIRE(frames.size() == 1);
  const InboundFrame& f = frames[0];
  REQUIRE(f.message.tensors.size() == 2);
  CHECK(f.message.tensors[0].nbytes() == inline_tensor.nbytes());
  CHECK(std::memcmp(f.message.tensors[0].data(), inline_tensor.data(), inline_tensor.nbytes()) ==
        0);
  CHECK(!f.message.tensors[1].defined());
  REQUIRE(f.channel_tensors.size() == 1);
  CHECK(f.channel_tensors[0].index == 1);
  CHECK(f.channel_tensors[0].dtype == DType::kInt64);
  CHECK(f.channel_tensors[0].shape == Tensor::Shape{2, 5});
  CHECK(f.channel_tensors[0].route == routes[1]);
  CHECK(f.devices[1] == Device::cuda(1));

  // Every route inline: no flag, no records (one encoding per message).
  Bytes plain;
  append_frame(plain, m, devices, {{}, {}});
  Bytes unrouted;
  append_frame(unrouted, m, devices);
  CHECK(plain == unrouted);

  // The records' rules.
  const size_t records = bytes.size() - inline_tensor.nbytes() - 2 * kRouteSize;
  SECTION("an unknown channel") {
    Bytes b = bytes;
    b[records + kRouteSize] = 2;
    require_frame_error(b, "frame 12 tensor 1: channel 2 is not a channel (0 inline, 1 cuda_ipc)");
  }
  SECTION("a reserved byte set") {
    Bytes b = bytes;
    b[records + 3] = 1;
    require_frame_error(b, "frame 12 tensor 0: route byte 3 is 0x01 (must be 0)");
  }
  SECTION("an inline route naming a buffer") {
    Bytes b = bytes;
    b[records + 8] = 5;
    require_frame_error(b, "frame 12 tensor 0: an inline route names buffer 5 (must be 0)");
  }
  SECTION("flagged, yet every tensor inline") {
    Bytes b = bytes;
    b[records + kRouteSize] = 0;
    std::fill(b.begin() + static_cast<std::ptrdiff_t>(records + kRouteSize + 8),
              b.begin() + static_cast<std::ptrdiff_t>(records + 2 * kRouteSize), 0);
    require_frame_error(b, "frame 12 is flagged with routes but every tensor is inline");
  }
  SECTION("flagged without tensors") {
    Bytes b = wire(make_message(MessageType::kError, 4, "", {1}));
    patch<uint16_t>(b, kFlagsAt, kFlagChannel);
    require_frame_error(b, "error frame 4 is flagged with routes but carries no tensors");
  }
}
