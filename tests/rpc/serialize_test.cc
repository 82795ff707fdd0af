// Arguments, results and errors through core/serialize.h and
// core/remote_error.h: round trips of every supported type, tensors out of
// band, the exact mismatch messages, and bad payloads.
#include "core/serialize.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "common/error.h"
#include "core/remote_error.h"

using namespace switchboard;
using namespace switchboard::rpc;

namespace sbtest {

struct Point {
  int64_t x = 0;
  double y = 0;
  std::string label;
  MSGPACK_DEFINE(x, y, label);
  friend bool operator==(const Point&, const Point&) = default;
};

struct Layer {
  std::string name;
  Tensor weight;
  std::optional<Tensor> bias;
  std::vector<Point> anchors;
  MSGPACK_DEFINE_MAP(name, weight, bias, anchors);
};

}  // namespace sbtest

namespace {

template <typename... Args>
Message request_with(const Args&... args) {
  Message m;
  m.function = "f";
  encode_args(m, args...);
  return m;
}

// Encodes `value` as the only argument and decodes it back.
template <typename T>
T round_trip(const T& value) {
  return std::get<0>(decode_args<std::tuple<T>>(request_with(value), "f"));
}

Message raw_payload(const std::vector<uint8_t>& bytes) {
  Message m;
  m.payload = bytes;
  return m;
}

// A CPU tensor whose bytes are 0, 1, 2, ... (mod 251).
Tensor patterned(DType dtype, const Tensor::Shape& shape) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* bytes = static_cast<uint8_t*>(t.data());
  for (size_t i = 0; i < t.nbytes(); ++i) {
    bytes[i] = dtype == DType::kBool ? i % 2 : static_cast<uint8_t>(i % 251);
  }
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

}  // namespace

TEST_CASE("integers of every width round-trip at their limits", "[rpc][serialize]") {
  CHECK(round_trip<int8_t>(-128) == -128);
  CHECK(round_trip<int16_t>(std::numeric_limits<int16_t>::min()) ==
        std::numeric_limits<int16_t>::min());
  CHECK(round_trip<int32_t>(std::numeric_limits<int32_t>::max()) ==
        std::numeric_limits<int32_t>::max());
  CHECK(round_trip<int64_t>(std::numeric_limits<int64_t>::min()) ==
        std::numeric_limits<int64_t>::min());
  CHECK(round_trip<uint8_t>(255) == 255);
  CHECK(round_trip<uint16_t>(65535) == 65535);
  CHECK(round_trip<uint32_t>(std::numeric_limits<uint32_t>::max()) ==
        std::numeric_limits<uint32_t>::max());
  CHECK(round_trip<uint64_t>(std::numeric_limits<uint64_t>::max()) ==
        std::numeric_limits<uint64_t>::max());
}

TEST_CASE("floats, bools and strings round-trip", "[rpc][serialize]") {
  CHECK(round_trip(1.5f) == 1.5f);
  CHECK(round_trip(-2.25e300) == -2.25e300);
  CHECK(round_trip(true) == true);
  CHECK(round_trip(false) == false);
  CHECK(round_trip(std::string()).empty());
  std::string odd("a\0b\xc3\xa9", 5);
  CHECK(round_trip(odd) == odd);
}

TEST_CASE("floats with integral values stay msgpack floats", "[rpc][serialize]") {
  // msgpack-c++ 4.1 would pack these as ints and lose the sign of -0.0.
  CHECK(request_with(2.0).payload ==
        std::vector<uint8_t>{0x91, 0xcb, 0x40, 0, 0, 0, 0, 0, 0, 0});
  CHECK(request_with(1.0f).payload == std::vector<uint8_t>{0x91, 0xca, 0x3f, 0x80, 0, 0});
  CHECK(std::signbit(round_trip(-0.0)));
  CHECK(std::signbit(round_trip(-0.0f)));
  CHECK(std::isnan(round_trip(std::numeric_limits<double>::quiet_NaN())));
  CHECK(round_trip(std::numeric_limits<double>::infinity()) ==
        std::numeric_limits<double>::infinity());
  std::vector<double> values = {0.0, -3.0, 1e300};
  CHECK(round_trip(values) == values);
}

