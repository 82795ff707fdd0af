// FunctionRegistry: typed registration, dispatch, and every failure arriving
// as an error response that decodes into a RemoteError.
#include "rpc/function_registry.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "rpc/future.h"
#include "core/remote_error.h"
#include "core/serialize.h"

using namespace switchboard;
using namespace switchboard::rpc;

namespace sbtest {

struct Pose {
  std::string frame;
  std::vector<double> xyz;
  Tensor covariance;
  MSGPACK_DEFINE(frame, xyz, covariance);
};

class QuotaExceeded : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

int64_t triple(int64_t x) { return 3 * x; }

}  // namespace sbtest

namespace {

const WorkerInfo kCaller{"caller", 1};

template <typename... Args>
Message request(std::string function, const Args&... args) {
  Message m;
  m.type = MessageType::kRequest;
  m.id = 42;
  m.function = std::move(function);
  encode_args(m, args...);
  return m;
}

// Calls a synchronous function: the response is ready at once.
template <typename... Args>
Message call_now(const FunctionRegistry& registry, std::string function,
                 const Args&... args) {
  Future<Message> response =
      registry.call(request(std::move(function), args...), kCaller);
  REQUIRE(response.done());
  return response.value();
}

// The RemoteError an error response carries.
RemoteError remote_error(const Message& response) {
  REQUIRE(response.type == MessageType::kError);
  return decode_remote_error(response);
}

}  // namespace

TEST_CASE("a registered lambda is called with decoded arguments", "[rpc][registry]") {
  FunctionRegistry registry("w1");
  registry.register_function("add", [](int64_t a, double b) { return a + b; });
  Message response = call_now(registry, "add", int64_t{2}, 0.5);
  CHECK(response.type == MessageType::kResponse);
  CHECK(response.id == 42);
  CHECK(response.function.empty());
  CHECK(decode_result<double>(response, "add") == 2.5);
}

TEST_CASE("function pointers, std::function and reference parameters are deduced",
          "[rpc][registry]") {
  FunctionRegistry registry("w1");
  registry.register_function("triple", &sbtest::triple);
  registry.register_function("triple_ref", sbtest::triple);
  registry.register_function(
      "concat", std::function<std::string(const std::string&, std::string&&)>(
                    [](const std::string& a, std::string&& b) { return a + b; }));
  auto owned = std::make_unique<int64_t>(10);
  registry.register_function("move_only",
                             [p = std::move(owned)](const int64_t& x) { return *p + x; });
  int64_t calls = 0;
  registry.register_function("count", [calls]() mutable { return ++calls; });

  CHECK(decode_result<int64_t>(call_now(registry, "triple", int64_t{5})) == 15);
  CHECK(decode_result<int64_t>(call_now(registry, "triple_ref", int64_t{-1})) == -3);
  CHECK(decode_result<std::string>(call_now(registry, "concat", std::string("ab"),
                                            std::string("cd"))) == "abcd");
  CHECK(decode_result<int64_t>(call_now(registry, "move_only", int64_t{1})) == 11);
  CHECK(decode_result<int64_t>(call_now(registry, "count")) == 1);
  CHECK(decode_result<int64_t>(call_now(registry, "count")) == 2);
}

TEST_CASE("void functions run and answer with a nil result", "[rpc][registry]") {
  FunctionRegistry registry("w1");
  std::atomic<int64_t> total{0};
  registry.register_function("accumulate", [&total](int64_t x) { total += x; });
  registry.register_function("ping", [] {});
  Message response = call_now(registry, "accumulate", int64_t{7});
  CHECK(response.type == MessageType::kResponse);
  CHECK(response.payload == std::vector<uint8_t>{0xc0});
  decode_result<void>(response);
  CHECK(total == 7);
  decode_result<void>(call_now(registry, "ping"));
}

TEST_CASE("tensors and structs pass through a function without copies",
          "[rpc][registry][tensor]") {
  FunctionRegistry registry("w1");
  registry.register_function(
      "first_row", [](const std::vector<Tensor>& ts) { return ts.at(0).narrow0(0, 1); });
  registry.register_function("describe", [](sbtest::Pose pose) {
    return std::make_tuple(pose.frame, pose.xyz.size(), pose.covariance);
  });

  Tensor t = Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2});
  Message response = call_now(registry, "first_row", std::vector<Tensor>{t});
  Tensor row = decode_result<Tensor>(response);
  CHECK(row.data() == t.data());
  CHECK(row.to_vector<float>() == std::vector<float>{1, 2});

  sbtest::Pose pose{"map", {1.0, 2.0, 3.0}, t};
  auto [frame, n, cov] = decode_result<std::tuple<std::string, uint64_t, Tensor>>(
      call_now(registry, "describe", pose));
  CHECK(frame == "map");
  CHECK(n == 3);
  CHECK(cov.storage() == t.storage());
}

