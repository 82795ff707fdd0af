// The PIPE agent's wire codec (agents/pipe_frame.h): round trips of every
// frame kind and dtype, device overrides, incremental reading in any
// chunking, tensors read straight into their storage, every validation rule
// with its message, and garbage that must never crash.
#include "agents/pipe_frame.h"

#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "collective/tensor.h"
#include "common/error.h"
#include "rpc/message.h"

using namespace switchboard;
using namespace switchboard::agents;
using namespace switchboard::agents::pipe;
using Catch::Contains;
using rpc::Message;
using rpc::MessageType;

namespace {

using Bytes = std::vector<uint8_t>;

// A CPU tensor whose bytes are a function of `seed` (bool bytes 0 or 1).
Tensor make_tensor(DType dtype, const Tensor::Shape& shape, uint32_t seed) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* p = static_cast<uint8_t*>(t.data());
  for (size_t i = 0; i < t.nbytes(); ++i) {
    auto byte = static_cast<uint8_t>(seed * 131 + i * 7 + (i >> 8));
    p[i] = dtype == DType::kBool ? byte & 1 : byte;
  }
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

Message make_message(MessageType type, uint64_t id, std::string function, Bytes payload,
                     std::vector<Tensor> tensors = {}) {
  Message m;
  m.type = type;
  m.id = id;
  m.function = std::move(function);
  m.payload = std::move(payload);
  m.tensors = std::move(tensors);
  return m;
}

// Header, body, then every tensor's bytes: what the agent puts on the wire.
void append_wire(Bytes& out, const Message& m, const std::vector<Device>& devices = {}) {
  append_frame(out, m, devices);
  for (const Tensor& t : m.tensors) {
    const auto* p = static_cast<const uint8_t*>(t.data());
    out.insert(out.end(), p, p + t.nbytes());
  }
}

Bytes wire(const Message& m, const std::vector<Device>& devices = {}) {
  Bytes out;
  append_wire(out, m, devices);
  return out;
}

void require_same(const InboundFrame& f, const Message& m) {
  REQUIRE(static_cast<int>(f.kind) == static_cast<int>(m.type));
  REQUIRE(f.message.type == m.type);
  REQUIRE(f.message.id == m.id);
  REQUIRE(f.message.function == m.function);
  REQUIRE(f.message.payload == m.payload);
  REQUIRE(f.message.tensors.size() == m.tensors.size());
  REQUIRE(f.devices.size() == m.tensors.size());
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    INFO("tensor " << i << ": " << m.tensors[i].describe());
    REQUIRE(same_bytes(f.message.tensors[i], m.tensors[i]));
    REQUIRE(f.message.tensors[i].device() == Device::cpu());
    REQUIRE(f.devices[i] == m.tensors[i].device());
  }
}

// Feeds `bytes` as a socket would: each read brings at most chunk() bytes
// and never more than next_buffer() offers. Returns the frames popped.
std::vector<InboundFrame> feed(FrameReader& reader, const Bytes& bytes,
                               const std::function<size_t()>& chunk) {
  std::vector<InboundFrame> frames;
  size_t offset = 0;
  while (offset < bytes.size()) {
    auto [buffer, capacity] = reader.next_buffer();
    REQUIRE(capacity > 0);
    const size_t n = std::min({capacity, bytes.size() - offset, chunk()});
    std::memcpy(buffer, bytes.data() + offset, n);
    offset += n;
    reader.commit(n);
    InboundFrame frame;
    while (reader.pop(frame)) frames.push_back(std::move(frame));
  }
  return frames;
}

// A valid request with two tensors, to patch in validation tests.
Bytes valid_request() {
  return wire(make_message(
      MessageType::kRequest, 7, "fn", {1, 2, 3},
      {make_tensor(DType::kFloat32, {2, 3}, 1), make_tensor(DType::kInt64, {4}, 2)}));
}

template <typename T>
void patch(Bytes& bytes, size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof value);  // little-endian host
}

