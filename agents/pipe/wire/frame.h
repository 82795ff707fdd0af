// The PIPE agent's wire codec: how a Message (or a control frame) becomes
// bytes on a connection, and an incremental reader that turns received
// bytes back into frames, reading large tensors straight into their
// destination. Pure code: no sockets, no threads.
//
// Wire format (every integer little endian):
//
//   header, kHeaderSize = 32 bytes
//     u32 magic = kMagic ("SBPI" in memory)   u8 version = kVersion
//     u8  kind (FrameKind)                    u16 flags (kFlagTimeout or 0)
//     u64 id
//     u32 function_length   u32 payload_length
//     u32 tensor_count      u32 descriptors_length
//   body, FrameHeader::body_size() bytes
//     with kFlagTimeout (requests): u64 timeout_ms first;
//     function bytes, payload bytes, then the tensor descriptors, one per
//     tensor (core/tensor_descriptor.h: dtype, device, ndim, extents;
//     descriptor_size(ndim) = 8 + 8 * ndim bytes), descriptors_length bytes;
//     with kFlagChannel (requests, responses, errors): one route record per
//     tensor, kRouteSize = 16 bytes each: u8 channel (0: the bytes follow
//     in this frame; 1: cuda_ipc, they wait in the sender's outbox
//     `buffer`), 7 zero bytes, u64 buffer
//   then each tensor's bytes in order, numel x element size; a tensor of
//   zero bytes, or one a channel carries, sends nothing.
//
// Frame kinds: kRequest, kResponse and kError carry a Message of the
// MessageType with the same value. A request names its function; a response
// or an error has none. kHello carries opaque bytes in its payload (what the
// agent wants to say on connecting) and no function, as does kLane (the
// same-host lane's offer, answer or switch); kHeartbeat and kGoodbye have
// no body at all. kChannel carries the channels' own messages in its payload
// (agents/pipe/channel/channel.h: the channel's tag, then its message). Only
// request/response/error carry tensors.
//
// Errors: bad bytes from a peer throw ProtocolError (common/error.h), whose message
// names the field, its value and the limit it broke; the reader that threw
// is unusable and the connection should be closed. Local mistakes (a
// non-contiguous tensor to encode, a commit larger than the buffer offered,
// an allocator that returns the wrong tensor) throw std::invalid_argument.
//
// Thread safety: the free functions are pure and thread-safe; a FrameReader
// is used by one thread at a time (one connection's reads are serialized).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/error.h"
#include "core/message.h"
#include "core/tensor.h"
#include "core/tensor_descriptor.h"

