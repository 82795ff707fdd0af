#include "agents/process_group/frame.h"

#include <fmt/format.h>

#include <cstring>
#include <new>
#include <string>

#include "agents/process_group/wire.h"
#include "core/tensor_descriptor.h"

namespace switchboard::agents::process_group::wire {
namespace {

class Writer {
 public:
  explicit Writer(uint8_t* out) : out_(out) {}
  void u8(uint8_t v) { out_[pos_++] = v; }
  void u16(uint16_t v) { little(v, 2); }
  void u32(uint32_t v) { little(v, 4); }
  void u64(uint64_t v) { little(v, 8); }
  void bytes(const void* data, size_t n) {
    if (n > 0) std::memcpy(out_ + pos_, data, n);
    pos_ += n;
  }
  size_t pos() const { return pos_; }

 private:
  void little(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_[pos_++] = static_cast<uint8_t>(v >> (8 * i));
  }
  uint8_t* out_;
  size_t pos_ = 0;
};

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t u8() { return static_cast<uint8_t>(little(1)); }
  uint16_t u16() { return static_cast<uint16_t>(little(2)); }
  uint32_t u32() { return static_cast<uint32_t>(little(4)); }
  uint64_t u64() { return little(8); }
  const uint8_t* take(size_t n, const char* what) {
    if (n > size_ - pos_) {
      throw ProtocolError(
          fmt::format("{} needs {} bytes, {} left", what, n, size_ - pos_));
    }
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }

 private:
  uint64_t little(int n) {
    const uint8_t* p = take(static_cast<size_t>(n), "an integer");
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= uint64_t{p[i]} << (8 * i);
    return v;
  }
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// A header size over its limit.
void check_size(const Header& h, const char* field, uint64_t value, uint64_t limit) {
  if (value > limit) {
    throw ProtocolError(
        fmt::format("message {}: sizes out of range: {} {} exceeds the limit {}", h.id,
                    field, value, limit));
  }
}

}  // namespace

uint8_t* bytes_of(const Tensor& t) { return static_cast<uint8_t*>(t.data()); }

// The header and the body of `m` (body undefined when empty).
std::pair<Tensor, Tensor> encode_frame(const Message& m) {
  Header h;
  h.type = m.type;
  h.id = m.id;
  h.function_length = static_cast<uint32_t>(m.function.size());
  h.tensor_count = static_cast<uint32_t>(m.tensors.size());
  h.payload_length = m.payload.size();
  h.descriptors_length = descriptors_length(m.tensors, {}, "process_group encode_frame");
  if (m.type == MessageType::kRequest && m.timeout_ms != 0) h.flags = kFlagTimeout;

  Tensor header = Tensor::empty({static_cast<int64_t>(wire::kHeaderSize)}, DType::kUInt8);
  Writer w(bytes_of(header));
  w.u32(wire::kMagic);
  w.u8(wire::kVersion);
  w.u8(static_cast<uint8_t>(h.type));
  w.u16(h.flags);
  w.u64(h.id);
  w.u32(h.function_length);
  w.u32(h.tensor_count);
  w.u64(h.payload_length);
  w.u64(h.descriptors_length);

  Tensor body;
  if (h.body_length() > 0) {
    body = Tensor::empty({static_cast<int64_t>(h.body_length())}, DType::kUInt8);
    Writer b(bytes_of(body));
    if (h.flags & kFlagTimeout) b.u64(m.timeout_ms);
    b.bytes(m.function.data(), m.function.size());
    b.bytes(m.payload.data(), m.payload.size());
    encode_descriptors(bytes_of(body) + b.pos(), m.tensors, {});
  }
  return {header, body};
}

Header decode_header(const Tensor& header) {
  Reader r(bytes_of(header), wire::kHeaderSize);
  const uint32_t magic = r.u32();
  if (magic != wire::kMagic) {
    throw ProtocolError(
        fmt::format("bad magic {:#010x} (expected {:#010x})", magic, wire::kMagic));
  }
  const uint8_t version = r.u8();
  if (version != wire::kVersion) {
    throw ProtocolError(
        fmt::format("unsupported version {} (expected {})", version, wire::kVersion));
  }
  const uint8_t type = r.u8();
  if (type < static_cast<uint8_t>(MessageType::kRequest) ||
      type > static_cast<uint8_t>(MessageType::kCancel)) {
    throw ProtocolError(fmt::format("unknown message type {}", type));
  }
  const uint16_t flags = r.u16();
  const uint16_t allowed = type == static_cast<uint8_t>(MessageType::kRequest) ? kFlagTimeout : 0;
  if ((flags & ~allowed) != 0) {
    throw ProtocolError(fmt::format("flags {:#06x} on a message of type {} (allowed: {:#06x})",
                                    flags, type, allowed));
  }
  Header h;
  h.type = static_cast<MessageType>(type);
  h.flags = flags;
  h.id = r.u64();
  h.function_length = r.u32();
  h.tensor_count = r.u32();
  h.payload_length = r.u64();
  h.descriptors_length = r.u64();
  if (h.type == MessageType::kCancel &&
      (h.function_length | h.tensor_count | h.payload_length | h.descriptors_length) != 0) {
    throw ProtocolError(fmt::format(
        "message {}: a cancel carries nothing, got function length {}, tensor count {}, "
        "payload length {}, descriptors length {}",
        h.id, h.function_length, h.tensor_count, h.payload_length, h.descriptors_length));
  }
  check_size(h, "function length", h.function_length, wire::kMaxFunctionLength);
  check_size(h, "payload length", h.payload_length, kMaxPayloadLength);
  check_size(h, "tensor count", h.tensor_count, kMaxTensorsPerMessage);
  check_descriptors_length(h.descriptors_length, h.tensor_count,
                           fmt::format("message {}", h.id));
  return h;
}

// Allocates `count` bytes or throws ProtocolError (the size came from a peer).
Tensor allocate(const Tensor::Shape& shape, DType dtype) {
  try {
    return Tensor::empty(shape, dtype);
  } catch (const std::bad_alloc&) {
    throw ProtocolError(fmt::format("cannot allocate a {} tensor of shape {}",
                                    dtype_name(dtype), shape_str(shape)));
  } catch (const std::invalid_argument& e) {
    throw ProtocolError(e.what());
  }
}

// Fills m.function, m.payload and m.tensors (allocated, not yet received).
void decode_body(const Header& h, const Tensor& body, Message& m) {
  Reader r(body.defined() ? bytes_of(body) : nullptr, h.body_length());
  m.timeout_ms = (h.flags & kFlagTimeout) ? r.u64() : 0;
  if ((h.flags & kFlagTimeout) && m.timeout_ms == 0) {
    throw ProtocolError(fmt::format(
        "message {}: flagged with a timeout of 0 ms (none is sent unflagged)", h.id));
  }
  const uint8_t* function = r.take(h.function_length, "the function name");
  m.function.assign(reinterpret_cast<const char*>(function), h.function_length);
  const uint8_t* payload = r.take(h.payload_length, "the payload");
  m.payload.assign(payload, payload + h.payload_length);
  const uint8_t* descriptors = r.take(h.descriptors_length, "the descriptors");
  const std::vector<TensorDescriptor> all = decode_descriptors(
      descriptors, h.descriptors_length, h.tensor_count,
      {.label = "message", .id = h.id, .devices = AllowedDevices::kCpuOnly});
  m.tensors.reserve(all.size());
  for (const TensorDescriptor& d : all) m.tensors.push_back(allocate(d.shape(), d.dtype));
}

}  // namespace switchboard::agents::process_group::wire