// Header field offsets.
constexpr size_t kKindAt = 5, kFlagsAt = 6, kFunctionAt = 16, kPayloadAt = 20,
                 kTensorCountAt = 24, kDescriptorsAt = 28;
// In valid_request(): the first descriptor starts after "fn" and 3 payload bytes.
constexpr size_t kDescriptor0 = kHeaderSize + 2 + 3;
constexpr size_t kDescriptor1 = kDescriptor0 + descriptor_size(2);

void require_frame_error(const Bytes& bytes, const std::string& text,
                         const FrameLimits& limits = {}) {
  try {
    decode_all(bytes.data(), bytes.size(), limits);
    FAIL("no ProtocolError; expected one containing: " << text);
  } catch (const ProtocolError& e) {
    CHECK(e.code() == ErrorCode::kUnavailable);
    CHECK_THAT(e.what(), Contains(text));
  }
}

}  // namespace

TEST_CASE("the header is 32 little-endian bytes starting with \"SBPI\"", "[pipe_frame]") {
  FrameHeader h;
  h.kind = FrameKind::kResponse;
  h.id = 0x0102030405060708;
  h.function_length = 0;
  h.payload_length = 0x11223344;
  h.tensor_count = 2;
  h.descriptors_length = 40;
  uint8_t out[kHeaderSize];
  encode_header(h, out);
  REQUIRE(std::string(reinterpret_cast<char*>(out), 4) == "SBPI");
  const Bytes expected = {0x53, 0x42, 0x50, 0x49, 1, 2, 0,  0, 8, 7,    6,
                          5,    4,    3,    2,    1, 0, 0,  0, 0, 0x44, 0x33,
                          0x22, 0x11, 2,    0,    0, 0, 40, 0, 0, 0};
  REQUIRE(Bytes(out, out + kHeaderSize) == expected);

  FrameLimits limits;
  limits.max_payload_bytes = uint64_t{1} << 32;
  FrameHeader back = decode_header(out, limits);
  REQUIRE(back.kind == FrameKind::kResponse);
  REQUIRE(back.id == h.id);
  REQUIRE(back.payload_length == h.payload_length);
  REQUIRE(back.tensor_count == 2);
  REQUIRE(back.descriptors_length == 40);
  REQUIRE(back.body_size() == size_t{0x11223344} + 40);
}

TEST_CASE("every frame kind round-trips", "[pipe_frame]") {
  const Message request = make_message(MessageType::kRequest, 1, "add", {0x91, 0x01});
  const Message response = make_message(MessageType::kResponse, 1, "", {0x02});
  const Message error = make_message(MessageType::kError, 2, "", {'o', 'o', 'p', 's'});
  const Bytes hello = {0x82, 0xa4, 'n', 'a', 'm', 'e'};
  Bytes stream;
  append_control_frame(stream, FrameKind::kHello, 0, hello.data(), hello.size());
  append_wire(stream, request);
  append_wire(stream, response);
  append_wire(stream, error);
  append_control_frame(stream, FrameKind::kHeartbeat, 41);
  append_control_frame(stream, FrameKind::kGoodbye, 42);
  REQUIRE(stream.size() == 6 * kHeaderSize + hello.size() + 3 + 2 + 1 + 4);

  auto frames = decode_all(stream.data(), stream.size());
  REQUIRE(frames.size() == 6);
  REQUIRE(frames[0].kind == FrameKind::kHello);
  REQUIRE(frames[0].message.payload == hello);
  REQUIRE(frames[0].message.function.empty());
  REQUIRE(frames[0].message.tensors.empty());
  require_same(frames[1], request);
  require_same(frames[2], response);
  require_same(frames[3], error);
  REQUIRE(frames[4].kind == FrameKind::kHeartbeat);
  REQUIRE(frames[4].message.id == 41);
  REQUIRE(frames[4].message.payload.empty());
  REQUIRE(frames[5].kind == FrameKind::kGoodbye);
  REQUIRE(frames[5].message.id == 42);
  REQUIRE(kind_name(FrameKind::kGoodbye) == "goodbye");
}

