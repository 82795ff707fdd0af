// The TCPStore request parser: byte-exact decoding of PyTorch's captures,
// fragmentation, limits, and bad input.
#include <catch2/catch.hpp>

#include <random>

#include "store/tcp_protocol.h"

using namespace switchboard;
using namespace switchboard::tcpstore;

namespace {

Bytes hex(std::initializer_list<int> bytes) {
  Bytes out;
  for (int b : bytes) out.push_back(static_cast<uint8_t>(b));
  return out;
}

ParseStatus parse(const Bytes& data, Request* request, size_t* consumed,
                  std::string* error, const Limits& limits = {}) {
  return parse_request(data.data(), data.size(), limits, request, consumed, error);
}

}  // namespace

TEST_CASE("parser decodes PyTorch's captured SET byte for byte", "[store][protocol]") {
  // set("a", b"xyz") as captured from a torch 1.13 client.
  Bytes wire = hex({0x00, 0x02, 0, 0, 0, 0, 0, 0, 0, 0x2f, 0x61,
                    0x03, 0, 0, 0, 0, 0, 0, 0, 0x78, 0x79, 0x7a});
  Request request;
  size_t consumed = 0;
  std::string error;
  REQUIRE(parse(wire, &request, &consumed, &error) == ParseStatus::kOk);
  CHECK(consumed == wire.size());
  CHECK(request.type == QueryType::kSet);
  CHECK(request.keys == std::vector<std::string>{"/a"});
  CHECK(to_string(request.values.at(0)) == "xyz");
}

TEST_CASE("a legacy connection reads PyTorch 2.x's VALIDATE as such, and PyTorch 2.x's "
          "numbering of the types after it",
          "[store][protocol][torch2]") {
  Request request;
  size_t consumed = 0;
  std::string error;
  // Type 0 and fewer than 4 more bytes: VALIDATE or SET cannot be told yet.
  CHECK(parse(hex({0x00, 0xce, 0xf7}), &request, &consumed, &error) == ParseStatus::kNeedMore);
  CHECK(consumed == 5);
  // Captured from PyTorch 2.11's TCPStore client: VALIDATE, PING (nonce).
  const Bytes validate = hex({0x00, 0xce, 0xf7, 0x85, 0x3c});
  REQUIRE(parse(validate, &request, &consumed, &error) == ParseStatus::kOk);
  CHECK(request.type == QueryType::kValidate);
  CHECK(request.nonce == kValidateMagic);
  CHECK(consumed == 5);
  auto parse2 = [&](const Bytes& wire) {
    return parse_request(wire.data(), wire.size(), Limits{}, &request, &consumed, &error,
                         Dialect::kTorch2);
  };
  REQUIRE(parse2(hex({0x0d, 0x96, 0x75, 0, 0})) == ParseStatus::kOk);
  CHECK(request.type == QueryType::kPing);
  CHECK(request.nonce == 0x7596);
  // set("a", "xyz") is type 1 there, DELETE_KEY 8 and MULTI_GET 10 as in
  // the legacy numbering.
  REQUIRE(parse2(hex({0x01, 0x02, 0, 0, 0, 0, 0, 0, 0, 0x2f, 0x61, 0x03, 0, 0, 0, 0, 0, 0, 0,
                      0x78, 0x79, 0x7a})) == ParseStatus::kOk);
  CHECK(request.type == QueryType::kSet);
  CHECK(to_string(request.values.at(0)) == "xyz");
  REQUIRE(parse2(hex({0x07})) == ParseStatus::kOk);
  CHECK(request.type == QueryType::kGetNumKeys);
  REQUIRE(parse2(hex({0x08, 0x01, 0, 0, 0, 0, 0, 0, 0, 0x6b})) == ParseStatus::kOk);
  CHECK(request.type == QueryType::kDeleteKey);
  // What this server does not speak is refused by name.
  CHECK(parse2(hex({0x0e, 0x01, 0, 0, 0, 0, 0, 0, 0, 0x71})) == ParseStatus::kError);
  CHECK_THAT(error, Catch::Contains("QUEUE_PUSH (PyTorch 2.x's query type 14) is not supported"));
  CHECK(parse2(hex({0x11})) == ParseStatus::kError);
  CHECK_THAT(error, Catch::Contains("LIST_KEYS"));
  CHECK(parse2(hex({0x12})) == ParseStatus::kError);
  CHECK_THAT(error, Catch::Contains("unknown query type 18"));
  CHECK(parse2(hex({0x00, 0x01, 0x02, 0x03, 0x04})) == ParseStatus::kError);
  CHECK_THAT(error, Catch::Contains("VALIDATE: magic"));
  // The legacy numbering is unchanged: type 0 with a plain key length is a SET.
  REQUIRE(parse(hex({0x00, 0x01, 0, 0, 0, 0, 0, 0, 0, 0x6b, 0x00, 0, 0, 0, 0, 0, 0, 0}),
                &request, &consumed, &error) == ParseStatus::kOk);
  CHECK(request.type == QueryType::kSet);
}