TEST_CASE("several arguments decode into a typed tuple", "[rpc][serialize]") {
  Message m = request_with(int64_t{7}, 2.5, std::string("x"), true);
  auto [a, b, c, d] = decode_args<std::tuple<int64_t, double, std::string, bool>>(m, "f");
  CHECK(a == 7);
  CHECK(b == 2.5);
  CHECK(c == "x");
  CHECK(d);
  CHECK(m.tensors.empty());
  CHECK(decode_args<std::tuple<>>(request_with(), "f") == std::tuple<>());
}

TEST_CASE("bytes travel as msgpack bin and round-trip every byte value",
          "[rpc][serialize]") {
  std::vector<uint8_t> all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<uint8_t>(i));
  Message m = request_with(all);
  CHECK(m.payload.at(1) == 0xc5);  // bin 16 after the fixarray header
  CHECK(std::get<0>(decode_args<std::tuple<std::vector<uint8_t>>>(m, "f")) == all);
  CHECK(round_trip(std::vector<uint8_t>()).empty());
  std::vector<std::byte> b = {std::byte{0}, std::byte{0xff}};
  CHECK(round_trip(b) == b);
}

TEST_CASE("nested vectors, maps, optionals and tuples round-trip", "[rpc][serialize]") {
  std::vector<std::vector<int64_t>> nested = {{1, 2}, {}, {-3}};
  CHECK(round_trip(nested) == nested);
  std::map<std::string, std::vector<double>> by_name = {{"a", {1.0, 2.0}}, {"b", {}}};
  CHECK(round_trip(by_name) == by_name);
  std::unordered_map<int64_t, std::string> by_id = {{1, "one"}, {-2, "minus two"}};
  CHECK(round_trip(by_id) == by_id);
  std::map<std::string, std::map<std::string, int32_t>> deep = {{"x", {{"y", 1}}}};
  CHECK(round_trip(deep) == deep);
  CHECK(round_trip(std::optional<int64_t>()) == std::nullopt);
  CHECK(round_trip(std::optional<int64_t>(5)) == 5);
  std::optional<std::vector<std::string>> names = std::vector<std::string>{"p", "q"};
  CHECK(round_trip(names) == names);
  std::vector<std::optional<bool>> flags = {true, std::nullopt, false};
  CHECK(round_trip(flags) == flags);
  auto tuple = std::make_tuple(int32_t{1}, std::string("two"), 3.0);
  CHECK(round_trip(tuple) == tuple);
  auto pair = std::make_pair(std::string("k"), int64_t{9});
  CHECK(round_trip(pair) == pair);
}

TEST_CASE("user structs with MSGPACK_DEFINE round-trip", "[rpc][serialize]") {
  sbtest::Point p{3, -1.5, "origin"};
  CHECK(round_trip(p) == p);
  std::vector<sbtest::Point> points = {p, {4, 5, "b"}};
  CHECK(round_trip(points) == points);
}

TEST_CASE("tensors of every dtype round-trip out of band without a copy",
          "[rpc][serialize][tensor]") {
  for (DType dtype : kAllDTypes) {
    for (const Tensor::Shape& shape : {Tensor::Shape{2, 3}, Tensor::Shape{0},
                                       Tensor::Shape{4, 0, 2}, Tensor::Shape{}}) {
      INFO(dtype_name(dtype) << shape_str(shape));
      Tensor t = patterned(dtype, shape);
      Message m = request_with(t);
      REQUIRE(m.tensors.size() == 1);
      CHECK(m.tensors[0].data() == t.data());
      Tensor out = std::get<0>(decode_args<std::tuple<Tensor>>(m, "f"));
      CHECK(out.data() == t.data());
      CHECK(out.storage() == t.storage());
      CHECK(same_bytes(out, t));
    }
  }
}

