// libFuzzer target for the TCPStore server's input path: the request parser,
// the per-connection RequestStream and the socket-free ServerState.
// Build and run with tests/store/fuzz/fuzz_store (clang, ASan + UBSan, no Bazel).
//
// Input: byte 0 is a control byte (fragment sizes, which client sends each
// request, when clients reconnect); the rest is a request byte stream. Checks
// beyond "no crash, no sanitizer report":
//   - parsing the whole stream at once and feeding it to a RequestStream in
//     fragments yield the same requests and the same final status;
//   - once every client is removed, ServerState holds no parked wait, no
//     waiter list and no watch (nothing can refer to a closed connection).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "store/tcp_protocol.h"
#include "store/tcp_server_state.h"
#include "store/tcp_server_stream.h"

using namespace switchboard;
using namespace switchboard::tcpstore;

namespace {

#define FUZZ_CHECK(cond)                                                   \
  do {                                                                     \
    if (!(cond)) {                                                         \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, \
                   #cond);                                                 \
      std::abort();                                                        \
    }                                                                      \
  } while (0)

struct Parsed {
  std::vector<Request> requests;
  ParseStatus last = ParseStatus::kNeedMore;  // what ended the stream
};

bool same(const Request& a, const Request& b) {
  return a.type == b.type && a.keys == b.keys && a.values == b.values && a.delta == b.delta &&
         a.nonce == b.nonce;
}

// Parses requests from the front until one is incomplete or bad, switching
// to PyTorch 2.x's numbering at a VALIDATE as a connection does.
Parsed parse_all(const uint8_t* data, size_t size, const Limits& limits) {
  Parsed parsed;
  size_t offset = 0;
  Dialect dialect = Dialect::kLegacy;
  for (;;) {
    Request request;
    size_t consumed = 0;
    std::string error;
    ParseStatus status = parse_request(data + offset, size - offset, limits, &request,
                                       &consumed, &error, dialect);
    if (status == ParseStatus::kOk && request.type == QueryType::kValidate) {
      dialect = Dialect::kTorch2;
    }
    if (status == ParseStatus::kOk) {
      FUZZ_CHECK(consumed > 0 && consumed <= size - offset);
      offset += consumed;
      parsed.requests.push_back(std::move(request));
      continue;
    }
    if (status == ParseStatus::kNeedMore) FUZZ_CHECK(consumed > size - offset);
    if (status == ParseStatus::kError) FUZZ_CHECK(!error.empty());
    parsed.last = status;
    return parsed;
  }
}

// Feeds the stream to a RequestStream in fragments of 1..16 bytes chosen by
// `control`, as a connection receiving small segments would.
Parsed parse_fragmented(const uint8_t* data, size_t size, const Limits& limits,
                        uint8_t control) {
  RequestStream stream(limits);
  Parsed parsed;
  uint32_t rng = control * 2654435761u + 1;
  size_t offset = 0;
  for (;;) {
    Request request;
    std::string error;
    ParseStatus status = stream.next(&request, &error);
    if (status == ParseStatus::kOk) {
      parsed.requests.push_back(std::move(request));
      continue;
    }
    if (status == ParseStatus::kError || offset == size) {
      parsed.last = status;
      return parsed;
    }
    rng = rng * 1103515245u + 12345u;
    size_t fragment = std::min<size_t>(1 + (rng >> 16) % 16, size - offset);
    uint8_t* space = stream.prepare();
    FUZZ_CHECK(stream.free_space() >= fragment);
    std::copy(data + offset, data + offset + fragment, space);
    stream.commit(fragment);
    offset += fragment;
  }
}

class FuzzPeer : public Peer {
 public:
  Bytes& output() override { return output_; }
  void flush() override {
    if (output_.size() > (1u << 20)) output_.clear();
  }

 private:
  Bytes output_;
};

// Applies the requests on behalf of three clients; bad requests and some
// control-chosen points disconnect and reconnect a client.
void drive_state(const std::vector<Request>& requests, uint8_t control) {
  constexpr ClientId kClients = 3;
  ServerState state;
  FuzzPeer peers[kClients];
  for (ClientId id = 0; id < kClients; ++id) state.add_client(id, &peers[id]);
  for (size_t i = 0; i < requests.size(); ++i) {
    ClientId id = (i + control) % kClients;
    Request request = requests[i];
    std::string error;
    bool reconnect = !state.apply(id, request, &error);
    if (reconnect) FUZZ_CHECK(!error.empty());
    if ((control & 0x80) && (i * 7 + control) % 13 == 0) reconnect = true;
    if (reconnect) {
      state.remove_client(id);
      peers[id] = FuzzPeer();
      state.add_client(id, &peers[id]);
    }
    peers[id].flush();
  }
  for (ClientId id = 0; id < kClients; ++id) state.remove_client(id);
  FUZZ_CHECK(state.num_clients() == 0);
  FUZZ_CHECK(state.num_parked_waits() == 0);
  FUZZ_CHECK(state.num_waited_keys() == 0);
  FUZZ_CHECK(state.num_watched_keys() == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  uint8_t control = data[0];
  ++data;
  --size;

  parse_all(data, size, Limits{});
  Limits small;
  small.max_key_bytes = 64;
  small.max_value_bytes = 256;
  small.max_keys_per_request = 16;
  Parsed whole = parse_all(data, size, small);

  Parsed fragmented = parse_fragmented(data, size, small, control);
  FUZZ_CHECK(fragmented.requests.size() == whole.requests.size());
  for (size_t i = 0; i < whole.requests.size(); ++i) {
    FUZZ_CHECK(same(fragmented.requests[i], whole.requests[i]));
  }
  FUZZ_CHECK(fragmented.last == whole.last);

  drive_state(whole.requests, control);
  return 0;
}