TEST_CASE("encode_request produces PyTorch's bytes for ADD", "[store][protocol]") {
  Request request{QueryType::kAdd, {"/cnt"}, {}, -7};
  Bytes out;
  encode_request(out, request);
  CHECK(out == hex({0x03, 0x04, 0, 0, 0, 0, 0, 0, 0, 0x2f, 0x63, 0x6e, 0x74,
                    0xf9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}));
}

TEST_CASE("every request type round-trips through encode and parse", "[store][protocol]") {
  std::vector<Request> requests = {
      {QueryType::kSet, {"k"}, {to_bytes("v")}, 0},
      {QueryType::kCompareSet, {"k"}, {to_bytes(""), to_bytes("d")}, 0},
      {QueryType::kGet, {"k"}, {}, 0},
      {QueryType::kAdd, {"k"}, {}, INT64_MIN},
      {QueryType::kCheck, {"a", "b"}, {}, 0},
      {QueryType::kWait, {}, {}, 0},
      {QueryType::kGetNumKeys, {}, {}, 0},
      {QueryType::kWatchKey, {"w"}, {}, 0},
      {QueryType::kDeleteKey, {"d"}, {}, 0},
      {QueryType::kAppend, {"k"}, {to_bytes("tail")}, 0},
      {QueryType::kMultiGet, {"x", "y", ""}, {}, 0},
      {QueryType::kMultiSet, {"x", "y"}, {to_bytes("1"), Bytes{}}, 0},
      {QueryType::kCancelWait, {}, {}, 0},
  };
  for (const auto& original : requests) {
    Bytes wire;
    encode_request(wire, original);
    Request parsed;
    size_t consumed = 0;
    std::string error;
    INFO(query_type_name(static_cast<uint8_t>(original.type)));
    REQUIRE(parse(wire, &parsed, &consumed, &error) == ParseStatus::kOk);
    CHECK(consumed == wire.size());
    CHECK(parsed.type == original.type);
    CHECK(parsed.keys == original.keys);
    CHECK(parsed.values == original.values);
    CHECK(parsed.delta == original.delta);
    // Every strict prefix is incomplete, never an error.
    for (size_t cut = 0; cut < wire.size(); ++cut) {
      Bytes prefix(wire.begin(), wire.begin() + cut);
      size_t needed = 0;
      REQUIRE(parse(prefix, &parsed, &needed, &error) == ParseStatus::kNeedMore);
      CHECK(needed > cut);
      CHECK(needed <= wire.size());
    }
  }
}

TEST_CASE("unknown query types are rejected with a reason", "[store][protocol]") {
  Request request;
  size_t consumed = 0;
  std::string error;
  CHECK(parse(hex({13}), &request, &consumed, &error) == ParseStatus::kError);
  CHECK_THAT(error, Catch::Contains("unknown query type 13"));
  CHECK(parse(hex({0xff}), &request, &consumed, &error) == ParseStatus::kError);
}

TEST_CASE("an absurd length prefix is rejected before any allocation",
          "[store][protocol]") {
  // GET with a key length of 2^60.
  Bytes wire = hex({0x02, 0, 0, 0, 0, 0, 0, 0, 0x10});
  Request request;
  size_t consumed = 0;
  std::string error;
  CHECK(parse(wire, &request, &consumed, &error) == ParseStatus::kError);
  CHECK_THAT(error, Catch::Contains("GET") && Catch::Contains("key length"));
  // A value over a configured limit.
  Limits small;
  small.max_value_bytes = 4;
  Bytes set;
  encode_request(set, Request{QueryType::kSet, {"k"}, {to_bytes("12345")}, 0});
  CHECK(parse(set, &request, &consumed, &error, small) == ParseStatus::kError);
  CHECK_THAT(error, Catch::Contains("value length 5"));
  // A key count over the limit.
  Bytes wait = hex({0x05, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff});
  CHECK(parse(wait, &request, &consumed, &error) == ParseStatus::kError);
  CHECK_THAT(error, Catch::Contains("WAIT") && Catch::Contains("keys"));
}

TEST_CASE("random bytes never crash the parser", "[store][protocol]") {
  std::mt19937 rng(12345);
  for (int round = 0; round < 20000; ++round) {
    Bytes data(rng() % 40);
    for (auto& b : data) b = static_cast<uint8_t>(rng() % 16);
    Request request;
    size_t consumed = 0;
    std::string error;
    ParseStatus status = parse(data, &request, &consumed, &error);
    if (status == ParseStatus::kOk) CHECK(consumed <= data.size());
  }
}
