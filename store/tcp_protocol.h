// The TCPStore wire protocol (PyTorch 1.13, plus the query codes later
// PyTorch versions added: APPEND, MULTI_GET, MULTI_SET, CANCEL_WAIT), and
// PyTorch 2.x's numbering of the same requests (Dialect).
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
  // Only in PyTorch 2.x's numbering (see Dialect); no code of their own
  // in the legacy one.
  kValidate = 13,   // u32 kValidateMagic          -> (no reply)
  kPing = 14,       // u32 nonce                   -> u32 the same nonce
};
// The last code of the legacy numbering.
constexpr uint8_t kMaxQueryType = 12;
// The last query type PyTorch 1.13 knows.
constexpr QueryType kLastLegacyQuery = QueryType::kDeleteKey;

// How a connection numbers the query types.
//   kLegacy  PyTorch 1.13's numbering (SET 0 ... DELETE_KEY 8), with the
//            codes later versions added (APPEND 9 ... CANCEL_WAIT 12): our
//            own client, and PyTorch 1.13's.
//   kTorch2  PyTorch 2.x's: every connection opens with VALIDATE (type 0
//            and kValidateMagic as a u32), and the types are numbered from
//            it: SET 1, COMPARE_SET 2, GET 3, ADD 4, CHECK 5, WAIT 6,
//            GETNUMKEYS 7, DELETE_KEY 8 (WATCH_KEY is gone), APPEND 9,
//            MULTI_GET 10, MULTI_SET 11, CANCEL_WAIT 12, PING 13, then
//            QUEUE_PUSH 14, QUEUE_POP 15, QUEUE_LEN 16 and LIST_KEYS 17,
//            which this server refuses by name (closing the connection).
// A connection starts kLegacy and becomes kTorch2 at a VALIDATE, which
// cannot be mistaken for a legacy request: read as SET, its key length
// would be over 1 GB.
enum class Dialect { kLegacy, kTorch2 };
inline constexpr uint32_t kValidateMagic = 0x3C85F7CE;

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

// Returns "SET", "COMPARE_SET", ... or "UNKNOWN(<n>)": the names of
// QueryType's values (the legacy numbering, then VALIDATE and PING), and of
// PyTorch 2.x's numbering.
std::string query_type_name(uint8_t type);
std::string torch2_query_type_name(uint8_t type);

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
//   VALIDATE, PING:     nonce (the magic, the ping's nonce)
struct Request {
  QueryType type = QueryType::kSet;
  std::vector<std::string> keys;
  std::vector<Bytes> values;
  int64_t delta = 0;
  uint32_t nonce = 0;
};

enum class ParseStatus {
  kOk,        // *request filled, *consumed bytes used
  kNeedMore,  // the buffer holds an incomplete request; nothing consumed
  kError,     // malformed or over a limit; *error says why
};

// Parses the request at the front of [data, data + size), numbered as
// `dialect` says (a kLegacy connection also accepts VALIDATE, which makes
// it kTorch2: the caller switches when *request is one).
//   kOk:       fills *request and sets *consumed.
//   kNeedMore: sets *consumed to a lower bound on the bytes the complete
//              request needs (so the caller can wait for at least that many
//              before trying again).
//   kError:    sets *error to a reason naming the query and the field.
ParseStatus parse_request(const uint8_t* data, size_t size, const Limits& limits,
                          Request* request, size_t* consumed, std::string* error,
                          Dialect dialect = Dialect::kLegacy);

// Appenders that encode one field at the end of `out`.
void put_u8(Bytes& out, uint8_t value);
void put_u32(Bytes& out, uint32_t value);
void put_u64(Bytes& out, uint64_t value);
void put_i64(Bytes& out, int64_t value);
void put_bytes(Bytes& out, const void* data, size_t size);
inline void put_bytes(Bytes& out, std::string_view text) {
  put_bytes(out, text.data(), text.size());
}
inline void put_bytes(Bytes& out, const Bytes& value) {
  put_bytes(out, value.data(), value.size());
}

// Encodes a whole request (as the client sends it) at the end of `out`, in
// `dialect`'s numbering (VALIDATE and PING, which only PyTorch 2.x's has,
// always in that one). std::invalid_argument for WATCH_KEY in kTorch2,
// which has no code there.
void encode_request(Bytes& out, const Request& request,
                    Dialect dialect = Dialect::kLegacy);
// The code of `type` in PyTorch 2.x's numbering (same errors).
uint8_t torch2_code(QueryType type);

// Little-endian decoding of a fixed-width field from 8 bytes.
uint64_t load_u64(const uint8_t* data);

}  // namespace switchboard::tcpstore
