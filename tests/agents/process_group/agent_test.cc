// ProcessGroupAgent beyond the RpcAgent conformance suite
// (tests/rpc/agent_conformance.h, run over PROCESS_GROUP by
// //tests/rpc:agent_process_group_test): the names and arguments its
// constructor refuses, and its wire format, read and broken by a raw Gloo
// peer. Ranks are threads of this process over one HashStore, Gloo on
// 127.0.0.1.
#include "agents/process_group/agent.h"

#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>

#include "collective/gloo_process_group.h"
#include "common/error.h"
#include "core/message.h"
#include "core/tensor.h"
#include "rpc/future.h"
#include "store/hash_store.h"
#include "store/prefix_store.h"
#include "tests/util/agent_helpers.h"
#include "tests/util/threads.h"

using namespace switchboard;
using namespace std::chrono_literals;
using agents::process_group::ProcessGroupAgent;
using agents::process_group::ProcessGroupAgentOptions;
using rpc::Future;
using rpc::Message;
using rpc::MessageType;
using rpc::WorkerInfo;
using switchboard::testing::echo_handler;
using switchboard::testing::Failure;
using switchboard::testing::on_threads;
using switchboard::testing::request;
using switchboard::testing::rethrow_first;

namespace {

// Bounds every wait for something that must happen.
constexpr std::chrono::milliseconds kGuard = 60s;

ProcessGroupAgentOptions test_options() {
  ProcessGroupAgentOptions options;
  options.hostname = "127.0.0.1";
  options.rpc_timeout = 30s;
  options.num_worker_threads = 4;
  return options;
}

Failure failure_of(const Future<Message>& f) {
  return switchboard::testing::failure_of(f, kGuard);
}

}  // namespace

TEST_CASE("invalid worker names are refused, naming the name",
          "[agents][pg_agent][names]") {
  const std::string name = GENERATE(as<std::string>{}, "", "bad name", "dot.name",
                                    "slash/name", std::string(129, 'x'));
  INFO("name \"" << name << "\"");
  auto store = std::make_shared<HashStore>();
  try {
    ProcessGroupAgent agent(store, name, 0, 1, test_options());
    FAIL("accepted");
  } catch (const std::invalid_argument& e) {
    CHECK_THAT(e.what(),
               Catch::Contains(fmt::format("invalid rpc worker name \"{}\"", name)));
  }
}

TEST_CASE("valid worker names of letters, digits, '_', '-' and ':' are accepted",
          "[agents][pg_agent][names]") {
  const std::string name =
      GENERATE(as<std::string>{}, "trainer:0", "ps-1_A", std::string(128, 'x'));
  auto store = std::make_shared<HashStore>();
  ProcessGroupAgent agent(store, name, 0, 1, test_options());
  CHECK(agent.self() == WorkerInfo{name, 0});
  CHECK(agent.worker(name) == WorkerInfo{name, 0});
}

TEST_CASE("bad constructor arguments are refused", "[agents][pg_agent]") {
  auto store = std::make_shared<HashStore>();
  CHECK_THROWS_AS(ProcessGroupAgent(nullptr, "w", 0, 1, test_options()),
                  std::invalid_argument);
  CHECK_THROWS_AS(ProcessGroupAgent(store, "w", 1, 1, test_options()),
                  std::invalid_argument);
  CHECK_THROWS_AS(ProcessGroupAgent(store, "w", 0, 0, test_options()),
                  std::invalid_argument);
  auto options = test_options();
  options.num_worker_threads = 0;
  CHECK_THROWS_AS(ProcessGroupAgent(store, "w", 0, 1, options), std::invalid_argument);
}

