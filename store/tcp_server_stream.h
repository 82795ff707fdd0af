// RequestStream: the bytes one connection has received and not yet parsed,
// cut into requests with tcpstore::parse_request. No sockets: a connection
// receives into prepare()/commit() and then calls next() until it reports
// kNeedMore; the fuzzer feeds it fragments directly.
//
// Memory: the buffer grows with the bytes actually received, never with a
// length a request merely claims. After an incomplete parse the stream
// remembers the parser's lower bound on the request size and does not parse
// again until that many bytes are buffered, so a large value arriving in
// many reads is parsed once.
//
// Thread safety: none; one connection owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "store/tcp_protocol.h"

namespace switchboard::tcpstore {

class RequestStream {
 public:
  // Bytes offered to each receive.
  static constexpr size_t kChunk = 64 * 1024;

  explicit RequestStream(const Limits& limits) : limits_(limits) {}
  RequestStream(const RequestStream&) = delete;
  RequestStream& operator=(const RequestStream&) = delete;

  // Free space for the next receive: at least kChunk bytes at the returned
  // pointer, valid until the next call of any method.
  uint8_t* prepare();
  size_t free_space() const { return capacity_ - end_; }
  // Marks `size` bytes written at prepare() as received.
  void commit(size_t size);

  // Parses the next complete request into *request. A VALIDATE (PyTorch
  // 2.x's first request) switches the stream to PyTorch 2.x's numbering of
  // the query types for the rest of the connection.
  //   kOk:       *request filled; its bytes are consumed.
  //   kNeedMore: no complete request is buffered; nothing consumed.
  //   kError:    *error says why; the stream must not be used further.
  ParseStatus next(Request* request, std::string* error);

  // Bytes received and not consumed by a complete request.
  size_t buffered() const { return end_ - begin_; }
  // The buffered bytes, and dropping the first `size` of them (what came
  // before the requests: the authentication handshake).
  const uint8_t* data() const { return data_.get() + begin_; }
  void consume(size_t size);
  // After kNeedMore: a lower bound on the size of the incomplete request.
  size_t needed() const { return needed_; }

 private:
  void reserve_chunk();

  const Limits limits_;
  std::unique_ptr<uint8_t[]> data_;  // uninitialized; [begin_, end_) is valid
  size_t capacity_ = 0;
  size_t begin_ = 0;
  size_t end_ = 0;
  size_t needed_ = 1;  // do not parse before this many bytes are buffered
  // How the client numbers its requests: legacy until a VALIDATE.
  Dialect dialect_ = Dialect::kLegacy;
};

}  // namespace switchboard::tcpstore