TEST_CASE("a tensor travels as ext 1 holding [index, dtype, shape]",
          "[rpc][serialize][tensor]") {
  Message m = request_with(int64_t{1}, patterned(DType::kInt32, {2, 5}),
                           patterned(DType::kBFloat16, {3}));
  REQUIRE(m.tensors.size() == 2);
  msgpack::object_handle h =
      msgpack::unpack(reinterpret_cast<const char*>(m.payload.data()), m.payload.size());
  const msgpack::object& args = h.get();
  REQUIRE(args.via.array.size == 3);
  for (uint32_t i = 1; i <= 2; ++i) {
    const msgpack::object& ext = args.via.array.ptr[i];
    REQUIRE(ext.type == msgpack::type::EXT);
    CHECK(ext.via.ext.type() == kTensorExtType);
    auto desc = msgpack::unpack(ext.via.ext.data(), ext.via.ext.size)
                    ->as<std::tuple<uint64_t, std::string, std::vector<int64_t>>>();
    CHECK(std::get<0>(desc) == i - 1);
    if (i == 1) {
      CHECK(std::get<1>(desc) == "int32");
      CHECK(std::get<2>(desc) == std::vector<int64_t>{2, 5});
    } else {
      CHECK(std::get<1>(desc) == "bfloat16");
      CHECK(std::get<2>(desc) == std::vector<int64_t>{3});
    }
  }
}

TEST_CASE("tensors inside containers and structs are recorded in order",
          "[rpc][serialize][tensor]") {
  Tensor a = patterned(DType::kFloat32, {2});
  Tensor b = patterned(DType::kInt64, {3, 1});
  Tensor c = patterned(DType::kUInt8, {0});
  std::vector<Tensor> list = {a, b};
  std::map<std::string, Tensor> dict = {{"c", c}};
  std::optional<Tensor> none;
  std::optional<Tensor> some = a;
  sbtest::Layer layer{"fc", b, c, {{1, 2, "p"}}};
  sbtest::Layer no_bias{"out", a, std::nullopt, {}};

  Message m = request_with(list, dict, none, some, layer, no_bias);
  CHECK(m.tensors.size() == 7);
  auto [l, d, n, s, y, z] =
      decode_args<std::tuple<std::vector<Tensor>, std::map<std::string, Tensor>,
                             std::optional<Tensor>, std::optional<Tensor>, sbtest::Layer,
                             sbtest::Layer>>(m, "f");
  REQUIRE(l.size() == 2);
  CHECK(l[0].data() == a.data());
  CHECK(l[1].data() == b.data());
  CHECK(d.at("c").storage() == c.storage());
  CHECK(!n.has_value());
  REQUIRE(s.has_value());
  CHECK(s->data() == a.data());
  CHECK(y.name == "fc");
  CHECK(y.weight.data() == b.data());
  REQUIRE(y.bias.has_value());
  CHECK(y.bias->storage() == c.storage());
  CHECK(y.anchors == std::vector<sbtest::Point>{{1, 2, "p"}});
  CHECK(z.weight.data() == a.data());
  CHECK(!z.bias.has_value());
}

TEST_CASE("a non-contiguous CPU tensor travels as a contiguous clone",
          "[rpc][serialize][tensor]") {
  Tensor base = Tensor::from_vector<int32_t>({0, 1, 2, 3, 4, 5}, {2, 3});
  // The transpose: shape [3, 2], strides [1, 3].
  Tensor transposed = Tensor::from_blob(base.data(), {3, 2}, DType::kInt32, Device::cpu(),
                                        base.storage(), {1, 3});
  REQUIRE(!transposed.is_contiguous());
  Message m = request_with(transposed);
  REQUIRE(m.tensors.size() == 1);
  CHECK(m.tensors[0].is_contiguous());
  CHECK(m.tensors[0].data() != base.data());
  Tensor out = std::get<0>(decode_args<std::tuple<Tensor>>(m, "f"));
  CHECK(out.shape() == Tensor::Shape{3, 2});
  CHECK(out.to_vector<int32_t>() == std::vector<int32_t>{0, 3, 1, 4, 2, 5});
}

