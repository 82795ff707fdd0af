#include "agents/pipe/wire/frame.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>

#include "common/check.h"
#include "core/little_endian.h"

namespace switchboard::agents::pipe::wire {
namespace {

// A tensor remainder smaller than this is read through the buffer (with
// whatever follows it) rather than straight into the tensor.
constexpr size_t kDirectReadMin = 16 * 1024;
// A buffer grown past this for a large body is given back once it is empty.
constexpr size_t kMaxRetainedBuffer = 1 << 20;

void check_kind_rules(const FrameHeader& h) {
  auto must_be_zero = [&](const char* field, uint32_t value) {
    if (value != 0) {
      throw ProtocolError(fmt::format("pipe frame: {} frame {} has {} {} (must be 0)",
                                   kind_name(h.kind), h.id, field, value));
    }
  };
  switch (h.kind) {
    case FrameKind::kRequest:
      if (h.function_length == 0) {
        throw ProtocolError(fmt::format(
            "pipe frame: request frame {} has function_length 0 (a request names its "
            "function)",
            h.id));
      }
      break;
    case FrameKind::kResponse:
    case FrameKind::kError:
      must_be_zero("function_length", h.function_length);
      break;
    case FrameKind::kHello:
    case FrameKind::kLane:
    case FrameKind::kChannel:
      must_be_zero("tensor_count", h.tensor_count);
      must_be_zero("function_length", h.function_length);
      break;
    case FrameKind::kHeartbeat:
    case FrameKind::kGoodbye:
    case FrameKind::kCancel:
      must_be_zero("tensor_count", h.tensor_count);
      must_be_zero("function_length", h.function_length);
      must_be_zero("payload_length", h.payload_length);
      break;
  }
}

// Validates every descriptor and the sum of the tensor bytes against the
// limits, without allocating any tensor.
std::vector<TensorDescriptor> check_descriptors(const FrameHeader& h,
                                                const uint8_t* descriptors,
                                                const FrameLimits& limits) {
  std::vector<TensorDescriptor> all =
      decode_descriptors(descriptors, h.descriptors_length, h.tensor_count,
                         {.label = "pipe frame: frame", .id = h.id});
  uint64_t total = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const uint64_t nbytes = all[i].nbytes;
    if (__builtin_add_overflow(total, nbytes, &total) ||
        total > limits.max_tensor_bytes) {
      throw ProtocolError(fmt::format(
          "pipe frame: frame {}: tensor bytes {} (the sum through tensor {}) exceed the "
          "limit {} (max_tensor_bytes)",
          h.id, std::max(total, nbytes), i, limits.max_tensor_bytes));
    }
  }
  return all;
}

FrameKind kind_of(rpc::MessageType type) {
  const auto value = static_cast<uint8_t>(type);
  SB_REQUIRE(value >= 1 && value <= 3, "append_frame: {} is not a message type", value);
  return static_cast<FrameKind>(value);
}

uint32_t checked_u32(size_t value, const char* what) {
  SB_REQUIRE(value <= std::numeric_limits<uint32_t>::max(),
             "append_frame: {} {} does not fit the frame's u32 field", what, value);
  return static_cast<uint32_t>(value);
}

uint8_t* write_bytes(uint8_t* p, const void* data, size_t n) {
  if (n > 0) std::memcpy(p, data, n);
  return p + n;
}

// magic, version, kind, flags.
void check_fixed_fields(const uint8_t* in) {
  const auto magic = load_le<uint32_t>(in);
  if (magic != kMagic) {
    throw ProtocolError(fmt::format(
        "pipe frame: bad magic {:#010x} (expected {:#010x}, \"SBPI\")", magic, kMagic));
  }
  if (in[4] != kVersion) {
    throw ProtocolError(fmt::format("pipe frame: version {} is not supported (expected {})",
                                 in[4], kVersion));
  }
  if (in[5] < 1 || in[5] > 9) {
    throw ProtocolError(
        fmt::format("pipe frame: kind {} is not a frame kind (1 to 9)", in[5]));
  }
  const auto flags = load_le<uint16_t>(in + 6);
  const uint16_t allowed =
      in[5] == static_cast<uint8_t>(FrameKind::kRequest) ? kFlagTimeout | kFlagChannel
      : in[5] <= static_cast<uint8_t>(FrameKind::kError) ? kFlagChannel
                                                          : 0;
  if ((flags & ~allowed) != 0) {
    throw ProtocolError(fmt::format("pipe frame: flags {:#06x} on a {} frame (allowed: {:#06x})",
                                    flags, kind_name(static_cast<FrameKind>(in[5])), allowed));
  }
}

void check_lengths(const FrameHeader& h, const FrameLimits& limits) {
  if (h.function_length > limits.max_function_length) {
    throw ProtocolError(fmt::format(
        "pipe frame: function_length {} exceeds the limit {} (max_function_length)",
        h.function_length, limits.max_function_length));
  }
  if (h.payload_length > limits.max_payload_bytes) {
    throw ProtocolError(fmt::format(
        "pipe frame: payload_length {} exceeds the limit {} (max_payload_bytes)",
        h.payload_length, limits.max_payload_bytes));
  }
  // The option may lower the shared maximum, never raise it.
  const uint32_t max_tensors = std::min(limits.max_tensors, kMaxTensorsPerMessage);
  if (h.tensor_count > max_tensors) {
    throw ProtocolError(fmt::format(
        "pipe frame: tensor_count {} exceeds the limit {} ({})", h.tensor_count,
        max_tensors,
        max_tensors == limits.max_tensors ? "max_tensors" : "kMaxTensorsPerMessage"));
  }
  check_descriptors_length(h.descriptors_length, h.tensor_count, "pipe frame");
}

}  // namespace

