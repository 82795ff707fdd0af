// libFuzzer target for the PIPE agent's wire codec (agents/pipe/wire/frame.h):
// FrameReader fed an arbitrary byte stream under small limits (so that no
// input can make it allocate more than a few MiB).
// Build and run with tests/agents/pipe/fuzz/fuzz_pipe_frame (clang, ASan + UBSan, no
// Bazel); tests/agents/pipe/wire/frame_fuzz_smoke_test.cc runs it under gcc as well.
//
// Input: byte 0 is a control byte (bits 0-1: read sizes, all at once / one
// byte / 1-16 / 1-5000; bit 7: a custom allocator), the rest a byte stream.
// Checks beyond "no crash, no sanitizer report":
//   - nothing but ProtocolError escapes the reader, and its message starts
//     with "pipe frame: ";
//   - next_buffer() never offers an empty span;
//   - reading in fragments yields the same frames, the same error and the
//     same mid-frame state as reading everything at once;
//   - re-encoding the frames read reproduces the bytes they came from (the
//     encoding is canonical), all of them when the stream ended cleanly.
//
// Seeds: SB_PIPE_FRAME_FUZZ_SEEDS=DIR ./pipe_frame_fuzzer writes
// pipe_frame_fuzz_seeds() into DIR and exits.
#include "tests/agents/pipe/fuzz/frame_fuzzer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "agents/pipe/wire/frame.h"
#include "core/message.h"
#include "core/tensor.h"
#include "tests/agents/pipe/fuzz/fuzz_check.h"

using namespace switchboard;
using namespace switchboard::agents::pipe::wire;

namespace {

using Bytes = std::vector<uint8_t>;

FrameLimits small_limits() {
  FrameLimits limits;
  limits.max_function_length = 256;
  limits.max_payload_bytes = 64 * 1024;
  limits.max_tensors = 64;
  limits.max_tensor_bytes = 1 << 20;
  return limits;
}

struct Outcome {
  std::vector<InboundFrame> frames;
  std::string error;  // the ProtocolError's message; empty when none
  bool mid_frame = false;
};

// Reads the stream in reads of at most `max_read()` bytes.
template <typename MaxRead>
Outcome read_stream(const uint8_t* data, size_t size, bool custom_allocator,
                    MaxRead max_read) {
  FrameReader::Allocate allocate;
  if (custom_allocator) {
    allocate = [](DType dtype, const Tensor::Shape& shape, Device device) {
      FUZZ_CHECK(device.is_cpu() ? device.index == 0 : device.index >= 0);
      return Tensor::empty(shape, dtype);
    };
  }
  FrameReader reader(small_limits(), allocate);
  Outcome out;
  InboundFrame frame;
  size_t offset = 0;
  try {
    while (offset < size) {
      auto [buffer, capacity] = reader.next_buffer();
      FUZZ_CHECK(buffer != nullptr && capacity > 0);
      const size_t n = std::min({capacity, size - offset, max_read()});
      std::memcpy(buffer, data + offset, n);
      offset += n;
      reader.commit(n);
      while (reader.pop(frame)) out.frames.push_back(std::move(frame));
    }
    out.mid_frame = reader.mid_frame();
  } catch (const ProtocolError& e) {
    out.error = e.what();
    FUZZ_CHECK(out.error.rfind("pipe frame: ", 0) == 0);
    while (reader.pop(frame)) out.frames.push_back(std::move(frame));
    // A failed reader stays failed.
    bool refused = false;
    try {
      reader.next_buffer();
    } catch (const ProtocolError&) {
      refused = true;
    }
    FUZZ_CHECK(refused);
  }
  return out;
}

bool same_tensor(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();  // a channel's
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.device() == b.device() &&
         a.is_contiguous() && b.is_contiguous() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

bool same_frame(const InboundFrame& a, const InboundFrame& b) {
  if (a.kind != b.kind || a.message.type != b.message.type ||
      a.message.id != b.message.id || a.message.function != b.message.function ||
      a.message.payload != b.message.payload || a.devices != b.devices ||
      a.message.tensors.size() != b.message.tensors.size() ||
      a.channel_tensors.size() != b.channel_tensors.size()) {
    return false;
  }
  for (size_t i = 0; i < a.channel_tensors.size(); ++i) {
    const auto& x = a.channel_tensors[i];
    const auto& y = b.channel_tensors[i];
    if (x.index != y.index || x.dtype != y.dtype || x.shape != y.shape ||
        !(x.route == y.route)) {
      return false;
    }
  }
  for (size_t i = 0; i < a.message.tensors.size(); ++i) {
    if (!same_tensor(a.message.tensors[i], b.message.tensors[i])) return false;
  }
  return true;
}

// The frame as the agent would send it: header, body, tensor bytes.
void append_wire(Bytes& out, const InboundFrame& f) {
  if (f.kind >= FrameKind::kHello) {
    FUZZ_CHECK(f.message.tensors.empty() && f.message.function.empty());
    append_control_frame(out, f.kind, f.message.id, f.message.payload.data(),
                         f.message.payload.size());
    return;
  }
  FUZZ_CHECK(static_cast<uint8_t>(f.kind) == static_cast<uint8_t>(f.message.type));
  FUZZ_CHECK(f.devices.size() == f.message.tensors.size());
  // A tensor a channel carries is undefined in the frame: it is encoded
  // again as a stand-in of its dtype and shape, routed, with no bytes.
  rpc::Message m = f.message;
  std::vector<TensorRoute> routes;
  if (!f.channel_tensors.empty()) routes.resize(m.tensors.size());
  for (const InboundFrame::ChannelTensor& c : f.channel_tensors) {
    FUZZ_CHECK(c.index < m.tensors.size() && !m.tensors[c.index].defined());
    m.tensors[c.index] = Tensor::empty(c.shape, c.dtype);
    routes[c.index] = c.route;
  }
  append_frame(out, m, f.devices, routes);
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    if (!routes.empty() && routes[i].channel != TensorChannel::kInline) continue;
    const auto* p = static_cast<const uint8_t*>(m.tensors[i].data());
    out.insert(out.end(), p, p + m.tensors[i].nbytes());
  }
}

void check_reencoding(const Outcome& outcome, const uint8_t* data, size_t size) {
  Bytes again;
  for (const InboundFrame& f : outcome.frames) append_wire(again, f);
  FUZZ_CHECK(again.size() <= size);
  FUZZ_CHECK(again.empty() || std::memcmp(again.data(), data, again.size()) == 0);
  if (outcome.error.empty() && !outcome.mid_frame) FUZZ_CHECK(again.size() == size);
  if (!outcome.error.empty() || outcome.mid_frame) FUZZ_CHECK(again.size() < size);
}

// ---------------------------------------------------------------------------
// Seeds

Tensor pattern(DType dtype, const Tensor::Shape& shape, int seed) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* p = static_cast<uint8_t*>(t.data());
  for (size_t i = 0; i < t.nbytes(); ++i) {
    p[i] = static_cast<uint8_t>(dtype == DType::kBool ? (i + seed) & 1 : i * 31 + seed);
  }
  return t;
}

