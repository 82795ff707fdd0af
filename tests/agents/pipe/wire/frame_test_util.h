// Helpers of the PIPE frame tests (pipe_frame_test.cc, pipe_frame_rules_test.cc):
// messages and tensors to encode, their bytes, the offsets of a valid
// request's fields, and checks. Tests only.
#pragma once

#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "agents/pipe/wire/frame.h"
#include "common/error.h"
#include "core/message.h"
#include "core/tensor.h"

namespace switchboard::agents::pipe::wire::frame_test {

using rpc::Message;
using rpc::MessageType;
using Catch::Contains;


using Bytes = std::vector<uint8_t>;

// A CPU tensor whose bytes are a function of `seed` (bool bytes 0 or 1).
inline Tensor make_tensor(DType dtype, const Tensor::Shape& shape, uint32_t seed) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* p = static_cast<uint8_t*>(t.data());
  for (size_t i = 0; i < t.nbytes(); ++i) {
    auto byte = static_cast<uint8_t>(seed * 131 + i * 7 + (i >> 8));
    p[i] = dtype == DType::kBool ? byte & 1 : byte;
  }
  return t;
}

inline bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

inline Message make_message(MessageType type, uint64_t id, std::string function, Bytes payload,
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
inline void append_wire(Bytes& out, const Message& m, const std::vector<Device>& devices = {}) {
  append_frame(out, m, devices);
  for (const Tensor& t : m.tensors) {
    const auto* p = static_cast<const uint8_t*>(t.data());
    out.insert(out.end(), p, p + t.nbytes());
  }
}

inline Bytes wire(const Message& m, const std::vector<Device>& devices = {}) {
  Bytes out;
  append_wire(out, m, devices);
  return out;
}

inline void require_same(const InboundFrame& f, const Message& m) {
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
inline std::vector<InboundFrame> feed(FrameReader& reader, const Bytes& bytes,
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
inline Bytes valid_request() {
  return wire(make_message(
      MessageType::kRequest, 7, "fn", {1, 2, 3},
      {make_tensor(DType::kFloat32, {2, 3}, 1), make_tensor(DType::kInt64, {4}, 2)}));
}

template <typename T>
inline void patch(Bytes& bytes, size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof value);  // little-endian host
}

// Header field offsets.
constexpr size_t kKindAt = 5, kFlagsAt = 6, kFunctionAt = 16, kPayloadAt = 20,
                 kTensorCountAt = 24, kDescriptorsAt = 28;
// In valid_request(): the first descriptor starts after "fn" and 3 payload bytes.
constexpr size_t kDescriptor0 = kHeaderSize + 2 + 3;
constexpr size_t kDescriptor1 = kDescriptor0 + descriptor_size(2);

inline void require_frame_error(const Bytes& bytes, const std::string& text,
                         const FrameLimits& limits = {}) {
  try {
    decode_all(bytes.data(), bytes.size(), limits);
    FAIL("no ProtocolError; expected one containing: " << text);
  } catch (const ProtocolError& e) {
    CHECK(e.code() == ErrorCode::kUnavailable);
    CHECK_THAT(e.what(), Contains(text));
  }
}

}  // namespace switchboard::agents::pipe::wire::frame_test