std::string kind_name(FrameKind kind) {
  switch (kind) {
    case FrameKind::kRequest:
      return "request";
    case FrameKind::kResponse:
      return "response";
    case FrameKind::kError:
      return "error";
    case FrameKind::kHello:
      return "hello";
    case FrameKind::kHeartbeat:
      return "heartbeat";
    case FrameKind::kGoodbye:
      return "goodbye";
    case FrameKind::kCancel:
      return "cancel";
    case FrameKind::kLane:
      return "lane";
    case FrameKind::kChannel:
      return "channel";
  }
  return fmt::format("kind {}", static_cast<int>(kind));
}

size_t frame_size(const rpc::Message& m) {
  size_t bytes = kHeaderSize + m.function.size() + m.payload.size();
  if (m.type == rpc::MessageType::kRequest && m.timeout_ms != 0) bytes += 8;
  for (const Tensor& t : m.tensors) {
    if (!t.defined()) continue;
    bytes += descriptor_size(static_cast<size_t>(t.dim())) + t.nbytes();
  }
  return bytes;
}

size_t FrameHeader::body_size() const {
  return ((flags & kFlagTimeout) ? 8 : 0) + size_t{function_length} + payload_length +
         descriptors_length + ((flags & kFlagChannel) ? size_t{tensor_count} * kRouteSize : 0);
}

void encode_header(const FrameHeader& h, uint8_t* out) {
  store_le<uint32_t>(out, kMagic);
  out[4] = kVersion;
  out[5] = static_cast<uint8_t>(h.kind);
  store_le<uint16_t>(out + 6, h.flags);
  store_le<uint64_t>(out + 8, h.id);
  store_le<uint32_t>(out + 16, h.function_length);
  store_le<uint32_t>(out + 20, h.payload_length);
  store_le<uint32_t>(out + 24, h.tensor_count);
  store_le<uint32_t>(out + 28, h.descriptors_length);
}

FrameHeader decode_header(const uint8_t* in, const FrameLimits& limits) {
  check_fixed_fields(in);
  FrameHeader h;
  h.kind = static_cast<FrameKind>(in[5]);
  h.flags = load_le<uint16_t>(in + 6);
  h.id = load_le<uint64_t>(in + 8);
  h.function_length = load_le<uint32_t>(in + 16);
  h.payload_length = load_le<uint32_t>(in + 20);
  h.tensor_count = load_le<uint32_t>(in + 24);
  h.descriptors_length = load_le<uint32_t>(in + 28);
  check_lengths(h, limits);
  check_kind_rules(h);
  return h;
}

