// The PIPE agent's wire codec (agents/pipe/wire/frame.h): round trips of every
// frame kind and dtype, device overrides, incremental reading in any
// chunking, tensors read straight into their storage, and garbage that
// must never crash. The validation rules are in pipe_frame_rules_test.cc.
#include "agents/pipe/wire/frame.h"

#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "core/message.h"
#include "core/tensor.h"
#include "tests/agents/pipe/wire/frame_test_util.h"

using namespace switchboard;
using namespace switchboard::agents;
using namespace switchboard::agents::pipe::wire;
using namespace switchboard::agents::pipe::wire::frame_test;
using Catch::Contains;
using rpc::Message;
using rpc::MessageType;


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


// Feeds `bytes` to `reader` through its own buffers, popping nothing.
namespace {
void feed_all(FrameReader& reader, const std::vector<uint8_t>& bytes) {
  size_t at = 0;
  while (at < bytes.size()) {
    auto [buffer, room] = reader.next_buffer();
    const size_t n = std::min(room, bytes.size() - at);
    std::memcpy(buffer, bytes.data() + at, n);
    reader.commit(n);
    at += n;
  }
}
}  // namespace

TEST_CASE("a reader of a stranger refuses a large frame or tensors, takes one frame at a "
          "time, and reads the frames after the one that made it trusted with the full limits",
          "[pipe_frame][limits]") {
  bool trusted = false;
  FrameReader reader;
  reader.set_trust([&] { return trusted; });
  const std::vector<uint8_t> hello(100, 7);
  std::vector<uint8_t> bytes;
  append_control_frame(bytes, FrameKind::kHello, 0, hello.data(), hello.size());
  Message big;
  big.type = MessageType::kRequest;
  big.id = 5;
  big.function = "f";
  big.payload.assign(kMaxStrangerFrameBytes + 1, 1);
  big.tensors.push_back(Tensor::from_vector(std::vector<float>{1, 2, 3}));
  append_wire(bytes, big);
  feed_all(reader, bytes);  // the hello and the large request arrive together
  InboundFrame frame;
  REQUIRE(reader.pop(frame));
  CHECK(frame.kind == FrameKind::kHello);
  trusted = true;  // what handling the hello decided
  REQUIRE(reader.pop(frame));
  CHECK(frame.kind == FrameKind::kRequest);
  CHECK(frame.message.payload.size() == kMaxStrangerFrameBytes + 1);
  CHECK(frame.message.tensors.size() == 1);

  SECTION("the same bytes from a peer that stays a stranger") {
    FrameReader stranger;
    stranger.set_trust([] { return false; });
    feed_all(stranger, std::vector<uint8_t>(bytes.begin(),
                                        bytes.begin() + kHeaderSize + hello.size()));
    REQUIRE(stranger.pop(frame));
    std::vector<uint8_t> rest(bytes.begin() + kHeaderSize + hello.size(), bytes.end());
    rest.resize(kHeaderSize);  // only the request's header
    auto [buffer, room] = stranger.next_buffer();
    std::memcpy(buffer, rest.data(), rest.size());
    CHECK_THROWS_WITH(stranger.commit(rest.size()),
                      Contains("before the peer proved who it is"));
  }
}
