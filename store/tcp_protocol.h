// The TCPStore wire protocol (PyTorch 1.13, plus the query codes later
// PyTorch versions added: APPEND, MULTI_GET, MULTI_SET, CANCEL_WAIT).
// docs/wire_formats.md ("The TCPStore protocol") describes it for users.
//
// Encoding: little-endian (the client's native order on x86-64/aarch64);
// a request is a u8 query type followed by its fields; strings and byte
// values are a u64 length plus raw bytes; counts are u64; the ADD delta and
// every integer reply are i64. There is no frame length and no request id:
// replies are matched to requests by order on the connection.
//
// This header has no I/O: the server and client feed it bytes. The parser
// never allocates more than the bytes it was actually given, whatever a
// length prefix claims, and rejects lengths over the configured limits.
//
// Thread safety: free functions are reentrant; a RequestParser is not
// shared between threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "store/store.h"

namespace switchboard::tcpstore {

enum class QueryType : uint8_t {
  kSet = 0,         // key, value                -> (no reply)
  kCompareSet = 1,  // key, expected, desired    -> bytes
  kGet = 2,         // key                       -> bytes
  kAdd = 3,         // key, i64 delta            -> i64
  kCheck = 4,       // n, n x key                -> u8 CheckResponse
  kWait = 5,        // n, n x key                -> u8 kStopWaiting (maybe later)
  kGetNumKeys = 6,  //                           -> i64
  kWatchKey = 7,    // key                       -> u8 kCallbackRegistered, events
  kDeleteKey = 8,   // key                       -> i64 (1 deleted, 0 absent)
  // Not in PyTorch 1.13; codes as later PyTorch versions assign them.
  kAppend = 9,      // key, value                -> (no reply)
  kMultiGet = 10,   // n, n x key                -> n x bytes
  kMultiSet = 11,   // n, n x (key, value)       -> (no reply)
  kCancelWait = 12, //                           -> u8 kWaitCanceled
};
constexpr uint8_t kMaxQueryType = 12;
// The last query type PyTorch 1.13 knows.
constexpr QueryType kLastLegacyQuery = QueryType::kDeleteKey;

// Authentication (a server started with a job secret; not in PyTorch's
// protocol, and never used without a secret). Before any request:
//   client -> server  kAuthMagic (8 bytes), client nonce Nc (32)
//   server -> client  server nonce Ns (32),
//                     HMAC(secret, kServerLabel | Nc | Ns) (32)
//   client -> server  HMAC(secret, kClientLabel | Ns | Nc) (32), after
//                     checking the server's proof
//   server -> client  u8 kAuthAccepted, or kAuthRefused and close
// The magic's first byte is no query type, so a server without a secret
// closes such a connection as it closes any unknown query.
inline constexpr char kAuthMagic[8] = {'S', 'B', 'A', 'U', 'T', 'H', '0', '1'};
inline constexpr size_t kAuthNonceBytes = 32;
inline constexpr size_t kAuthMacBytes = 32;
inline constexpr std::string_view kAuthServerLabel = "switchboard store server";
inline constexpr std::string_view kAuthClientLabel = "switchboard store client";
inline constexpr uint8_t kAuthAccepted = 1;
inline constexpr uint8_t kAuthRefused = 0;

enum class CheckResponse : uint8_t { kReady = 0, kNotReady = 1 };
enum class WaitResponse : uint8_t { kStopWaiting = 0, kWaitCanceled = 1 };
enum class WatchResponse : uint8_t {
  kKeyUpdated = 0,
  kKeyCreated = 1,
  kKeyDeleted = 2,
  kCallbackRegistered = 3,
};

// Returns "SET", "COMPARE_SET", ... or "UNKNOWN(<n>)".
std::string query_type_name(uint8_t type);

// Bounds on what a request may announce; anything larger closes the
// connection. Defaults are generous.
struct Limits {
  uint64_t max_key_bytes = 1ull << 20;          // 1 MiB
  uint64_t max_value_bytes = 1ull << 30;        // 1 GiB
  uint64_t max_keys_per_request = 1ull << 20;   // for CHECK, WAIT, MULTI_*
};

// One decoded request. Which fields are used depends on `type`:
//   SET, APPEND:        keys[0], values[0]
//   COMPARE_SET:        keys[0], values[0] = expected, values[1] = desired
//   GET, WATCH_KEY, DELETE_KEY: keys[0]
//   ADD:                keys[0], delta
//   CHECK, WAIT, MULTI_GET: keys
//   MULTI_SET:          keys, values (same length)
//   GETNUMKEYS, CANCEL_WAIT: nothing
struct Request {
  QueryType type = QueryType::kSet;
  std::vector<std::string> keys;
  std::vector<Bytes> values;
  int64_t delta = 0;
};

enum class ParseStatus {
  kOk,        // *request filled, *consumed bytes used
  kNeedMore,  // the buffer holds an incomplete request; nothing consumed
  kError,     // malformed or over a limit; *error says why
};

// Parses the request at the front of [data, data + size).
//   kOk:       fills *request and sets *consumed.
//   kNeedMore: sets *consumed to a lower bound on the bytes the complete
//              request needs (so the caller can wait for at least that many
//              before trying again).
//   kError:    sets *error to a reason naming the query and the field.
ParseStatus parse_request(const uint8_t* data, size_t size, const Limits& limits,
                          Request* request, size_t* consumed, std::string* error);

// Appenders that encode one field at the end of `out`.
void put_u8(Bytes& out, uint8_t value);
void put_u64(Bytes& out, uint64_t value);
void put_i64(Bytes& out, int64_t value);
void put_bytes(Bytes& out, const void* data, size_t size);
inline void put_bytes(Bytes& out, std::string_view text) {
  put_bytes(out, text.data(), text.size());
}
inline void put_bytes(Bytes& out, const Bytes& value) {
  put_bytes(out, value.data(), value.size());
}

// Encodes a whole request (as the client sends it) at the end of `out`.
void encode_request(Bytes& out, const Request& request);

// Little-endian decoding of a fixed-width field from 8 bytes.
uint64_t load_u64(const uint8_t* data);

}  // namespace switchboard::tcpstore