TEST_CASE("a malformed frame fails calls to its sender with ConnectionError",
          "[agents][pg_agent][wire]") {
  namespace wire = agents::process_group::wire;
  const std::string defect =
      GENERATE(as<std::string>{}, "magic", "version", "type", "sizes", "cuda descriptor",
               "cancel with a body");
  INFO("defect: " << defect);
  auto store = std::make_shared<HashStore>();
  std::unique_ptr<ProcessGroupAgent> agent;
  std::unique_ptr<collective::GlooProcessGroup> raw;  // rank 1, speaking bytes
  rethrow_first(on_threads(2, [&](int rank) {
    if (rank == 0) {
      agent = std::make_unique<ProcessGroupAgent>(store, "w0", 0, 2, test_options());
      return;
    }
    store->set(std::string(wire::kNamesKey) + "1", "raw");
    store->wait({std::string(wire::kNamesKey) + "0"}, kGuard);
    collective::GlooOptions options;
    options.group_name = wire::kGroupName;
    options.timeout = kGuard;
    options.hostname = "127.0.0.1";
    PrefixStore prefixed(wire::kStorePrefix, store);
    raw = std::make_unique<collective::GlooProcessGroup>(prefixed, 1, 2, options);
  }));
  agent->start(echo_handler());
  Future<Message> f = agent->send(agent->worker("raw"), request("hello", "pay"), 0ms);

  // The frame as documented: header, then function + payload in one body.
  Tensor header = Tensor::zeros({static_cast<int64_t>(wire::kHeaderSize)}, DType::kUInt8);
  raw->recv(header, 0, wire::kHeaderTag).wait();
  const auto* h = static_cast<const uint8_t*>(header.data());
  CHECK(std::string(reinterpret_cast<const char*>(h), 4) == "SBPG");
  CHECK(h[4] == wire::kVersion);
  CHECK(h[5] == static_cast<uint8_t>(MessageType::kRequest));
  CHECK(h[16] == 5);  // function length
  CHECK(h[24] == 3);  // payload length
  Tensor body = Tensor::zeros({8}, DType::kUInt8);
  raw->recv(body, 0, wire::kDataTag).wait();
  CHECK(std::string(static_cast<const char*>(body.data()), 8) == "hellopay");

  // Answer with a broken header.
  Tensor bad = Tensor::zeros({static_cast<int64_t>(wire::kHeaderSize)}, DType::kUInt8);
  std::memcpy(bad.data(), header.data(), wire::kHeaderSize);
  auto* b = static_cast<uint8_t*>(bad.data());
  b[5] = static_cast<uint8_t>(MessageType::kResponse);
  std::string expected;
  if (defect == "magic") {
    b[0] = 'X';
    expected = "bad magic";
  } else if (defect == "version") {
    b[4] = 99;
    expected = "unsupported version 99";
  } else if (defect == "type") {
    b[5] = 7;
    expected = "unknown message type 7";
  } else if (defect == "sizes") {
    b[19] = 0x7f;  // function length ~2 GiB
    expected = "sizes out of range";
  } else if (defect == "cancel with a body") {
    b[5] = static_cast<uint8_t>(MessageType::kCancel);  // still naming a function
    expected = "a cancel carries nothing, got function length 5";
  }
  Tensor descriptor;
  if (defect == "cuda descriptor") {
    // A response with one float32[1] tensor on cuda:0: PROCESS_GROUP
    // carries CPU tensors only.
    std::memset(b + 16, 0, wire::kHeaderSize - 16);
    b[20] = 1;   // tensor count
    b[32] = 16;  // descriptors length
    descriptor = Tensor::zeros({16}, DType::kUInt8);
    auto* d = static_cast<uint8_t*>(descriptor.data());
    d[0] = static_cast<uint8_t>(DType::kFloat32);
    d[1] = 1;  // device type cuda
    d[4] = 1;  // ndim
    d[8] = 1;  // extent
    expected = "tensor 0: device type 1 (cuda) is not allowed";
  }
  raw->send(bad, 0, wire::kHeaderTag).wait();
  if (descriptor.defined()) raw->send(descriptor, 0, wire::kDataTag).wait();
  Failure failure = failure_of(f);
  CHECK(failure.kind == "ConnectionError");
  CHECK_THAT(failure.message, Catch::Contains("connection to worker \"raw\" lost"));
  CHECK_THAT(failure.message, Catch::Contains("protocol error"));
  CHECK_THAT(failure.message, Catch::Contains(expected));
  agent->shutdown();
  raw.reset();
}

TEST_CASE("a tensor over the descriptor limits fails only its own call",
          "[agents][pg_agent][wire]") {
  auto store = std::make_shared<HashStore>();
  std::unique_ptr<ProcessGroupAgent> agents[2];
  rethrow_first(on_threads(2, [&](int rank) {
    agents[rank] = std::make_unique<ProcessGroupAgent>(store, fmt::format("w{}", rank),
                                                       rank, 2, test_options());
  }));
  for (auto& agent : agents) agent->start(echo_handler());
  const WorkerInfo to = agents[0]->worker("w1");

  Tensor::Shape shape(65, 1);
  Failure failure = failure_of(
      agents[0]->send(to, request("echo", "x", {Tensor::zeros(shape, DType::kFloat32)}), 0ms));
  CHECK(failure.kind == "invalid_argument");
  CHECK_THAT(failure.message, Catch::Contains("tensor 0 has 65 dimensions (the limit is 64)"));

  // The peer is still reachable: the refusal did not fail the connection.
  Future<Message> ok = agents[0]->send(
      to, request("echo", "y", {Tensor::zeros(Tensor::Shape(64, 1), DType::kFloat32)}), 0ms);
  REQUIRE(ok.wait_for(kGuard));
  REQUIRE_FALSE(ok.has_error());
  CHECK(ok.value().tensors.at(0).dim() == 64);
  for (auto& agent : agents) agent->shutdown();
}