TEST_CASE("messages with no, one and many tensors of every dtype round-trip",
          "[pipe_frame]") {
  std::vector<Tensor> many;
  uint32_t seed = 0;
  for (DType dtype : kAllDTypes) {
    for (const Tensor::Shape& shape : std::vector<Tensor::Shape>{
             {}, {0}, {1}, {7}, {2, 3, 4}, {5, 0, 2}, {1, 1, 1, 1, 1, 1, 1, 3}}) {
      many.push_back(make_tensor(dtype, shape, ++seed));
    }
  }
  Tensor::Shape most(kMaxTensorDims, 1);
  most[3] = 2;
  many.push_back(make_tensor(DType::kInt8, most, 99));

  const std::vector<Message> messages = {
      make_message(MessageType::kRequest, 10, "none", {1}),
      make_message(MessageType::kResponse, 11, "", {},
                   {make_tensor(DType::kFloat64, {3, 2}, 5)}),
      make_message(MessageType::kRequest, 12, "many", {9, 9}, many),
      make_message(MessageType::kError, 13, "", {},
                   {make_tensor(DType::kBool, {0, 4}, 6)}),
  };
  Bytes stream;
  for (const Message& m : messages) append_wire(stream, m);
  auto frames = decode_all(stream.data(), stream.size());
  REQUIRE(frames.size() == messages.size());
  for (size_t i = 0; i < messages.size(); ++i) require_same(frames[i], messages[i]);
  REQUIRE(frames[2].message.tensors.size() == std::size(kAllDTypes) * 7 + 1);
  REQUIRE(frames[2].message.tensors.back().dim() == kMaxTensorDims);
}

TEST_CASE("a descriptor names the device override; the default allocator uses the CPU",
          "[pipe_frame]") {
  const Message m = make_message(
      MessageType::kRequest, 3, "to_gpu", {},
      {make_tensor(DType::kFloat32, {4}, 1), make_tensor(DType::kInt32, {2, 2}, 2)});
  const Bytes bytes = wire(m, {Device::cuda(1), Device::cpu()});

  SECTION("default allocator: CPU tensors, the descriptor's device in devices") {
    auto frames = decode_all(bytes.data(), bytes.size());
    REQUIRE(frames.size() == 1);
    const InboundFrame& f = frames[0];
    REQUIRE(f.devices == std::vector<Device>{Device::cuda(1), Device::cpu()});
    for (size_t i = 0; i < 2; ++i) {
      REQUIRE(f.message.tensors[i].device() == Device::cpu());
      REQUIRE(same_bytes(f.message.tensors[i], m.tensors[i]));
    }
  }
  SECTION("a custom allocator is told the descriptor's device") {
    std::vector<Device> asked;
    FrameReader reader({}, [&](DType dtype, const Tensor::Shape& shape, Device device) {
      asked.push_back(device);
      return Tensor::empty(shape, dtype);
    });
    auto frames = feed(reader, bytes, [] { return size_t{1} << 20; });
    REQUIRE(asked == std::vector<Device>{Device::cuda(1), Device::cpu()});
    REQUIRE(frames.size() == 1);
    REQUIRE(frames[0].devices == asked);
  }
  SECTION("without overrides the tensors' own devices are named") {
    Bytes plain = wire(m);
    auto frames = decode_all(plain.data(), plain.size());
    REQUIRE(frames[0].devices == std::vector<Device>{Device::cpu(), Device::cpu()});
  }
}