TEST_CASE("a call with the wrong arity arrives as a RemoteError naming the types",
          "[rpc][registry][errors]") {
  FunctionRegistry registry("w1");
  registry.register_function("add", [](int64_t a, double b) { return a + b; });
  RemoteError e = remote_error(call_now(registry, "add", int64_t{1}));
  CHECK(e.worker() == "w1");
  CHECK(e.type_name() == "switchboard::rpc::ArgumentError");
  CHECK(e.remote_message() ==
        "function \"add\" expects (int64, float64), received (int)");
  CHECK(e.code() == ErrorCode::kFailedPrecondition);
  CHECK(std::string(e.what()) ==
        "worker \"w1\" raised switchboard::rpc::ArgumentError: function \"add\" expects "
        "(int64, float64), received (int)");
}

TEST_CASE("a call with wrong types arrives as a RemoteError naming the types",
          "[rpc][registry][errors]") {
  FunctionRegistry registry("w1");
  registry.register_function("add", [](int64_t a, double b) { return a + b; });
  registry.register_function("scale", [](Tensor t, std::vector<double> f) { return t; });
  RemoteError e = remote_error(call_now(registry, "add", int64_t{1}, std::string("x")));
  CHECK(e.type_name() == "switchboard::rpc::ArgumentError");
  CHECK(e.remote_message() ==
        "function \"add\" expects (int64, float64), received (int, str)");
  RemoteError f = remote_error(call_now(registry, "scale", std::vector<std::string>{"a"},
                                        Tensor::zeros({1}, DType::kInt8)));
  CHECK(
      f.remote_message() ==
      "function \"scale\" expects (tensor, list[float64]), received (list[str], tensor)");
}

TEST_CASE("calling an unknown function names it and the worker",
          "[rpc][registry][errors]") {
  FunctionRegistry registry("w1");
  Message response = call_now(registry, "foo", int64_t{1});
  CHECK(response.id == 42);
  RemoteError e = remote_error(response);
  CHECK(e.type_name() == "switchboard::NotFoundError");
  CHECK(e.remote_message() == "worker \"w1\" has no function \"foo\"");
  CHECK(e.code() == ErrorCode::kNotFound);
}

TEST_CASE("registering a name twice is a RegistryError naming it",
          "[rpc][registry][errors]") {
  FunctionRegistry registry("w1");
  registry.register_function("f", [] { return 1; });
  CHECK_THROWS_MATCHES(registry.register_function("f", [] { return 2; }), RegistryError,
                       Catch::Message("function \"f\" is already registered on worker "
                                      "\"w1\""));
  CHECK(decode_result<int>(call_now(registry, "f")) == 1);
  CHECK_THROWS_AS(registry.register_function("", [] {}), std::invalid_argument);
}

TEST_CASE("has_function and functions list what is registered", "[rpc][registry]") {
  FunctionRegistry registry("w1");
  CHECK(registry.functions().empty());
  registry.register_function("zeta", [] {});
  registry.register_function("alpha", [](int x) { return x; });
  CHECK(registry.has_function("alpha"));
  CHECK(!registry.has_function("beta"));
  CHECK(registry.functions() == std::vector<std::string>{"alpha", "zeta"});
  CHECK(registry.worker_name() == "w1");
}

