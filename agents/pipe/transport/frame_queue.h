// FrameQueue: frames waiting to go out on a byte stream (a socket, a TLS
// session, a shared-memory ring), as the encoded frame bytes plus the
// tensors whose bytes follow them, which are never copied into the queue.
// Every stream transport writes from one: it appends frames, hands the
// pieces to its stream in wire order, and drops what the stream took.
//
// A tensor routed with a wire::ChunkedSource offers only the bytes its
// source made ready so far, and nothing after it goes out before all of it
// did: when the stream took everything offered and the queue waits on such
// a source (blocked()), the writer calls its advance() and goes on.
//
// Ownership: the queue holds a reference to each queued tensor's storage
// until its bytes went; the caller must not change those bytes meanwhile.
// Thread safety: none; the owning connection guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "agents/pipe/wire/frame.h"
#include "core/message.h"
#include "core/tensor.h"

namespace switchboard::agents::pipe::transport {

class FrameQueue {
 public:
  // Appends `m` encoded as a frame (wire::append_frame), its tensors' bytes
  // after it but for those `routes` hands to a channel.
  void append(const rpc::Message& m, const std::vector<Device>& devices,
              const std::vector<wire::TensorRoute>& routes);
  // Appends a control frame (wire::append_control_frame).
  void append_control(wire::FrameKind kind, uint64_t id, const uint8_t* payload,
                      size_t size);

  bool empty() const { return bytes_.empty() && tensors_.empty(); }

  // Calls emit(data, size) for each piece in wire order, skipping empty
  // pieces and bytes already consumed, up to the first source whose bytes
  // are not all ready (its ready part included).
  template <typename Emit>
  void for_each_piece(Emit&& emit) const;
  // The source the queue waits on: everything before it went, and all of
  // its ready bytes too; null when the queue has bytes to offer (or none).
  std::shared_ptr<wire::ChunkedSource> blocked() const;
  // Drops the first `n` bytes (n <= size()).
  void consume(size_t n);

  void swap(FrameQueue& other) noexcept {
    bytes_.swap(other.bytes_);
    tensors_.swap(other.tensors_);
  }
  void clear() {
    bytes_.clear();
    tensors_.clear();
  }

 private:
  // A tensor whose bytes follow byte `offset` of bytes_; `sent` of them
  // already went (a partial write).
  struct QueuedTensor {
    size_t offset = 0;
    Tensor tensor;
    size_t sent = 0;
    std::shared_ptr<wire::ChunkedSource> source;  // null: every byte is ready
    size_t size() const { return source ? source->size() : tensor.nbytes(); }
    size_t available() const { return source ? source->ready() : tensor.nbytes(); }
    const uint8_t* data() const {
      return source ? source->data() : static_cast<const uint8_t*>(tensor.data());
    }
  };

  std::vector<uint8_t> bytes_;
  std::vector<QueuedTensor> tensors_;
};

template <typename Emit>
void FrameQueue::for_each_piece(Emit&& emit) const {
  size_t at = 0;
  for (const QueuedTensor& t : tensors_) {
    if (t.offset > at) emit(bytes_.data() + at, t.offset - at);
    at = t.offset;
    const size_t available = t.available();
    if (t.sent < available) emit(t.data() + t.sent, available - t.sent);
    if (available < t.size()) return;  // nothing after it goes before all of it
  }
  if (at < bytes_.size()) emit(bytes_.data() + at, bytes_.size() - at);
}

}  // namespace switchboard::agents::pipe::transport