TEST_CASE("frames arrive the same byte by byte, in random chunks and all at once",
          "[pipe_frame]") {
  std::mt19937 rng(1234);
  std::vector<Message> messages;
  Bytes stream;
  for (uint64_t id = 1; id <= 60; ++id) {
    const DType dtype = kAllDTypes[id % std::size(kAllDTypes)];
    std::vector<Tensor> tensors;
    for (uint64_t k = 0; k < id % 4; ++k) {
      // Now and then a 40 KiB tensor, read straight into its storage.
      const int64_t n =
          (id % 9 == 0 && k == 0) ? 40 * 1024 : static_cast<int64_t>(id * k);
      tensors.push_back(make_tensor(dtype, {n}, static_cast<uint32_t>(id + k)));
    }
    const auto type = static_cast<MessageType>(1 + id % 3);
    Bytes payload(id * 5 % 70, static_cast<uint8_t>(id));
    messages.push_back(make_message(
        type, id, type == MessageType::kRequest ? fmt::format("f{}", id) : "", payload,
        tensors));
    append_wire(stream, messages.back());
    if (id % 10 == 0) append_control_frame(stream, FrameKind::kHeartbeat, id);
  }
  auto check = [&](const std::vector<InboundFrame>& frames) {
    REQUIRE(frames.size() == messages.size() + 6);
    size_t next = 0;
    for (const InboundFrame& f : frames) {
      if (f.kind == FrameKind::kHeartbeat) {
        REQUIRE(f.message.id == messages[next - 1].id);
        continue;
      }
      require_same(f, messages[next++]);
    }
  };
  SECTION("all at once") {
    FrameReader reader;
    check(feed(reader, stream, [] { return SIZE_MAX; }));
    REQUIRE_FALSE(reader.mid_frame());
  }
  SECTION("byte by byte") {
    FrameReader reader;
    check(feed(reader, stream, [] { return size_t{1}; }));
    REQUIRE_FALSE(reader.mid_frame());
  }
  SECTION("random chunks") {
    for (int round = 0; round < 5; ++round) {
      FrameReader reader;
      std::uniform_int_distribution<size_t> size(1, round < 3 ? 64 : 70000);
      check(feed(reader, stream, [&] { return size(rng); }));
      REQUIRE_FALSE(reader.mid_frame());
    }
  }
  SECTION("decode_all") { check(decode_all(stream.data(), stream.size())); }
}

TEST_CASE("small frames: one read brings many", "[pipe_frame]") {
  Bytes stream;
  for (uint64_t id = 0; id < 500; ++id) {
    append_wire(stream, make_message(MessageType::kRequest, id, "ping", {1, 2, 3, 4}));
  }
  REQUIRE(stream.size() < kReadBufferSize);
  FrameReader reader;
  auto [buffer, capacity] = reader.next_buffer();
  REQUIRE(capacity >= kReadBufferSize);
  std::memcpy(buffer, stream.data(), stream.size());
  reader.commit(stream.size());
  InboundFrame f;
  for (uint64_t id = 0; id < 500; ++id) {
    REQUIRE(reader.pop(f));
    REQUIRE(f.message.id == id);
    REQUIRE(f.message.function == "ping");
  }
  REQUIRE_FALSE(reader.pop(f));
  REQUIRE_FALSE(reader.mid_frame());
  REQUIRE(reader.next_buffer().second >= kReadBufferSize);
}

TEST_CASE("frames pop in order when the consumer lags behind", "[pipe_frame]") {
  FrameReader reader;
  uint64_t sent = 0, popped = 0;
  InboundFrame f;
  for (int round = 0; round < 200; ++round) {
    Bytes stream;
    for (int k = 0; k < 3; ++k)
      append_control_frame(stream, FrameKind::kHeartbeat, sent++);
    auto [buffer, capacity] = reader.next_buffer();
    std::memcpy(buffer, stream.data(), stream.size());
    reader.commit(stream.size());
    REQUIRE(reader.pop(f));  // one frame per round: the backlog grows
    REQUIRE(f.message.id == popped++);
  }
  while (reader.pop(f)) REQUIRE(f.message.id == popped++);
  REQUIRE(popped == sent);
}

