#include "store/tcp_protocol.h"

#include <fmt/format.h>

#include <cstring>
#include <iterator>
#include <stdexcept>

namespace switchboard::tcpstore {
namespace {

// Reads fields from a byte buffer; every read checks the bytes are there.
// `missing` records how many bytes the first failed read needed beyond the
// end, so the caller can report a lower bound on the request size.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool u8(uint8_t* out) {
    if (!need(1)) return false;
    *out = data_[pos_++];
    return true;
  }
  bool u32(uint32_t* out) {
    if (!need(4)) return false;
    *out = static_cast<uint32_t>(data_[pos_]) | static_cast<uint32_t>(data_[pos_ + 1]) << 8 |
           static_cast<uint32_t>(data_[pos_ + 2]) << 16 |
           static_cast<uint32_t>(data_[pos_ + 3]) << 24;
    pos_ += 4;
    return true;
  }
  // Whether `n` more bytes are there (when not, the need is recorded).
  bool has(uint64_t n) { return need(n); }
  // Whether the 4 bytes at the current position are `value` (false also
  // when fewer are there).
  bool peek_u32(uint32_t value) const {
    if (size_ - pos_ < 4) return false;
    const uint8_t* at = data_ + pos_;
    return (static_cast<uint32_t>(at[0]) | static_cast<uint32_t>(at[1]) << 8 |
            static_cast<uint32_t>(at[2]) << 16 | static_cast<uint32_t>(at[3]) << 24) == value;
  }
  bool u64(uint64_t* out) {
    if (!need(8)) return false;
    *out = load_u64(data_ + pos_);
    pos_ += 8;
    return true;
  }
  // Reads `size` raw bytes, only after checking they are all present.
  bool raw(uint64_t size, const uint8_t** out) {
    if (!need(size)) return false;
    *out = data_ + pos_;
    pos_ += size;
    return true;
  }
  size_t pos() const { return pos_; }
  size_t wanted() const { return wanted_; }

 private:
  bool need(uint64_t n) {
    if (size_ - pos_ >= n) return true;
    wanted_ = pos_ + n;
    return false;
  }

  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  size_t wanted_ = 0;
};

// Parses one request's fields; returns kNeedMore/kError like parse_request.
class Parser {
 public:
  Parser(const uint8_t* data, size_t size, const Limits& limits, Request* request,
         std::string* error, Dialect dialect)
      : reader_(data, size),
        limits_(limits),
        request_(request),
        error_(error),
        dialect_(dialect) {}

  ParseStatus run(size_t* consumed) {
    ParseStatus status = fields();
    *consumed = status == ParseStatus::kOk ? reader_.pos() : reader_.wanted();
    return status;
  }

 private:
  // The query type, as the dialect numbers it.
  ParseStatus type() {
    uint8_t wire = 0;
    if (!reader_.u8(&wire)) return ParseStatus::kNeedMore;
    if (dialect_ == Dialect::kTorch2) return torch2_type(wire);
    if (wire == 0) {
      // SET, or PyTorch 2.x's VALIDATE: its magic tells (a SET needs 8
      // bytes of key length anyway).
      if (!reader_.has(4)) return ParseStatus::kNeedMore;
      if (reader_.peek_u32(kValidateMagic)) {
        request_->type = QueryType::kValidate;
        name_ = "VALIDATE";
        return ParseStatus::kOk;
      }
    }
    if (wire > kMaxQueryType) return fail(fmt::format("unknown query type {}", wire));
    request_->type = static_cast<QueryType>(wire);
    name_ = query_type_name(wire);
    return ParseStatus::kOk;
  }

  ParseStatus torch2_type(uint8_t wire) {
    // PyTorch 2.x's codes 1 to 7 are the legacy 0 to 6; 8 to 12 are the same.
    static constexpr QueryType kTypes[] = {
        QueryType::kValidate,   QueryType::kSet,      QueryType::kCompareSet,
        QueryType::kGet,        QueryType::kAdd,      QueryType::kCheck,
        QueryType::kWait,       QueryType::kGetNumKeys, QueryType::kDeleteKey,
        QueryType::kAppend,     QueryType::kMultiGet, QueryType::kMultiSet,
        QueryType::kCancelWait, QueryType::kPing};
    static constexpr const char* kRefused[] = {"QUEUE_PUSH", "QUEUE_POP", "QUEUE_LEN",
                                               "LIST_KEYS"};
    if (wire < std::size(kTypes)) {
      request_->type = kTypes[wire];
      name_ = torch2_query_type_name(wire);
      return ParseStatus::kOk;
    }
    const size_t refused = wire - std::size(kTypes);
    if (refused < std::size(kRefused)) {
      return fail(fmt::format("{} (PyTorch 2.x's query type {}) is not supported by this "
                              "server",
                              kRefused[refused], wire));
    }
    return fail(fmt::format("unknown query type {} (PyTorch 2.x's numbering)", wire));
  }