TEST_CASE("a CUDA tensor is recorded as is for the agent to move",
          "[rpc][serialize][tensor]") {
  // Never dereferenced: serialization only records the tensor.
  void* fake = reinterpret_cast<void*>(uintptr_t{0x1000});
  Tensor cuda = Tensor::from_blob(fake, {4}, DType::kFloat16, Device::cuda(1), nullptr);
  Message m = request_with(cuda);
  REQUIRE(m.tensors.size() == 1);
  CHECK(m.tensors[0].data() == fake);
  CHECK(m.tensors[0].device() == Device::cuda(1));
  CHECK(std::get<0>(decode_args<std::tuple<Tensor>>(m, "f")).data() == fake);
}

TEST_CASE("an undefined tensor cannot be encoded and the message is unchanged",
          "[rpc][serialize][tensor]") {
  Message m = request_with(int64_t{1});
  const auto before = m.payload;
  CHECK_THROWS_AS(encode_args(m, patterned(DType::kFloat32, {1}), Tensor()),
                  std::invalid_argument);
  CHECK(m.payload == before);
  CHECK(m.tensors.empty());
}

TEST_CASE("a tensor packed by msgpack outside encode_args is refused",
          "[rpc][serialize][tensor]") {
  msgpack::sbuffer buffer;
  CHECK_THROWS_WITH(msgpack::pack(buffer, patterned(DType::kFloat32, {1})),
                    Catch::Contains("encode_args/encode_result"));
}

TEST_CASE("type_name names every supported type", "[rpc][serialize]") {
  CHECK(type_name<int8_t>() == "int8");
  CHECK(type_name<int16_t>() == "int16");
  CHECK(type_name<int32_t>() == "int32");
  CHECK(type_name<int64_t>() == "int64");
  CHECK(type_name<long long>() == "int64");
  CHECK(type_name<uint8_t>() == "uint8");
  CHECK(type_name<uint16_t>() == "uint16");
  CHECK(type_name<uint32_t>() == "uint32");
  CHECK(type_name<uint64_t>() == "uint64");
  CHECK(type_name<float>() == "float32");
  CHECK(type_name<double>() == "float64");
  CHECK(type_name<bool>() == "bool");
  CHECK(type_name<std::string>() == "str");
  CHECK(type_name<const std::string&>() == "str");
  CHECK(type_name<std::vector<uint8_t>>() == "bytes");
  CHECK(type_name<std::vector<std::byte>>() == "bytes");
  CHECK(type_name<std::vector<char>>() == "bytes");
  CHECK(type_name<Tensor>() == "tensor");
  CHECK(type_name<std::vector<std::vector<double>>>() == "list[list[float64]]");
  CHECK(type_name<std::map<std::string, Tensor>>() == "dict[str, tensor]");
  CHECK(type_name<std::unordered_map<int32_t, bool>>() == "dict[int32, bool]");
  CHECK(type_name<std::optional<std::vector<int64_t>>>() == "optional[list[int64]]");
  CHECK(type_name<std::tuple<int64_t, std::string>>() == "tuple[int64, str]");
  CHECK(type_name<std::pair<bool, float>>() == "tuple[bool, float32]");
  CHECK(type_name<sbtest::Point>() == "sbtest::Point");
  CHECK(type_name<std::vector<sbtest::Point>>() == "list[sbtest::Point]");
}