rpc::Message message(rpc::MessageType type, uint64_t id, std::string function,
                     Bytes payload, std::vector<Tensor> tensors = {}) {
  rpc::Message m;
  m.type = type;
  m.id = id;
  m.function = std::move(function);
  m.payload = std::move(payload);
  m.tensors = std::move(tensors);
  return m;
}

void append_message(Bytes& out, const rpc::Message& m,
                    const std::vector<Device>& devices = {}) {
  append_frame(out, m, devices);
  for (const Tensor& t : m.tensors) {
    const auto* p = static_cast<const uint8_t*>(t.data());
    out.insert(out.end(), p, p + t.nbytes());
  }
}

}  // namespace

std::vector<Bytes> pipe_frame_fuzz_seeds() {
  using rpc::MessageType;
  std::vector<Bytes> seeds;
  const Bytes hello = {0x82, 0xa4, 'n', 'a', 'm', 'e', 0xa2, 'w',
                       '0',  0xa4, 'r', 'a', 'n', 'k', 0x00};
  Bytes control = {0x00};
  append_control_frame(control, FrameKind::kHello, 0, hello.data(), hello.size());
  append_control_frame(control, FrameKind::kHeartbeat, 1);
  append_control_frame(control, FrameKind::kGoodbye, 2);
  const Bytes lane = {1, '/', 's', 'w', 'i', 't', 'c', 'h'};
  append_control_frame(control, FrameKind::kLane, 0, lane.data(), lane.size());
  const Bytes release = {2, 7, 0, 0, 0, 0, 0, 0, 0};
  append_control_frame(control, FrameKind::kChannel, 0, release.data(), release.size());
  seeds.push_back(control);

  // A response whose second tensor waits in the sender's outbox 7.
  Bytes routed = {0x02};
  {
    const rpc::Message m =
        message(MessageType::kResponse, 9, "", {0x01},
                {pattern(DType::kFloat32, {3}, 1), pattern(DType::kInt64, {2, 2}, 2)});
    append_frame(routed, m, {Device::cpu(), Device::cuda(0)},
                 {TensorRoute{}, TensorRoute{TensorChannel::kCudaIpc, 7, nullptr}});
    const auto* p = static_cast<const uint8_t*>(m.tensors[0].data());
    routed.insert(routed.end(), p, p + m.tensors[0].nbytes());
  }
  seeds.push_back(routed);

  Bytes request = {0x01};
  append_message(request, message(MessageType::kRequest, 7, "add", {0x92, 0x01, 0x02}));
  append_message(request, message(MessageType::kResponse, 7, "", {0x03}));
  append_message(request, message(MessageType::kError, 8, "", {0x93, 0xa1, 'e'}));
  seeds.push_back(request);

  std::vector<Tensor> every;
  int seed = 0;
  for (DType dtype : kAllDTypes) {
    every.push_back(pattern(dtype, {3}, ++seed));
    every.push_back(pattern(dtype, {2, 0, 3}, ++seed));
  }
  every.push_back(pattern(DType::kFloat32, {}, 1));
  every.push_back(pattern(DType::kInt64, {1, 2, 1, 2}, 2));
  Bytes tensors = {0x02};
  append_message(tensors, message(MessageType::kResponse, 9, "", {0xc0}, every));
  seeds.push_back(tensors);

  Bytes devices = {0x83};
  append_message(
      devices,
      message(MessageType::kRequest, 10, "to_gpu", {},
              {pattern(DType::kFloat16, {4}, 3), pattern(DType::kInt8, {2, 2}, 4)}),
      {Device::cuda(1), Device::cpu()});
  seeds.push_back(devices);

  Bytes large = {0x03};  // one tensor large enough to be read straight into
  append_message(large, message(MessageType::kResponse, 11, "", {},
                                {pattern(DType::kUInt8, {20 * 1024}, 5)}));
  append_control_frame(large, FrameKind::kHeartbeat, 12);
  seeds.push_back(large);

  Bytes many = {0x02};
  for (uint64_t id = 0; id < 20; ++id) {
    append_message(many,
                   message(MessageType::kRequest, id, "f", {static_cast<uint8_t>(id)},
                           {pattern(DType::kInt32, {static_cast<int64_t>(id % 3)}, 6)}));
  }
  seeds.push_back(many);

  Bytes truncated(tensors.begin(), tensors.end() - 5);
  truncated[0] = 0x01;
  seeds.push_back(truncated);

  Bytes bad = request;
  bad[1] = 'X';  // bad magic
  seeds.push_back(bad);
  return seeds;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dir = std::getenv("SB_PIPE_FRAME_FUZZ_SEEDS");
  if (dir == nullptr) return 0;
  const auto seeds = pipe_frame_fuzz_seeds();
  for (size_t i = 0; i < seeds.size(); ++i) {
    const std::string path = fmt::format("{}/seed_{}", dir, i);
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr ||
        std::fwrite(seeds[i].data(), 1, seeds[i].size(), f) != seeds[i].size()) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      std::exit(1);
    }
    std::fclose(f);
  }
  std::printf("wrote %zu seeds to %s\n", seeds.size(), dir);
  std::exit(0);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t control = data[0];
  ++data;
  --size;

  const Outcome whole = read_stream(data, size, false, [] { return SIZE_MAX; });
  check_reencoding(whole, data, size);

  uint32_t rng = control * 2654435761u + 1;
  auto next = [&rng](uint32_t bound) {
    rng = rng * 1103515245u + 12345u;
    return 1 + (rng >> 8) % bound;
  };
  const bool custom = control & 0x80;
  Outcome pieces;
  switch (control & 3) {
    case 0:
      pieces = read_stream(data, size, custom, [] { return SIZE_MAX; });
      break;
    case 1:
      pieces = read_stream(data, size, custom, [] { return size_t{1}; });
      break;
    case 2:
      pieces = read_stream(data, size, custom, [&] { return size_t{next(16)}; });
      break;
    default:
      pieces = read_stream(data, size, custom, [&] { return size_t{next(5000)}; });
      break;
  }
  FUZZ_CHECK(pieces.error == whole.error);
  FUZZ_CHECK(pieces.mid_frame == whole.mid_frame);
  FUZZ_CHECK(pieces.frames.size() == whole.frames.size());
  for (size_t i = 0; i < whole.frames.size(); ++i) {
    FUZZ_CHECK(same_frame(pieces.frames[i], whole.frames[i]));
  }
  return 0;
}
