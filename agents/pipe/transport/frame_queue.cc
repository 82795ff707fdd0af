#include "agents/pipe/transport/frame_queue.h"

#include <algorithm>

namespace switchboard::agents::pipe::transport {

void FrameQueue::append(const rpc::Message& m, const std::vector<Device>& devices,
                        const std::vector<wire::TensorRoute>& routes) {
  wire::append_frame(bytes_, m, devices, routes);
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    if (!routes.empty() && routes[i].channel != wire::TensorChannel::kInline) continue;
    const Tensor& t = m.tensors[i];
    if (t.nbytes() == 0) continue;
    tensors_.push_back(
        {bytes_.size(), t, 0, routes.empty() ? nullptr : routes[i].source});
  }
}

std::shared_ptr<wire::ChunkedSource> FrameQueue::blocked() const {
  if (tensors_.empty() || tensors_.front().offset > 0)
    return nullptr;  // frame bytes first
  const QueuedTensor& t = tensors_.front();
  if (t.source == nullptr || t.sent < t.source->ready() || t.sent == t.size())
    return nullptr;
  return t.source;
}

void FrameQueue::append_control(wire::FrameKind kind, uint64_t id, const uint8_t* payload,
                                size_t size) {
  wire::append_control_frame(bytes_, kind, id, payload, size);
}

void FrameQueue::consume(size_t n) {
  size_t at = 0;        // frame bytes fully sent
  size_t finished = 0;  // tensors fully sent
  while (n > 0) {
    const size_t end =
        finished < tensors_.size() ? tensors_[finished].offset : bytes_.size();
    const size_t taken = std::min(n, end - at);
    at += taken;
    n -= taken;
    if (n == 0 || finished == tensors_.size()) break;
    QueuedTensor& t = tensors_[finished];
    const size_t take = std::min(n, t.size() - t.sent);
    t.sent += take;
    n -= take;
    if (t.sent < t.size()) break;
    ++finished;
  }
  bytes_.erase(bytes_.begin(), bytes_.begin() + static_cast<std::ptrdiff_t>(at));
  tensors_.erase(tensors_.begin(),
                 tensors_.begin() + static_cast<std::ptrdiff_t>(finished));
  for (QueuedTensor& t : tensors_) t.offset -= at;
}

}  // namespace switchboard::agents::pipe::transport