TEST_CASE("received_type_name describes msgpack values", "[rpc][serialize]") {
  auto name_of = [](const auto& value) {
    msgpack::zone zone;
    return received_type_name(msgpack::object(value, zone));
  };
  CHECK(name_of(msgpack::type::nil_t()) == "nil");
  CHECK(name_of(true) == "bool");
  CHECK(name_of(-3) == "int");
  CHECK(name_of(3u) == "int");
  CHECK(name_of(1.5f) == "float");
  CHECK(name_of(1.5) == "float");
  CHECK(name_of(std::string("s")) == "str");
  CHECK(name_of(std::vector<int>{}) == "list[]");
  CHECK(name_of(std::vector<int>{1, 2}) == "list[int]");
  CHECK(name_of(std::make_tuple(1, std::string("a"), 2)) == "list[int | str]");
  CHECK(name_of(std::map<std::string, int>{}) == "dict[]");
  CHECK(name_of(std::map<std::string, std::vector<double>>{{"a", {1.0}}}) ==
        "dict[str, list[float]]");
  Message m = request_with(std::vector<uint8_t>{1}, patterned(DType::kFloat32, {1}));
  msgpack::object_handle h =
      msgpack::unpack(reinterpret_cast<const char*>(m.payload.data()), m.payload.size());
  CHECK(received_type_name(h.get()) == "list[bin | tensor]");
}

TEST_CASE("wrong arity fails naming the function, expected and received types",
          "[rpc][serialize][errors]") {
  Message m = request_with(int64_t{1});
  CHECK_THROWS_MATCHES(
      (decode_args<std::tuple<int64_t, double>>(m, "add")), ArgumentError,
      Catch::Message("function \"add\" expects (int64, float64), received (int)"));
  CHECK_THROWS_MATCHES((decode_args<std::tuple<>>(m, "ping")), ArgumentError,
                       Catch::Message("function \"ping\" expects (), received (int)"));
}

TEST_CASE("wrong argument types fail naming the function, expected and received types",
          "[rpc][serialize][errors]") {
  CHECK_THROWS_MATCHES(
      (decode_args<std::tuple<int64_t, double>>(
          request_with(int64_t{1}, std::string("x")), "add")),
      ArgumentError,
      Catch::Message("function \"add\" expects (int64, float64), received (int, str)"));
  CHECK_THROWS_MATCHES((decode_args<std::tuple<std::vector<int64_t>, Tensor>>(
                           request_with(std::vector<std::string>{"a"}, 2.5), "scale")),
                       ArgumentError,
                       Catch::Message("function \"scale\" expects (list[int64], tensor), "
                                      "received (list[str], float)"));
  CHECK_THROWS_MATCHES(
      (decode_args<std::tuple<sbtest::Point>>(request_with(true), "move")), ArgumentError,
      Catch::Message("function \"move\" expects (sbtest::Point), received (bool)"));
  CHECK_THROWS_MATCHES(
      (decode_args<std::tuple<std::string>>(request_with(patterned(DType::kInt8, {1})),
                                            "echo")),
      ArgumentError,
      Catch::Message("function \"echo\" expects (str), received (tensor)"));
}

TEST_CASE("an integer out of the parameter's range is a type mismatch",
          "[rpc][serialize][errors]") {
  CHECK_THROWS_MATCHES((decode_args<std::tuple<int8_t>>(request_with(int64_t{300}), "f")),
                       ArgumentError,
                       Catch::Message("function \"f\" expects (int8), received (int)"));
  CHECK_THROWS_AS((decode_args<std::tuple<uint32_t>>(request_with(int64_t{-1}), "f")),
                  ArgumentError);
  CHECK_THROWS_MATCHES(
      (decode_args<std::tuple<int64_t>>(request_with(1.0), "f")), ArgumentError,
      Catch::Message("function \"f\" expects (int64), received (float)"));
}

TEST_CASE("an int is accepted where a float is expected", "[rpc][serialize]") {
  CHECK(std::get<0>(decode_args<std::tuple<double>>(request_with(int64_t{3}), "f")) ==
        3.0);
}