namespace switchboard::agents::pipe::wire {

inline constexpr uint32_t kMagic = 0x49504253;  // bytes 53 42 50 49: "SBPI"
inline constexpr uint8_t kVersion = 1;
inline constexpr size_t kHeaderSize = 32;
// Free space FrameReader::next_buffer() offers at least when header or
// body bytes are expected (one read can bring many small frames).
inline constexpr size_t kReadBufferSize = 64 * 1024;

enum class FrameKind : uint8_t {
  kRequest = 1,   // rpc::MessageType::kRequest
  kResponse = 2,  // rpc::MessageType::kResponse
  kError = 3,     // rpc::MessageType::kError
  kHello = 4,     // payload: the agent's hello (opaque here)
  kHeartbeat = 5,
  kGoodbye = 6,
  kCancel = 7,  // no body; id: a request of the sender's it cancels
  kLane = 8,  // payload: the same-host lane's negotiation (pipe/transport/shm/shm_lane.h)
  kChannel = 9,  // payload: a tensor channel's message (pipe/channel/)
};

// "request", "response", "error", "hello", "heartbeat", "goodbye", "cancel", "lane" (or
// "kind N" for other values).
std::string kind_name(FrameKind kind);

// What a receiver accepts; anything larger is a ProtocolError. Defaults suit
// the agent; the fuzzer and tests use smaller ones.
// The tensor descriptors' own limits (kMaxTensorDims, kMaxTensorsPerMessage
// in core/tensor_descriptor.h) are the same for every format and apply
// whatever these say.
struct FrameLimits {
  uint32_t max_function_length = 64 * 1024;
  uint64_t max_payload_bytes = 1ull << 30;
  // At most kMaxTensorsPerMessage: a larger value counts as that.
  uint32_t max_tensors = kMaxTensorsPerMessage;
  // The sum of the tensor bytes of one frame.
  uint64_t max_tensor_bytes = 64ull << 30;
};

// Flags: kFlagTimeout (requests only) says that the body starts with the
// caller's timeout, a u64 of milliseconds (rpc::Message::timeout_ms).
inline constexpr uint16_t kFlagTimeout = 0x1;
// kFlagChannel (requests, responses, errors) says that the descriptors are
// followed by a route record per tensor, and that at least one tensor's
// bytes come by a channel rather than in the frame.
inline constexpr uint16_t kFlagChannel = 0x2;
inline constexpr size_t kRouteSize = 16;

// How one tensor's bytes travel.
enum class TensorChannel : uint8_t {
  kInline = 0,   // after the frame, on the connection
  kCudaIpc = 1,  // in the sender's exported device memory (pipe/channel/cuda_ipc/cuda_ipc.h)
};

// Bytes that become ready chunk by chunk while the connection sends them:
// a CUDA tensor staged through a pinned host buffer
// (pipe/channel/cuda_staged/staging.h), so that copying the next chunk off the device
// overlaps with sending the last one.
//
// Thread safety: ready() from any thread; advance() from one thread at a
// time (the connection's writer that found the stream waiting on it).
class ChunkedSource {
 public:
  virtual ~ChunkedSource() = default;
  // The bytes in all; data() holds them once ready() == size().
  virtual size_t size() const = 0;
  // How many bytes from the start are ready at data().
  virtual size_t ready() const = 0;
  virtual const uint8_t* data() const = 0;
  // Makes the next chunk ready; returns once it is. Throws what the copy
  // throws (the connection then fails).
  virtual void advance() = 0;
};

struct TensorRoute {
  TensorChannel channel = TensorChannel::kInline;
  uint64_t buffer = 0;  // kCudaIpc: the sender's outbox
  // kInline, on the sending side only (never on the wire): the tensor's
  // bytes come from here, chunk by chunk, rather than all at once.
  std::shared_ptr<ChunkedSource> source;
  bool operator==(const TensorRoute&) const = default;
};

struct FrameHeader {
  FrameKind kind = FrameKind::kRequest;
  uint16_t flags = 0;
  uint64_t id = 0;
  uint32_t function_length = 0;
  uint32_t payload_length = 0;
  uint32_t tensor_count = 0;
  uint32_t descriptors_length = 0;