void append_frame(std::vector<uint8_t>& out, const rpc::Message& m,
                  const std::vector<Device>& devices, const std::vector<TensorRoute>& routes) {
  FrameHeader h;
  h.kind = kind_of(m.type);
  h.id = m.id;
  SB_REQUIRE(h.kind != FrameKind::kRequest || !m.function.empty(),
             "append_frame: request {} has no function", m.id);
  SB_REQUIRE(h.kind == FrameKind::kRequest || m.function.empty(),
             "append_frame: {} {} has a function (\"{}\"); only requests name one",
             kind_name(h.kind), m.id, m.function);
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const Tensor& t = m.tensors[i];
    SB_REQUIRE(t.defined(), "append_frame: tensor {} is undefined", i);
    SB_REQUIRE(t.is_contiguous(), "append_frame: tensor {} ({}) is not contiguous", i,
               t.describe());
  }
  const size_t descriptors = descriptors_length(m.tensors, devices, "append_frame");
  h.function_length = checked_u32(m.function.size(), "function_length");
  h.payload_length = checked_u32(m.payload.size(), "payload_length");
  h.tensor_count = checked_u32(m.tensors.size(), "tensor_count");
  h.descriptors_length = checked_u32(descriptors, "descriptors_length");
  if (h.kind == FrameKind::kRequest && m.timeout_ms != 0) h.flags = kFlagTimeout;
  SB_REQUIRE(routes.empty() || routes.size() == m.tensors.size(),
             "append_frame: {} routes for {} tensors", routes.size(), m.tensors.size());
  const bool routed = std::any_of(routes.begin(), routes.end(), [](const TensorRoute& r) {
    return r.channel != TensorChannel::kInline;
  });
  if (routed) h.flags |= kFlagChannel;

  const size_t start = out.size();
  out.resize(start + kHeaderSize + h.body_size());
  uint8_t* p = out.data() + start;
  encode_header(h, p);
  p += kHeaderSize;
  if (h.flags & kFlagTimeout) {
    store_le<uint64_t>(p, m.timeout_ms);
    p += 8;
  }
  p = write_bytes(p, m.function.data(), m.function.size());
  p = write_bytes(p, m.payload.data(), m.payload.size());
  p = encode_descriptors(p, m.tensors, devices);
  if (routed) {
    for (const TensorRoute& r : routes) {
      std::memset(p, 0, kRouteSize);
      p[0] = static_cast<uint8_t>(r.channel);
      store_le<uint64_t>(p + 8, r.buffer);
      p += kRouteSize;
    }
  }
}

void append_control_frame(std::vector<uint8_t>& out, FrameKind kind, uint64_t id,
                          const uint8_t* payload, size_t payload_size) {
  SB_REQUIRE(kind == FrameKind::kHello || kind == FrameKind::kHeartbeat ||
                 kind == FrameKind::kGoodbye || kind == FrameKind::kCancel ||
                 kind == FrameKind::kLane || kind == FrameKind::kChannel,
             "append_control_frame: {} is not a control frame", kind_name(kind));
  SB_REQUIRE(kind == FrameKind::kHello || kind == FrameKind::kLane ||
                 kind == FrameKind::kChannel || payload_size == 0,
             "append_control_frame: a {} frame has no payload ({} bytes given)",
             kind_name(kind), payload_size);
  SB_REQUIRE(payload != nullptr || payload_size == 0,
             "append_control_frame: null payload of {} bytes", payload_size);
  FrameHeader h;
  h.kind = kind;
  h.id = id;
  h.payload_length = checked_u32(payload_size, "payload_length");
  const size_t start = out.size();
  out.resize(start + kHeaderSize + payload_size);
  encode_header(h, out.data() + start);
  write_bytes(out.data() + start + kHeaderSize, payload, payload_size);
}

// ---------------------------------------------------------------------------
// FrameReader

FrameReader::FrameReader(FrameLimits limits, Allocate allocate)
    : limits_(limits), allocate_(std::move(allocate)) {}

void FrameReader::check_usable() const {
  if (!failure_.empty()) throw ProtocolError(failure_);
}

void FrameReader::fail(const std::string& message) {
  failure_ = message;
  throw ProtocolError(message);
}