TEST_CASE("a payload that is not an argument array is an ArgumentError",
          "[rpc][serialize][errors]") {
  Message m;
  encode_result(m, int64_t{4});
  CHECK_THROWS_MATCHES(
      (decode_args<std::tuple<int64_t>>(m, "f")), ArgumentError,
      Catch::Message("function \"f\" expects (int64), received int (not an array of "
                     "arguments)"));
}

TEST_CASE("malformed payloads are SerializationErrors, not crashes",
          "[rpc][serialize][errors]") {
  using Args = std::tuple<int64_t>;
  // Empty, truncated array, truncated str, trailing bytes, reserved byte 0xc1.
  for (const std::vector<uint8_t>& bytes :
       {std::vector<uint8_t>{}, std::vector<uint8_t>{0x92, 0x01},
        std::vector<uint8_t>{0x91, 0xa5, 'a'}, std::vector<uint8_t>{0x91, 0x01, 0x01},
        std::vector<uint8_t>{0x91, 0xc1}}) {
    Message m = raw_payload(bytes);
    CHECK_THROWS_WITH((decode_args<Args>(m, "f")),
                      Catch::StartsWith("arguments of function \"f\": "));
    CHECK_THROWS_AS((decode_args<Args>(m, "f")), SerializationError);
  }
  // Nesting deeper than the limit.
  std::vector<uint8_t> deep(1000, 0x91);
  deep.push_back(0xc0);
  CHECK_THROWS_AS((decode_args<Args>(raw_payload(deep), "f")), SerializationError);
}

TEST_CASE("a bad tensor descriptor is a SerializationError", "[rpc][serialize][errors]") {
  Message m = request_with(patterned(DType::kFloat32, {2}));
  Message missing = m;
  missing.tensors.clear();
  CHECK_THROWS_MATCHES(
      (decode_args<std::tuple<Tensor>>(missing, "f")), SerializationError,
      Catch::Message("arguments of function \"f\": tensor descriptor refers to tensor 0 "
                     "but the message carries 0"));
  Message other = m;
  other.tensors[0] = patterned(DType::kInt64, {2});
  CHECK_THROWS_MATCHES(
      (decode_args<std::tuple<Tensor>>(other, "f")), SerializationError,
      Catch::Message(
          "arguments of function \"f\": tensor descriptor 0 says float32[2] but "
          "the message carries int64[2] on cpu"));
  // An ext 1 whose body is not a descriptor.
  Message junk = raw_payload({0x91, 0xd4, 0x01, 0x07});
  junk.tensors.push_back(patterned(DType::kFloat32, {2}));
  CHECK_THROWS_WITH((decode_args<std::tuple<Tensor>>(junk, "f")),
                    Catch::Contains("malformed tensor descriptor"));
}

TEST_CASE("results round-trip, void as nil", "[rpc][serialize]") {
  Message m;
  m.type = MessageType::kResponse;
  Tensor t = patterned(DType::kFloat64, {2, 2});
  encode_result(m, std::make_tuple(std::string("ok"), t));
  CHECK(m.type == MessageType::kResponse);
  auto [s, out] = decode_result<std::tuple<std::string, Tensor>>(m, "f");
  CHECK(s == "ok");
  CHECK(out.data() == t.data());

  encode_result(m);
  CHECK(m.payload == std::vector<uint8_t>{0xc0});
  CHECK(m.tensors.empty());
  decode_result<void>(m, "f");
  CHECK(decode_result<std::optional<int64_t>>(m) == std::nullopt);
}

TEST_CASE("a result of the wrong type names the function and both types",
          "[rpc][serialize][errors]") {
  Message m;
  m.type = MessageType::kResponse;
  encode_result(m, std::string("no"));
  CHECK_THROWS_MATCHES(decode_result<double>(m, "add"), SerializationError,
                       Catch::Message("result of function \"add\": expected float64, "
                                      "received str"));
  CHECK_THROWS_MATCHES(decode_result<void>(m), SerializationError,
                       Catch::Message("result: expected nil, received str"));
}