  // The timeout's 8 bytes when flagged, + function_length + payload_length
  // + descriptors_length (+ tensor_count route records when flagged).
  size_t body_size() const;
};

// Writes kHeaderSize bytes at `out` (magic, version, flags 0, then `h`).
void encode_header(const FrameHeader& h, uint8_t* out);
// Reads and validates kHeaderSize bytes at `in`: magic, version, kind,
// flags, every length against `limits` and the kind's rules (see the top of
// this file). Throws ProtocolError.
FrameHeader decode_header(const uint8_t* in, const FrameLimits& limits);

// Appends the header and body of `m` (kind from m.type) to `out`; the
// caller sends the bytes of m.tensors after them, in order (tensors of zero
// bytes send nothing). The descriptor of tensors[i] names devices[i] when
// `devices` is non-empty (the device the receiver should allocate on, from
// the device maps), else the tensor's own device. `out` keeps what it held.
// Throws std::invalid_argument, naming the tensor's index where one is at
// fault, for: an m.type that is not a MessageType, a request without a
// function or a response/error with one, an undefined or non-contiguous
// tensor, more than kMaxTensorsPerMessage tensors or kMaxTensorDims
// dimensions, devices.size() != tensors.size(), a device not representable
// (cpu index != 0, cuda index outside 0..32767), or a length that does not
// fit its u32 field.
// `routes`, when non-empty (one per tensor), says how each tensor's bytes
// travel; a tensor routed to a channel sends no bytes after the frame
// (the caller skips it), and any such route sets kFlagChannel.
void append_frame(std::vector<uint8_t>& out, const rpc::Message& m,
                  const std::vector<Device>& devices = {},
                  const std::vector<TensorRoute>& routes = {});

// The bytes append_frame() and the tensors after it put on the wire for
// `m` (header, body, tensor bytes), for metrics. Does not validate `m`.
size_t frame_size(const rpc::Message& m);

// Appends a hello, heartbeat or goodbye frame (header and payload) to
// `out`. `payload` (not retained) is allowed for kHello only.
// std::invalid_argument for another kind or a payload where none is allowed.
void append_control_frame(std::vector<uint8_t>& out, FrameKind kind, uint64_t id,
                          const uint8_t* payload = nullptr, size_t payload_size = 0);

// One received frame.
struct InboundFrame {
  FrameKind kind = FrameKind::kRequest;
  // Request/response/error: the message (type mirrors kind). Hello,
  // heartbeat, goodbye: message.id is the frame's id, message.payload holds
  // the hello bytes (empty otherwise), message.type is meaningless.
  rpc::Message message;
  // The device each tensor's descriptor named, parallel to message.tensors
  // (empty when there are none). The default allocator puts every tensor on
  // the CPU whatever its descriptor says; the agent compares the two and
  // moves the tensor (or refuses a device it cannot serve).
  std::vector<Device> devices;
  // With kFlagChannel: the tensors whose bytes come by a channel. Their
  // place in message.tensors holds an undefined Tensor until the agent
  // fetched them.
  struct ChannelTensor {
    size_t index = 0;
    DType dtype = DType::kUInt8;
    Tensor::Shape shape;
    TensorRoute route;
  };
  std::vector<ChannelTensor> channel_tensors;
};

// What a peer that has not yet proven who it is may send in one frame (its
// hello): a payload of at most this many bytes, and no tensors.
inline constexpr uint64_t kMaxStrangerFrameBytes = 64 * 1024;

// Incremental reader for one connection's byte stream. The connection asks
// where to read next (next_buffer), reads there, and reports how many bytes
// it got (commit); completed frames come out of pop() in order.
//
// Buffering: header and body bytes land in one internal buffer (at least
// kReadBufferSize free bytes offered each time, so one read can bring many
// small frames); it is compacted when needed, grown to fit a body larger
// than its free space (bounded by the limits) and given back once a body
// over 1 MiB is done. Tensor bytes that arrive in that buffer are copied
// into the tensor; once it holds no more, next_buffer() offers the tensor's
// own unfilled storage, so a large tensor is read straight into its
// destination with no copy (a remainder under 16 KiB is read through the
// buffer instead, with whatever follows it).
//
// Thread safety: none; one connection's reads use it from one thread at a
// time. Movable (the span next_buffer() offered stays valid; a moved-from
// reader may only be destroyed or assigned to), not copyable.
class FrameReader {
 public:
  // Makes the tensor a descriptor's bytes are read into, from the dtype,
  // the shape and the device the descriptor names. It must return a defined,
  // contiguous tensor of exactly that dtype and shape whose bytes the CPU
  // can write (device() cpu); anything else makes commit() throw
  // std::invalid_argument. std::bad_alloc from it becomes ProtocolError; other
  // exceptions propagate (and leave the reader unusable).
  // Default: Tensor::empty(shape, dtype) on the CPU whatever the device;
  // the descriptor's device is in InboundFrame::devices for the agent.
  using Allocate = std::function<Tensor(DType, const Tensor::Shape&, Device)>;
  // Told, as a tensor's bytes arrive, how many from its start are in
  // (`filled`), on the reading thread; it must not throw. For the agent's
  // copies to a device that overlap with the receive
  // (pipe/channel/cuda_staged/staging.h).
  using Progress = std::function<void(const Tensor& tensor, size_t filled)>;