  ParseStatus fields() {
    if (ParseStatus status = type(); status != ParseStatus::kOk) return status;
    switch (request_->type) {
      case QueryType::kSet:
      case QueryType::kAppend:
        return all({key(), value("value")});
      case QueryType::kCompareSet:
        return all({key(), value("expected"), value("desired")});
      case QueryType::kGet:
      case QueryType::kWatchKey:
      case QueryType::kDeleteKey:
        return key();
      case QueryType::kAdd:
        return all({key(), delta()});
      case QueryType::kCheck:
      case QueryType::kWait:
      case QueryType::kMultiGet:
        return key_list(false);
      case QueryType::kMultiSet:
        return key_list(true);
      case QueryType::kGetNumKeys:
      case QueryType::kCancelWait:
        return ParseStatus::kOk;
      case QueryType::kValidate:
      case QueryType::kPing:
        return nonce();
    }
    return fail("unhandled query type");
  }

  ParseStatus nonce() {
    if (!reader_.u32(&request_->nonce)) return ParseStatus::kNeedMore;
    if (request_->type == QueryType::kValidate && request_->nonce != kValidateMagic) {
      return fail(fmt::format("magic {:#010x}, expected {:#010x}", request_->nonce,
                              kValidateMagic));
    }
    return ParseStatus::kOk;
  }

  // Evaluates fields in order (braced-init-list order is left to right) and
  // returns the first status that is not kOk.
  ParseStatus all(std::initializer_list<ParseStatus> statuses) {
    for (ParseStatus status : statuses) {
      if (status != ParseStatus::kOk) return status;
    }
    return ParseStatus::kOk;
  }

  // Once a field fails, later fields in the same all() must not read.
  ParseStatus key() {
    if (stopped_) return stop_status_;
    const uint8_t* bytes = nullptr;
    uint64_t size = 0;
    ParseStatus status = sized("key", limits_.max_key_bytes, &bytes, &size);
    if (status == ParseStatus::kOk) {
      request_->keys.emplace_back(reinterpret_cast<const char*>(bytes), size);
    }
    return status;
  }

  ParseStatus value(const char* field) {
    if (stopped_) return stop_status_;
    const uint8_t* bytes = nullptr;
    uint64_t size = 0;
    ParseStatus status = sized(field, limits_.max_value_bytes, &bytes, &size);
    if (status == ParseStatus::kOk) request_->values.emplace_back(bytes, bytes + size);
    return status;
  }

  ParseStatus delta() {
    if (stopped_) return stop_status_;
    uint64_t raw = 0;
    if (!reader_.u64(&raw)) return stop(ParseStatus::kNeedMore);
    request_->delta = static_cast<int64_t>(raw);
    return ParseStatus::kOk;
  }

  ParseStatus key_list(bool with_values) {
    uint64_t count = 0;
    if (!reader_.u64(&count)) return ParseStatus::kNeedMore;
    if (count > limits_.max_keys_per_request) {
      return fail(fmt::format("{} keys exceed the limit of {}", count,
                              limits_.max_keys_per_request));
    }
    // No reserve(count): the count is only a claim until the bytes arrive.
    for (uint64_t i = 0; i < count; ++i) {
      ParseStatus status = key();
      if (status == ParseStatus::kOk && with_values) status = value("value");
      if (status != ParseStatus::kOk) return status;
    }
    return ParseStatus::kOk;
  }

  ParseStatus sized(const char* field, uint64_t limit, const uint8_t** bytes,
                    uint64_t* size) {
    if (!reader_.u64(size)) return stop(ParseStatus::kNeedMore);
    if (*size > limit) {
      return stop(fail(fmt::format("{} length {} exceeds the limit of {} bytes",
                                   field, *size, limit)));
    }
    if (!reader_.raw(*size, bytes)) return stop(ParseStatus::kNeedMore);
    return ParseStatus::kOk;
  }

  ParseStatus stop(ParseStatus status) {
    stopped_ = true;
    stop_status_ = status;
    return status;
  }

  ParseStatus fail(const std::string& reason) {
    *error_ = name_.empty() ? reason : fmt::format("{}: {}", name_, reason);
    return ParseStatus::kError;
  }

  Reader reader_;
  const Limits& limits_;
  Request* request_;
  std::string* error_;
  const Dialect dialect_;
  std::string name_;
  bool stopped_ = false;
  ParseStatus stop_status_ = ParseStatus::kOk;
};

}  // namespace