TEST_CASE("decode_result of an error response throws the RemoteError",
          "[rpc][serialize][errors]") {
  Message m;
  encode_remote_error(m, "w1", "std::runtime_error", "boom");
  CHECK(m.type == MessageType::kError);
  CHECK_THROWS_MATCHES(decode_result<int64_t>(m, "f"), RemoteError,
                       Catch::Message("worker \"w1\" raised std::runtime_error: boom"));
}

TEST_CASE("remote errors round-trip with worker, type, message and code",
          "[rpc][serialize][errors]") {
  Message m;
  m.tensors.push_back(patterned(DType::kFloat32, {1}));
  encode_remote_error(m, "trainer3", "std::invalid_argument", "bad lr");
  CHECK(m.type == MessageType::kError);
  CHECK(m.tensors.empty());
  RemoteError e = decode_remote_error(m);
  CHECK(e.worker() == "trainer3");
  CHECK(e.type_name() == "std::invalid_argument");
  CHECK(e.remote_message() == "bad lr");
  CHECK(e.code() == ErrorCode::kFailedPrecondition);
  CHECK(std::string(e.what()) ==
        "worker \"trainer3\" raised std::invalid_argument: bad lr");

  encode_remote_error(m, "w2", std::make_exception_ptr(TimeoutError("waited 5 ms")));
  RemoteError timeout = decode_remote_error(m);
  CHECK(timeout.type_name() == "switchboard::TimeoutError");
  CHECK(timeout.code() == ErrorCode::kDeadlineExceeded);
  CHECK(timeout.remote_message() == "waited 5 ms");
}

TEST_CASE("the error payload is a msgpack map readable without this library",
          "[rpc][serialize][errors]") {
  Message m;
  encode_remote_error(m, "w", "T", "msg", ErrorCode::kNotFound);
  msgpack::object_handle h =
      msgpack::unpack(reinterpret_cast<const char*>(m.payload.data()), m.payload.size());
  auto map = h->as<std::map<std::string, msgpack::object>>();
  CHECK(map.at("worker").as<std::string>() == "w");
  CHECK(map.at("type").as<std::string>() == "T");
  CHECK(map.at("message").as<std::string>() == "msg");
  CHECK(map.at("code").as<std::string>() == "NotFound");
}

TEST_CASE("describe_exception names the dynamic type of any exception",
          "[rpc][serialize][errors]") {
  struct Local : std::runtime_error {
    using std::runtime_error::runtime_error;
  };
  ExceptionInfo a = describe_exception(std::make_exception_ptr(std::out_of_range("idx")));
  CHECK(a.type_name == "std::out_of_range");
  CHECK(a.message == "idx");
  CHECK(!a.code.has_value());
  std::exception_ptr base;
  try {
    throw ArgumentError("x");
  } catch (const std::exception&) {
    base = std::current_exception();
  }
  ExceptionInfo b = describe_exception(base);
  CHECK(b.type_name == "switchboard::rpc::ArgumentError");
  CHECK(b.code == ErrorCode::kFailedPrecondition);
  ExceptionInfo c = describe_exception(std::make_exception_ptr(42));
  CHECK(c.type_name == "int");
  CHECK(c.message == "(not a std::exception)");
  CHECK_THAT(describe_exception(std::make_exception_ptr(Local("l"))).type_name,
             Catch::Contains("Local"));
}

TEST_CASE("a malformed error payload is a SerializationError",
          "[rpc][serialize][errors]") {
  Message not_map;
  encode_result(not_map, int64_t{1});
  CHECK_THROWS_MATCHES(decode_remote_error(not_map), SerializationError,
                       Catch::Message("error payload: expected a map, received int"));
  Message missing;
  missing.payload = {0x80};  // {}
  CHECK_THROWS_MATCHES(decode_remote_error(missing), SerializationError,
                       Catch::Message("error payload: no \"worker\""));
}