  explicit FrameReader(FrameLimits limits = {}, Allocate allocate = nullptr);
  FrameReader(FrameReader&&) = default;
  FrameReader& operator=(FrameReader&&) = default;

  // Where the next received bytes go: free space at the end of the internal
  // buffer (at least kReadBufferSize bytes, more when the current frame's
  // body needs it, growing with the body bytes received, never by what a
  // header merely announces) or the unfilled remainder of the current
  // tensor's storage. Never empty. The span stays valid until the next commit();
  // calling next_buffer() again before that returns the same span.
  // Throws ProtocolError after a failure, or if the buffer cannot grow.
  std::pair<uint8_t*, size_t> next_buffer();

  // Records that `n` bytes were written at the start of the last
  // next_buffer() (n <= its size; 0 is allowed) and parses every frame now
  // complete. Throws ProtocolError on invalid input; the reader is then
  // unusable (next_buffer and commit throw it again) but frames completed
  // before the bad one can still be popped. std::invalid_argument when `n`
  // exceeds the span offered (or none was) or the allocator misbehaves.
  void commit(size_t n);

  // Moves the oldest completed frame into `out`; false when there is none.
  // While the peer is a stranger (set_trust), this is also where the next
  // frame is parsed, so it may throw ProtocolError as commit() does.
  bool pop(InboundFrame& out);

  // Until `trusted()` returns true, the peer is a stranger (it has not
  // proven who it is): each frame must fit the stranger limits (a payload
  // of kMaxStrangerFrameBytes at most, no tensors), so nothing large is
  // buffered for it, and frames are parsed one at a time (the next only
  // once this one was popped), so that what handling one decides (the peer
  // proved the job secret) applies to the frames after it. Once it returns
  // true it is not asked again. Null (the default): trusted from the start.
  void set_trust(std::function<bool()> trusted);
  // Null (the default): nobody is told.
  void set_progress(Progress progress) { progress_ = std::move(progress); }

  // True when bytes of a frame not yet complete have been received.
  bool mid_frame() const;

 private:
  enum class State { kHeader, kBody, kTensors };

  void parse();
  void decode_body(const uint8_t* body);
  std::vector<TensorRoute> decode_routes(const uint8_t* records) const;
  void allocate_tensors(const std::vector<TensorDescriptor>& descriptors,
                        const std::vector<TensorRoute>& routes);
  Tensor allocate_tensor(DType dtype, Device device);
  bool first_tensor();
  bool next_tensor();
  bool fill_tensors_from_buffer();
  void finish_frame();
  void make_room();
  [[noreturn]] void fail(const std::string& message);
  void check_usable() const;

  FrameLimits limits_;
  Allocate allocate_;
  std::function<bool()> trusted_;  // null once trusted
  Progress progress_;
  bool held_ = false;  // parse() stopped before a stranger's next frame
  // Received bytes: [begin_, end_) is not parsed yet.
  std::vector<uint8_t> buffer_;
  size_t begin_ = 0;
  size_t end_ = 0;
  // The size of the span next_buffer() last offered (0: none), and whether
  // it was the current tensor's storage.
  size_t offered_ = 0;
  bool offered_tensor_ = false;
  std::string failure_;  // non-empty once a commit failed

  State state_ = State::kHeader;
  FrameHeader header_;  // of the frame in progress (kBody, kTensors)
  InboundFrame current_;
  Tensor::Shape shape_;  // reused while allocating
  // kTensors: the tensor being filled.
  size_t tensor_index_ = 0;
  uint8_t* tensor_data_ = nullptr;
  size_t tensor_size_ = 0;
  size_t tensor_filled_ = 0;

  std::vector<InboundFrame> ready_;
  size_t ready_head_ = 0;  // ready_[ready_head_..] are not popped yet
};

// Feeds `data` through a FrameReader (default allocator) and returns every
// frame. Throws ProtocolError for invalid bytes, and for a trailing incomplete
// frame ("truncated").
std::vector<InboundFrame> decode_all(const uint8_t* data, size_t size,
                                     const FrameLimits& limits = {});

}  // namespace switchboard::agents::pipe::wire