TEST_CASE("an 8 MiB tensor is read straight into its storage", "[pipe_frame]") {
  const Message m = make_message(MessageType::kResponse, 5, "", {7, 7, 7},
                                 {make_tensor(DType::kFloat32, {2, 1024, 1024}, 3)});
  Bytes stream = wire(m);
  append_control_frame(stream, FrameKind::kHeartbeat, 6);
  // Writes as the socket makes them: (where, how many).
  std::vector<std::pair<const uint8_t*, size_t>> writes;
  FrameReader reader;
  size_t offset = 0;
  while (offset < stream.size()) {
    auto [buffer, capacity] = reader.next_buffer();
    const size_t n = std::min({capacity, stream.size() - offset, size_t{300'000}});
    std::memcpy(buffer, stream.data() + offset, n);
    writes.emplace_back(buffer, n);
    offset += n;
    reader.commit(n);
  }
  InboundFrame f;
  REQUIRE(reader.pop(f));
  require_same(f, m);
  const Tensor& t = f.message.tensors[0];
  const auto begin = reinterpret_cast<uintptr_t>(t.data());
  size_t direct = 0;
  for (auto [where, n] : writes) {
    const auto at = reinterpret_cast<uintptr_t>(where);
    if (at >= begin && at + n <= begin + t.nbytes()) direct += n;
  }
  INFO("bytes read straight into the tensor: " << direct);
  REQUIRE(direct >= t.nbytes() - kReadBufferSize);
  REQUIRE(reader.pop(f));
  REQUIRE(f.kind == FrameKind::kHeartbeat);
  REQUIRE_FALSE(reader.mid_frame());
}

TEST_CASE("a body larger than the free space grows the buffer", "[pipe_frame]") {
  Bytes payload(3 << 20);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 13);
  const Message m =
      make_message(MessageType::kRequest, 8, std::string(60000, 'f'), payload);
  Bytes stream = wire(m);
  FrameReader reader;
  auto [buffer, capacity] = reader.next_buffer();
  std::memcpy(buffer, stream.data(), 100);
  reader.commit(100);
  REQUIRE(reader.mid_frame());
  // The room offered grows with the body bytes received (doubling), never
  // to what the header announced before they came.
  size_t fed = 100;
  size_t largest = 0;
  int reads = 0;
  while (fed < stream.size()) {
    auto [rest, rest_capacity] = reader.next_buffer();
    CHECK(rest_capacity <= std::max(fed, kReadBufferSize) + kReadBufferSize);
    largest = std::max(largest, rest_capacity);
    const size_t n = std::min(rest_capacity, stream.size() - fed);
    std::memcpy(rest, stream.data() + fed, n);
    reader.commit(n);
    fed += n;
    ++reads;
  }
  CHECK(largest > kReadBufferSize);  // it grew
  CHECK(reads <= 8);                 // by doubling: a few reads for 3 MiB
  InboundFrame f;
  REQUIRE(reader.pop(f));
  require_same(f, m);
  REQUIRE_FALSE(reader.mid_frame());
  // The large buffer is given back; the usual one is offered again.
  REQUIRE(reader.next_buffer().second >= kReadBufferSize);
}

TEST_CASE("mid_frame() tells whether part of a frame has arrived", "[pipe_frame]") {
  const Bytes bytes = valid_request();
  FrameReader reader;
  REQUIRE_FALSE(reader.mid_frame());
  for (size_t i = 0; i < bytes.size(); ++i) {
    auto [buffer, capacity] = reader.next_buffer();
    buffer[0] = bytes[i];
    reader.commit(1);
    REQUIRE(reader.mid_frame() == (i + 1 < bytes.size()));
  }
  InboundFrame f;
  REQUIRE(reader.pop(f));
  REQUIRE(f.message.function == "fn");
}

TEST_CASE("a reader moved mid-frame goes on where it was", "[pipe_frame]") {
  const Message m = make_message(MessageType::kResponse, 2, "", {5},
                                 {make_tensor(DType::kFloat64, {64, 64}, 9)});
  const Bytes bytes = wire(m);
  FrameReader first;
  auto [buffer, capacity] = first.next_buffer();
  std::memcpy(buffer, bytes.data(), 100);
  first.commit(100);
  FrameReader second = std::move(first);
  REQUIRE(second.mid_frame());
  Bytes rest(bytes.begin() + 100, bytes.end());
  auto frames = feed(second, rest, [] { return size_t{5000}; });
  REQUIRE(frames.size() == 1);
  require_same(frames[0], m);
}

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
    require_frame_error(b, "pipe frame: kind 0 is not a frame kind (1 to 7)");
    b[kKindAt] = 8;
    require_frame_error(b, "pipe frame: kind 8 is not a frame kind (1 to 7)");
  }
  SECTION("flags") {
    // A request may say that its timeout comes first (kFlagTimeout); no
    // other flag exists, and no other kind may say it.
    patch<uint16_t>(b, kFlagsAt, 2);
    require_frame_error(b, "pipe frame: flags 0x0002 on a request frame (allowed: 0x0001)");
    Bytes response = wire(make_message(MessageType::kResponse, 3, "", {1}));
    patch<uint16_t>(response, kFlagsAt, 1);
    require_frame_error(response, "pipe frame: flags 0x0001 on a response frame (allowed: "
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
    // (regression: found by tools/fuzz_pipe_frame, UB in Tensor::empty).
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

TEST_CASE("decode_all() reports a frame cut short", "[pipe_frame]") {
  const Bytes b = valid_request();
  for (size_t cut : {size_t{1}, size_t{31}, size_t{32}, kDescriptor1, b.size() - 1}) {
    INFO("cut at " << cut);
    require_frame_error(Bytes(b.begin(), b.begin() + cut), "pipe frame: truncated");
  }
  REQUIRE(decode_all(b.data(), 0).empty());
}

TEST_CASE("a failed reader stays failed; frames before the bad one can be popped",
          "[pipe_frame]") {
  Bytes stream;
  append_control_frame(stream, FrameKind::kHeartbeat, 1);
  Bytes bad = valid_request();
  bad[4] = 9;
  stream.insert(stream.end(), bad.begin(), bad.end());
  FrameReader reader;
  auto [buffer, capacity] = reader.next_buffer();
  std::memcpy(buffer, stream.data(), stream.size());
  REQUIRE_THROWS_WITH(reader.commit(stream.size()), Contains("version 9"));
  InboundFrame f;
  REQUIRE(reader.pop(f));
  REQUIRE(f.kind == FrameKind::kHeartbeat);
  REQUIRE_THROWS_AS(reader.next_buffer(), ProtocolError);
  REQUIRE_THROWS_WITH(reader.commit(0), Contains("version 9"));
}

TEST_CASE("commit() refuses more bytes than next_buffer() offered", "[pipe_frame]") {
  FrameReader reader;
  REQUIRE_THROWS_AS(reader.commit(1), std::invalid_argument);
  auto [buffer, capacity] = reader.next_buffer();
  REQUIRE_THROWS_AS(reader.commit(capacity + 1), std::invalid_argument);
  reader.commit(0);
  REQUIRE_THROWS_AS(reader.commit(1), std::invalid_argument);  // offered nothing since
}

TEST_CASE("the allocator must return the tensor asked for", "[pipe_frame]") {
  const Bytes b = valid_request();
  auto run = [&](FrameReader::Allocate allocate) {
    FrameReader reader({}, std::move(allocate));
    feed(reader, b, [] { return SIZE_MAX; });
  };
  REQUIRE_THROWS_WITH(run([](DType, const Tensor::Shape& shape, Device) {
                        return Tensor::empty(shape, DType::kUInt8);
                      }),
                      Contains("the allocator returned uint8[2, 3] on cpu for a "
                               "contiguous CPU float32[2, 3]"));
  REQUIRE_THROWS_AS(run([](DType, const Tensor::Shape&, Device) { return Tensor(); }),
                    std::invalid_argument);
  REQUIRE_THROWS_WITH(
      run([](DType, const Tensor::Shape&, Device) -> Tensor { throw std::bad_alloc(); }),
      Contains("pipe frame: out of memory receiving frame 7"));
}

TEST_CASE("the encoder refuses what cannot travel", "[pipe_frame]") {
  Bytes out = {1, 2};
  auto data = std::make_shared<std::vector<float>>(4);
  const Tensor strided = Tensor::from_blob(data->data(), {2, 2}, DType::kFloat32,
                                           Device::cpu(), data, {1, 2});
  Message m = make_message(MessageType::kRequest, 1, "f", {},
                           {make_tensor(DType::kInt8, {2}, 1), strided});
  REQUIRE_THROWS_WITH(append_frame(out, m), Contains("append_frame: tensor 1 (") &&
                                                Contains("is not contiguous"));
  m.tensors[1] = Tensor();
  REQUIRE_THROWS_WITH(append_frame(out, m), Contains("tensor 1 is undefined"));
  m.tensors.pop_back();
  REQUIRE_THROWS_WITH(append_frame(out, m, {Device::cpu(), Device::cpu()}),
                      Contains("2 devices for 1 tensors"));
  REQUIRE_THROWS_WITH(append_frame(out, m, {Device::cuda(40000)}),
                      Contains("tensor 0: device (type 1, index 40000) cannot be sent"));
  m.function.clear();
  REQUIRE_THROWS_WITH(append_frame(out, m), Contains("request 1 has no function"));
  m.type = MessageType::kResponse;
  m.function = "f";
  REQUIRE_THROWS_WITH(append_frame(out, m), Contains("response 1 has a function"));
  m.type = static_cast<MessageType>(7);
  REQUIRE_THROWS_WITH(append_frame(out, m), Contains("7 is not a message type"));
  m = make_message(MessageType::kResponse, 1, "", {},
                   {make_tensor(DType::kInt8, Tensor::Shape(kMaxTensorDims + 1, 1), 1)});
  REQUIRE_THROWS_WITH(append_frame(out, m),
                      Contains("has 65 dimensions (the limit is 64)"));
  const uint8_t x = 1;
  REQUIRE_THROWS_WITH(append_control_frame(out, FrameKind::kRequest, 1),
                      Contains("request is not a control frame"));
  REQUIRE_THROWS_WITH(append_control_frame(out, FrameKind::kHeartbeat, 1, &x, 1),
                      Contains("a heartbeat frame has no payload (1 bytes given)"));
  REQUIRE(out == Bytes{1, 2});  // nothing appended by a refused call
}

TEST_CASE("random garbage throws ProtocolError or waits for more bytes", "[pipe_frame]") {
  std::mt19937 rng(42);
  FrameLimits limits;
  limits.max_tensor_bytes = 1 << 20;
  limits.max_payload_bytes = 1 << 16;
  Bytes valid = valid_request();
  append_control_frame(valid, FrameKind::kGoodbye, 3);
  size_t errors = 0, waiting = 0, complete = 0;
  for (int round = 0; round < 3000; ++round) {
    Bytes b;
    if (round % 3 == 0) {  // pure noise
      b.resize(rng() % 200);
      for (auto& byte : b) byte = static_cast<uint8_t>(rng());
    } else {  // a valid stream with a few bytes changed (goes deeper)
      b = valid;
      for (int k = 0, n = 1 + round % 4; k < n; ++k) {
        b[rng() % b.size()] = static_cast<uint8_t>(round % 2 ? rng() : rng() % 4);
      }
    }
    FrameReader reader(limits);
    try {
      std::uniform_int_distribution<size_t> chunk(1, 80);
      feed(reader, b, [&] { return chunk(rng); });
      ++(reader.mid_frame() ? waiting : complete);
    } catch (const ProtocolError&) {
      ++errors;
    }
  }
  INFO(errors << " errors, " << waiting << " waiting, " << complete << " complete");
  REQUIRE(errors > 500);
  REQUIRE(waiting > 0);
  REQUIRE(complete > 0);
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