std::string query_type_name(uint8_t type) {
  static constexpr const char* kNames[] = {
      "SET",       "COMPARE_SET", "GET",     "ADD",       "CHECK",
      "WAIT",      "GETNUMKEYS",  "WATCH_KEY", "DELETE_KEY", "APPEND",
      "MULTI_GET", "MULTI_SET",   "CANCEL_WAIT", "VALIDATE",   "PING"};
  if (type < std::size(kNames)) return kNames[type];
  return fmt::format("UNKNOWN({})", type);
}

std::string torch2_query_type_name(uint8_t type) {
  static constexpr const char* kNames[] = {
      "VALIDATE",  "SET",       "COMPARE_SET", "GET",        "ADD",       "CHECK",
      "WAIT",      "GETNUMKEYS", "DELETE_KEY", "APPEND",     "MULTI_GET", "MULTI_SET",
      "CANCEL_WAIT", "PING",    "QUEUE_PUSH",  "QUEUE_POP",  "QUEUE_LEN", "LIST_KEYS"};
  if (type < std::size(kNames)) return kNames[type];
  return fmt::format("UNKNOWN({})", type);
}

ParseStatus parse_request(const uint8_t* data, size_t size, const Limits& limits,
                          Request* request, size_t* consumed, std::string* error,
                          Dialect dialect) {
  *request = Request{};
  return Parser(data, size, limits, request, error, dialect).run(consumed);
}

void put_u8(Bytes& out, uint8_t value) { out.push_back(value); }

void put_u32(Bytes& out, uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(value >> (8 * i)));
}

void put_u64(Bytes& out, uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(value >> (8 * i)));
}

void put_i64(Bytes& out, int64_t value) { put_u64(out, static_cast<uint64_t>(value)); }

void put_bytes(Bytes& out, const void* data, size_t size) {
  put_u64(out, size);
  const auto* bytes = static_cast<const uint8_t*>(data);
  out.insert(out.end(), bytes, bytes + size);
}

uint64_t load_u64(const uint8_t* data) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | data[i];
  return value;
}

// The code of `type` in PyTorch 2.x's numbering.
uint8_t torch2_code(QueryType type) {
  switch (type) {
    case QueryType::kValidate:
      return 0;
    case QueryType::kPing:
      return 13;
    case QueryType::kWatchKey:
      throw std::invalid_argument("WATCH_KEY has no code in PyTorch 2.x's numbering");
    case QueryType::kDeleteKey:
    case QueryType::kAppend:
    case QueryType::kMultiGet:
    case QueryType::kMultiSet:
    case QueryType::kCancelWait:
      return static_cast<uint8_t>(type);
    default:  // SET to GETNUMKEYS: one more than the legacy code
      return static_cast<uint8_t>(static_cast<uint8_t>(type) + 1);
  }
}

void encode_request(Bytes& out, const Request& request, Dialect dialect) {
  // VALIDATE and PING exist only in PyTorch 2.x's numbering: 0 and 13.
  if (request.type == QueryType::kValidate || request.type == QueryType::kPing) {
    put_u8(out, torch2_code(request.type));
    put_u32(out, request.nonce);
    return;
  }
  put_u8(out, dialect == Dialect::kTorch2 ? torch2_code(request.type)
                                          : static_cast<uint8_t>(request.type));
  const auto& keys = request.keys;
  const auto& values = request.values;
  switch (request.type) {
    case QueryType::kSet:
    case QueryType::kAppend:
      put_bytes(out, keys.at(0));
      put_bytes(out, values.at(0));
      break;
    case QueryType::kCompareSet:
      put_bytes(out, keys.at(0));
      put_bytes(out, values.at(0));
      put_bytes(out, values.at(1));
      break;
    case QueryType::kGet:
    case QueryType::kWatchKey:
    case QueryType::kDeleteKey:
      put_bytes(out, keys.at(0));
      break;
    case QueryType::kAdd:
      put_bytes(out, keys.at(0));
      put_i64(out, request.delta);
      break;
    case QueryType::kCheck:
    case QueryType::kWait:
    case QueryType::kMultiGet:
      put_u64(out, keys.size());
      for (const auto& key : keys) put_bytes(out, key);
      break;
    case QueryType::kMultiSet:
      put_u64(out, keys.size());
      for (size_t i = 0; i < keys.size(); ++i) {
        put_bytes(out, keys[i]);
        put_bytes(out, values.at(i));
      }
      break;
    case QueryType::kGetNumKeys:
    case QueryType::kCancelWait:
    case QueryType::kValidate:
    case QueryType::kPing:
      break;
  }
}

}  // namespace switchboard::tcpstore