TEST_CASE("an exception thrown by the function arrives with its type and message",
          "[rpc][registry][errors]") {
  FunctionRegistry registry("w1");
  registry.register_function("boom", []() -> int { throw std::runtime_error("boom"); });
  registry.register_function("quota", [](std::string user) {
    throw sbtest::QuotaExceeded("quota of " + user + " exceeded");
  });
  registry.register_function("slow", [] { throw TimeoutError("store wait: 5 ms"); });
  registry.register_function("odd", [] { throw 42; });

  RemoteError boom = remote_error(call_now(registry, "boom"));
  CHECK(boom.worker() == "w1");
  CHECK(boom.type_name() == "std::runtime_error");
  CHECK(boom.remote_message() == "boom");
  CHECK(std::string(boom.what()) == "worker \"w1\" raised std::runtime_error: boom");
  CHECK_THROWS_AS(decode_result<int>(call_now(registry, "boom")), RemoteError);

  RemoteError quota = remote_error(call_now(registry, "quota", std::string("ann")));
  CHECK(quota.type_name() == "sbtest::QuotaExceeded");
  CHECK(quota.remote_message() == "quota of ann exceeded");
  CHECK(quota.code() == ErrorCode::kFailedPrecondition);

  RemoteError slow = remote_error(call_now(registry, "slow"));
  CHECK(slow.type_name() == "switchboard::TimeoutError");
  CHECK(slow.code() == ErrorCode::kDeadlineExceeded);

  RemoteError odd = remote_error(call_now(registry, "odd"));
  CHECK(odd.type_name() == "int");
}

TEST_CASE("a result that cannot be encoded arrives as an error",
          "[rpc][registry][errors]") {
  FunctionRegistry registry("w1");
  registry.register_function("undefined", [] { return Tensor(); });
  RemoteError e = remote_error(call_now(registry, "undefined"));
  CHECK(e.type_name() == "std::invalid_argument");
  CHECK_THAT(e.remote_message(), Catch::Contains("undefined tensor"));
}

TEST_CASE("a malformed request and a non-request answer with errors",
          "[rpc][registry][errors]") {
  FunctionRegistry registry("w1");
  registry.register_function("f", [](int64_t x) { return x; });
  Message bad = request("f", int64_t{1});
  bad.payload = {0x91};  // an array whose element is missing
  Future<Message> response = registry.call(bad, kCaller);
  RemoteError e = remote_error(response.value());
  CHECK(e.type_name() == "switchboard::rpc::SerializationError");
  CHECK_THAT(e.remote_message(), Catch::StartsWith("arguments of function \"f\": "));

  Message not_request = request("f", int64_t{1});
  not_request.type = MessageType::kResponse;
  CHECK(remote_error(registry.call(not_request, kCaller).value()).type_name() ==
        "std::invalid_argument");
}

TEST_CASE("an async function's response completes when its future does",
          "[rpc][registry][async]") {
  FunctionRegistry registry("w1");
  Promise<int64_t> promise;
  std::atomic<int> started{0};
  registry.register_function("later", [&](int64_t x) {
    ++started;
    return promise.get_future().then(
        [x](const Future<int64_t>& f) { return f.value() + x; });
  });
  Future<Message> response = registry.call(request("later", int64_t{1}), kCaller);
  CHECK(started == 1);
  CHECK(!response.done());
  CHECK(promise.set_value(41));
  REQUIRE(response.wait_for(std::chrono::seconds(10)));
  CHECK(response.value().type == MessageType::kResponse);
  CHECK(response.value().id == 42);
  CHECK(decode_result<int64_t>(response.value()) == 42);
}

TEST_CASE("an async function's failed future arrives as a RemoteError",
          "[rpc][registry][async][errors]") {
  FunctionRegistry registry("w1");
  Promise<std::string> promise;
  registry.register_function("later", [&] { return promise.get_future(); });
  Future<Message> response = registry.call(request("later"), kCaller);
  CHECK(!response.done());
  promise.set_error(std::make_exception_ptr(sbtest::QuotaExceeded("no more")));
  REQUIRE(response.wait_for(std::chrono::seconds(10)));
  RemoteError e = remote_error(response.value());
  CHECK(e.type_name() == "sbtest::QuotaExceeded");
  CHECK(e.remote_message() == "no more");
  CHECK(response.value().id == 42);
}

TEST_CASE("async functions may return Future<void>, ready futures or tensors",
          "[rpc][registry][async]") {
  FunctionRegistry registry("w1");
  Promise<void> done;
  registry.register_function("wait_done", [&] { return done.get_future(); });
  registry.register_function("ready",
                             [](int64_t x) { return Future<int64_t>::ready(x * 2); });
  registry.register_function("tensor", [](Tensor t) { return Future<Tensor>::ready(t); });
  registry.register_function("invalid", [] { return Future<int>(); });

  Future<Message> waiting = registry.call(request("wait_done"), kCaller);
  CHECK(!waiting.done());
  done.set_value();
  REQUIRE(waiting.wait_for(std::chrono::seconds(10)));
  decode_result<void>(waiting.value());

  CHECK(decode_result<int64_t>(call_now(registry, "ready", int64_t{21})) == 42);

  Tensor t = Tensor::from_vector<double>({1.0, 2.0});
  CHECK(decode_result<Tensor>(call_now(registry, "tensor", t)).data() == t.data());

  RemoteError e = remote_error(call_now(registry, "invalid"));
  CHECK(e.type_name() == "std::invalid_argument");
  CHECK(e.remote_message() == "function \"invalid\" returned an invalid Future");
}