std::pair<uint8_t*, size_t> FrameReader::next_buffer() {
  check_usable();
  if (state_ == State::kTensors && tensor_size_ - tensor_filled_ >= kDirectReadMin) {
    // The buffer is empty here (parse() drains it into the tensor).
    offered_ = tensor_size_ - tensor_filled_;
    offered_tensor_ = true;
    return {tensor_data_ + tensor_filled_, offered_};
  }
  make_room();
  offered_ = buffer_.size() - end_;
  offered_tensor_ = false;
  return {buffer_.data() + end_, offered_};
}

// Ensures kReadBufferSize free bytes after end_, and room for more of the
// current frame's body: the rest of it, but never more than the body bytes
// that already came (at least kReadBufferSize). A header that announces a
// large body (a peer may send anything, also before its hello) costs
// memory only as the body's bytes arrive; the room doubles, so a large body
// is moved a bounded number of times per byte.
void FrameReader::make_room() {
  size_t need = kReadBufferSize;
  if (state_ == State::kBody) {
    const size_t have = end_ - begin_;
    const size_t rest = header_.body_size() - have;
    need = std::max(need, std::min(rest, std::max(have, kReadBufferSize)));
  }
  if (buffer_.size() - end_ >= need) return;
  if (begin_ > 0) {
    std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  if (buffer_.size() - end_ >= need) return;
  try {
    buffer_.resize(end_ + need);
  } catch (const std::bad_alloc&) {
    fail(fmt::format("pipe frame: cannot allocate a {}-byte buffer for frame {}'s body",
                     end_ + need, header_.id));
  }
}

void FrameReader::commit(size_t n) {
  check_usable();
  SB_REQUIRE(n <= offered_, "FrameReader::commit: {} bytes committed, {} offered", n,
             offered_);
  offered_ = 0;
  try {
    if (offered_tensor_) {
      tensor_filled_ += n;
      if (progress_ && n > 0) progress_(current_.message.tensors[tensor_index_], tensor_filled_);
      if (tensor_filled_ == tensor_size_ && !next_tensor()) finish_frame();
    } else {
      end_ += n;
    }
    parse();
  } catch (const ProtocolError& e) {
    failure_ = e.what();
    throw;
  } catch (const std::bad_alloc&) {
    fail(
        fmt::format("pipe frame: out of memory receiving frame {} ({} body bytes, {} "
                    "tensors)",
                    header_.id, header_.body_size(), header_.tensor_count));
  } catch (const std::exception& e) {
    failure_ = fmt::format("pipe frame: the reader failed earlier: {}", e.what());
    throw;
  }
}

void FrameReader::parse() {
  for (;;) {
    switch (state_) {
      case State::kHeader: {
        if (end_ - begin_ < kHeaderSize) {
          if (begin_ == end_) begin_ = end_ = 0;
          if (begin_ == 0 && end_ == 0 && buffer_.size() > kMaxRetainedBuffer) {
            std::vector<uint8_t>().swap(buffer_);
          }
          return;
        }
        if (trusted_ && trusted_()) trusted_ = nullptr;
        if (trusted_ == nullptr) {
          header_ = decode_header(buffer_.data() + begin_, limits_);
        } else {
          // A stranger: one frame at a time, and a small one.
          if (ready_head_ < ready_.size()) {
            held_ = true;
            return;
          }
          FrameLimits stranger = limits_;
          stranger.max_payload_bytes = std::min(limits_.max_payload_bytes, kMaxStrangerFrameBytes);
          stranger.max_tensors = 0;
          try {
            header_ = decode_header(buffer_.data() + begin_, stranger);
          } catch (const ProtocolError& e) {
            throw ProtocolError(fmt::format(
                "{} (before the peer proved who it is, a frame may carry {} payload bytes "
                "and no tensors)",
                e.what(), kMaxStrangerFrameBytes));
          }
        }
        begin_ += kHeaderSize;
        state_ = State::kBody;
        [[fallthrough]];
      }
      case State::kBody:
        if (end_ - begin_ < header_.body_size()) return;
        decode_body(buffer_.data() + begin_);
        begin_ += header_.body_size();
        if (!first_tensor()) {
          finish_frame();
          continue;
        }
        state_ = State::kTensors;
        [[fallthrough]];
      case State::kTensors:
        if (!fill_tensors_from_buffer()) {
          begin_ = end_ = 0;  // drained into the tensor
          return;
        }
        finish_frame();
        continue;
    }
  }
}

void FrameReader::decode_body(const uint8_t* body) {
  rpc::Message& m = current_.message;
  current_.kind = header_.kind;
  m.type = header_.kind <= FrameKind::kError ? static_cast<rpc::MessageType>(header_.kind)
                                             : rpc::MessageType::kRequest;
  m.id = header_.id;
  m.timeout_ms = 0;
  if (header_.flags & kFlagTimeout) {
    m.timeout_ms = load_le<uint64_t>(body);
    body += 8;
    // One encoding per message: no timeout is no flag.
    if (m.timeout_ms == 0) {
      throw ProtocolError(fmt::format(
          "pipe frame: request {} is flagged with a timeout of 0 ms (none is sent unflagged)",
          header_.id));
    }
  }
  m.function.assign(reinterpret_cast<const char*>(body), header_.function_length);
  body += header_.function_length;
  m.payload.assign(body, body + header_.payload_length);
  body += header_.payload_length;
  m.tensors.clear();
  current_.devices.clear();
  current_.channel_tensors.clear();
  if (header_.tensor_count > 0) {
    std::vector<TensorDescriptor> descriptors = check_descriptors(header_, body, limits_);
    body += header_.descriptors_length;
    std::vector<TensorRoute> routes;
    if (header_.flags & kFlagChannel) routes = decode_routes(body);
    allocate_tensors(descriptors, routes);
  } else if (header_.flags & kFlagChannel) {
    throw ProtocolError(fmt::format(
        "pipe frame: {} frame {} is flagged with routes but carries no tensors",
        kind_name(header_.kind), header_.id));
  }
}

std::vector<TensorRoute> FrameReader::decode_routes(const uint8_t* p) const {
  std::vector<TensorRoute> routes(header_.tensor_count);
  bool routed = false;
  for (size_t i = 0; i < routes.size(); ++i, p += kRouteSize) {
    if (p[0] > static_cast<uint8_t>(TensorChannel::kCudaIpc)) {
      throw ProtocolError(fmt::format("pipe frame: frame {} tensor {}: channel {} is not a "
                                      "channel (0 inline, 1 cuda_ipc)",
                                      header_.id, i, p[0]));
    }
    for (size_t b = 1; b < 8; ++b) {
      if (p[b] != 0) {
        throw ProtocolError(fmt::format(
            "pipe frame: frame {} tensor {}: route byte {} is {:#04x} (must be 0)",
            header_.id, i, b, p[b]));
      }
    }
    routes[i].channel = static_cast<TensorChannel>(p[0]);
    routes[i].buffer = load_le<uint64_t>(p + 8);
    if (routes[i].channel == TensorChannel::kInline && routes[i].buffer != 0) {
      throw ProtocolError(fmt::format(
          "pipe frame: frame {} tensor {}: an inline route names buffer {} (must be 0)",
          header_.id, i, routes[i].buffer));
    }
    routed = routed || routes[i].channel != TensorChannel::kInline;
  }
  // One encoding per message: no channel is no flag.
  if (!routed) {
    throw ProtocolError(fmt::format(
        "pipe frame: frame {} is flagged with routes but every tensor is inline (none is "
        "sent flagged)",
        header_.id));
  }
  return routes;
}

void FrameReader::allocate_tensors(const std::vector<TensorDescriptor>& descriptors,
                                   const std::vector<TensorRoute>& routes) {
  rpc::Message& m = current_.message;
  m.tensors.reserve(descriptors.size());
  current_.devices.reserve(descriptors.size());
  for (size_t i = 0; i < descriptors.size(); ++i) {
    const TensorDescriptor& d = descriptors[i];
    d.shape_into(shape_);
    current_.devices.push_back(d.device);
    if (!routes.empty() && routes[i].channel != TensorChannel::kInline) {
      m.tensors.emplace_back();  // a channel brings it
      current_.channel_tensors.push_back({i, d.dtype, shape_, routes[i]});
      continue;
    }
    m.tensors.push_back(allocate_tensor(d.dtype, d.device));
  }
}

Tensor FrameReader::allocate_tensor(DType dtype, Device device) {
  if (!allocate_) return Tensor::empty(shape_, dtype);
  Tensor t = allocate_(dtype, shape_, device);
  SB_REQUIRE(
      t.defined() && t.dtype() == dtype && t.shape() == shape_ && t.is_contiguous() &&
          t.device().is_cpu(),
      "FrameReader: the allocator returned {} for a contiguous CPU {}{} (descriptor "
      "device {})",
      t.describe(), dtype_name(dtype), shape_str(shape_), device.str());
  return t;
}

// Points tensor_* at the first tensor with bytes; false when none has any.
bool FrameReader::first_tensor() {
  tensor_index_ = static_cast<size_t>(-1);
  return next_tensor();
}

// Moves on to the next tensor with bytes; false when there is none.
bool FrameReader::next_tensor() {
  ++tensor_index_;
  const auto& tensors = current_.message.tensors;
  while (tensor_index_ < tensors.size() &&
         (!tensors[tensor_index_].defined() || tensors[tensor_index_].nbytes() == 0)) {
    ++tensor_index_;
  }
  if (tensor_index_ == tensors.size()) return false;
  const Tensor& t = tensors[tensor_index_];
  tensor_data_ = static_cast<uint8_t*>(t.data());
  tensor_size_ = t.nbytes();
  tensor_filled_ = 0;
  return true;
}

// Copies buffered bytes into the tensors; true once the last one is full.
bool FrameReader::fill_tensors_from_buffer() {
  while (begin_ < end_) {
    const size_t n = std::min(end_ - begin_, tensor_size_ - tensor_filled_);
    std::memcpy(tensor_data_ + tensor_filled_, buffer_.data() + begin_, n);
    begin_ += n;
    tensor_filled_ += n;
    if (progress_ && n > 0) progress_(current_.message.tensors[tensor_index_], tensor_filled_);
    if (tensor_filled_ == tensor_size_ && !next_tensor()) return true;
  }
  return false;
}

void FrameReader::finish_frame() {
  if (ready_head_ == ready_.size()) {
    ready_.clear();
    ready_head_ = 0;
  } else if (ready_head_ >= 64 && ready_head_ * 2 >= ready_.size()) {
    ready_.erase(ready_.begin(), ready_.begin() + static_cast<ptrdiff_t>(ready_head_));
    ready_head_ = 0;
  }
  ready_.push_back(std::move(current_));
  state_ = State::kHeader;
  tensor_data_ = nullptr;
  tensor_size_ = tensor_filled_ = 0;
}

void FrameReader::set_trust(std::function<bool()> trusted) { trusted_ = std::move(trusted); }

bool FrameReader::pop(InboundFrame& out) {
  if (ready_head_ == ready_.size()) {
    if (!held_) return false;
    // The stranger's next frame, parsed now that the last one was handled.
    held_ = false;
    check_usable();
    try {
      parse();
    } catch (const ProtocolError& e) {
      failure_ = e.what();
      throw;
    } catch (const std::bad_alloc&) {
      fail(fmt::format("pipe frame: out of memory receiving frame {}", header_.id));
    }
    if (ready_head_ == ready_.size()) return false;
  }
  out = std::move(ready_[ready_head_++]);
  if (ready_head_ == ready_.size()) {
    ready_.clear();
    ready_head_ = 0;
  }
  return true;
}

bool FrameReader::mid_frame() const { return state_ != State::kHeader || end_ > begin_; }

std::vector<InboundFrame> decode_all(const uint8_t* data, size_t size,
                                     const FrameLimits& limits) {
  FrameReader reader(limits);
  std::vector<InboundFrame> frames;
  InboundFrame frame;
  size_t offset = 0;
  while (offset < size) {
    auto [buffer, capacity] = reader.next_buffer();
    const size_t n = std::min(capacity, size - offset);
    std::memcpy(buffer, data + offset, n);
    offset += n;
    reader.commit(n);
    while (reader.pop(frame)) frames.push_back(std::move(frame));
  }
  if (reader.mid_frame()) {
    throw ProtocolError(
        fmt::format("pipe frame: truncated: the {} bytes end inside a frame (after {} "
                    "complete frames)",
                    size, frames.size()));
  }
  return frames;
}

}  // namespace switchboard::agents::pipe::wire
