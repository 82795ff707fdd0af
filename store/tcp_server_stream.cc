#include "store/tcp_server_stream.h"

#include <algorithm>
#include <cstring>

namespace switchboard::tcpstore {
namespace {

// An empty buffer larger than this is released rather than kept.
constexpr size_t kKeepCapacity = 1024 * 1024;

}  // namespace

uint8_t* RequestStream::prepare() {
  if (capacity_ - end_ < kChunk) reserve_chunk();
  return data_.get() + end_;
}

void RequestStream::commit(size_t size) { end_ += std::min(size, capacity_ - end_); }

ParseStatus RequestStream::next(Request* request, std::string* error) {
  size_t available = end_ - begin_;
  if (available < needed_) return ParseStatus::kNeedMore;
  size_t consumed = 0;
  ParseStatus status = parse_request(data_.get() + begin_, available, limits_,
                                     request, &consumed, error, dialect_);
  if (status == ParseStatus::kOk && request->type == QueryType::kValidate) {
    dialect_ = Dialect::kTorch2;
  }
  if (status == ParseStatus::kNeedMore) {
    needed_ = std::max(consumed, available + 1);
  } else if (status == ParseStatus::kOk) {
    begin_ += consumed;
    needed_ = 1;
    if (begin_ == end_) {
      begin_ = end_ = 0;
      if (capacity_ > kKeepCapacity) {
        data_.reset();
        capacity_ = 0;
      }
    }
  }
  return status;
}

void RequestStream::consume(size_t size) {
  begin_ += std::min(size, end_ - begin_);
  needed_ = 1;
  if (begin_ == end_) begin_ = end_ = 0;
}

// Makes room for kChunk more bytes: moves the buffered bytes to the front
// when that frees enough, else grows (at least doubling, so a large request
// is copied O(1) times per byte).
void RequestStream::reserve_chunk() {
  size_t buffered = end_ - begin_;
  if (capacity_ - buffered >= kChunk && begin_ > 0) {
    std::memmove(data_.get(), data_.get() + begin_, buffered);
  } else {
    size_t capacity = std::max(2 * capacity_, buffered + kChunk);
    // new[] without () leaves the bytes uninitialized: untouched pages of an
    // idle connection's buffer cost no memory.
    std::unique_ptr<uint8_t[]> data(new uint8_t[capacity]);
    if (buffered > 0) std::memcpy(data.get(), data_.get() + begin_, buffered);
    data_ = std::move(data);
    capacity_ = capacity;
  }
  begin_ = 0;
  end_ = buffered;
}

}  // namespace switchboard::tcpstore