TEST_CASE("functions can be registered while other threads call",
          "[rpc][registry][threads]") {
  FunctionRegistry registry("w1");
  registry.register_function("echo", [](int64_t x) { return x; });
  std::atomic<bool> failed{false};
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&, t] {
      for (int64_t i = 0; i < 200; ++i) {
        Message r = registry.call(request("echo", i + t), kCaller).value();
        if (decode_result<int64_t>(r) != i + t) failed = true;
        registry.has_function("f" + std::to_string(i));
      }
    });
  }
  for (int i = 0; i < 200; ++i) {
    registry.register_function("f" + std::to_string(i), [i] { return i; });
  }
  for (auto& c : callers) c.join();
  CHECK(!failed);
  CHECK(registry.functions().size() == 201);
}

TEST_CASE("a raw function serves the request as it came and its answer becomes the response",
          "[rpc][registry]") {
  FunctionRegistry registry("w1");
  std::string seen_caller;
  registry.register_raw_function("raw", [&](const Message& req) {
    seen_caller = current_call() != nullptr ? current_call()->caller.name : "";
    Message answer;
    answer.type = MessageType::kRequest;  // made right by the registry
    answer.id = 7;
    answer.function = "ignored";
    answer.payload.assign(req.payload.rbegin(), req.payload.rend());
    answer.tensors = req.tensors;
    return Future<Message>::ready(std::move(answer));
  });
  Message in;
  in.type = MessageType::kRequest;
  in.id = 42;
  in.function = "raw";
  in.payload = {1, 2, 3};
  in.tensors = {Tensor::from_vector(std::vector<float>{1, 2})};
  Future<Message> out = registry.call(in, kCaller);
  REQUIRE(out.done());
  const Message response = out.value();
  CHECK(response.type == MessageType::kResponse);
  CHECK(response.id == 42);
  CHECK(response.function.empty());
  CHECK(response.payload == std::vector<uint8_t>{3, 2, 1});
  REQUIRE(response.tensors.size() == 1);
  CHECK(response.tensors[0].data() == in.tensors[0].data());  // not copied
  CHECK(seen_caller == "caller");

  SECTION("a pending answer completes the response later") {
    auto promise = std::make_shared<Promise<Message>>();
    registry.register_raw_function("later", [promise](const Message&) {
      return promise->get_future();
    });
    in.function = "later";
    Future<Message> pending = registry.call(in, kCaller);
    CHECK_FALSE(pending.done());
    Message answer;
    answer.payload = {9};
    promise->set_value(std::move(answer));
    REQUIRE(pending.done());
    CHECK(pending.value().type == MessageType::kResponse);
    CHECK(pending.value().id == 42);
    CHECK(pending.value().payload == std::vector<uint8_t>{9});
  }
  SECTION("a throw, or a failed answer, is an error response naming the worker") {
    registry.register_raw_function(
        "throws", [](const Message&) -> Future<Message> { throw sbtest::QuotaExceeded("no room"); });
    registry.register_raw_function("fails", [](const Message&) {
      return Future<Message>::failed(std::make_exception_ptr(std::runtime_error("later, no")));
    });
    in.function = "throws";
    RemoteError thrown = remote_error(registry.call(in, kCaller).value());
    CHECK(thrown.worker() == "w1");
    CHECK(thrown.remote_message() == "no room");
    in.function = "fails";
    CHECK(remote_error(registry.call(in, kCaller).value()).remote_message() == "later, no");
  }
  SECTION("names are checked as for typed functions") {
    CHECK_THROWS_AS(registry.register_raw_function("raw", [](const Message& m) {
      return Future<Message>::ready(m);
    }),
                    RegistryError);
    CHECK_THROWS_AS(registry.register_raw_function("empty", nullptr), std::invalid_argument);
  }
}
