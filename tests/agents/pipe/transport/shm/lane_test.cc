// PIPE's same-host lane (agents/pipe/transport/shm/shm_lane.h): workers of one host
// move their frames through shared memory, tensors larger than the ring
// cross it intact, the lane can be turned off (on one side or both), its
// segments are unmapped with the connections, and a ring a peer corrupts closes the
// connection without harming the process. Workers are RpcContexts on
// threads of this process (one host, one IPC namespace) over a HashStore;
// the lane's segments are seen in /proc/self/maps.
//
// The whole RPC and agent conformance suites run over the lane too
// (rpc_pipe_test, agent_pipe_test: workers on 127.0.0.1 of one host), and
// over TCP alone (rpc_pipe_tcp_test, agent_pipe_tcp_test).
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "common/error.h"
#include "rpc/backend_registry.h"
#include "rpc/rpc.h"
#include "store/hash_store.h"
#include "tests/util/threads.h"

using namespace switchboard;
using namespace std::chrono_literals;
using rpc::RpcContext;
using testing::on_threads;
using testing::rethrow_first;

namespace {

// The lane segments mapped in this process: their start addresses.
std::vector<uintptr_t> lane_mappings() {
  std::vector<uintptr_t> out;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/memfd:switchboard-ring") == std::string::npos) continue;
    out.push_back(std::stoull(line.substr(0, line.find('-')), nullptr, 16));
  }
  return out;
}


std::shared_ptr<rpc::RpcBackendOptions> options(const std::string& shm) {
  return rpc::construct_rpc_backend_options(
      rpc::backend_type("PIPE"), 30s, "env://",
      {{"listen_address", "127.0.0.1"}, {"num_worker_threads", "4"}, {"shm", shm}});
}

// Two workers "w0" and "w1" serving "echo", with the lane setting each.
struct Pair {
  explicit Pair(const std::string& shm0 = "1", const std::string& shm1 = "1") {
    auto store = std::make_shared<HashStore>();
    const std::string shm[2] = {shm0, shm1};
    for (auto& w : workers) {
      w.register_function("echo", [](const Tensor& t) { return t; });
      w.register_function("add", [](int64_t a, int64_t b) { return a + b; });
    }
    rethrow_first(on_threads(2, [&](int rank) {
      workers[rank].init_rpc("w" + std::to_string(rank), "PIPE", rank, 2, options(shm[rank]),
                             store);
    }));
  }
  ~Pair() {
    on_threads(2, [&](int rank) { workers[rank].shutdown(true, 30s); });
  }
  RpcContext workers[2];
};

Tensor pattern(int64_t n, uint8_t seed) {
  Tensor t = Tensor::empty({n}, DType::kUInt8);
  for (int64_t i = 0; i < n; ++i) t.data_as<uint8_t>()[i] = static_cast<uint8_t>(i * 31 + seed);
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("workers of one host move their frames through shared memory, and unmap it when "
          "they stop",
          "[pipe][shm]") {
  REQUIRE(lane_mappings().empty());
  {
    Pair pair;
    CHECK(pair.workers[0].rpc_sync<int64_t>("w1", "add", int64_t{1}, int64_t{2}) == 3);
    CHECK(pair.workers[1].rpc_sync<int64_t>("w0", "add", int64_t{3}, int64_t{4}) == 7);
    // Each direction's ring is mapped by its writer and its reader: both
    // are in this process. The lane comes with the first frames, after
    // the calls' own (they went over TCP).
    CHECK(testing::eventually([] { return lane_mappings().size() == 4; }));
    for (int i = 0; i < 100; ++i) {
      REQUIRE(pair.workers[i % 2].rpc_sync<int64_t>(i % 2 ? "w0" : "w1", "add", int64_t{i},
                                                     int64_t{1}) == i + 1);
    }
  }
  CHECK(lane_mappings().empty());
}

TEST_CASE("tensors larger than the ring cross it intact, both ways at once", "[pipe][shm]") {
  Pair pair;
  // The ring holds 4 MiB: these take many turns of it, mixed with small ones.
  const std::vector<int64_t> sizes = {64 << 20, 1, (5 << 20) + 3, 4 << 20, 4095, 1 << 20};
  std::vector<rpc::Future<Tensor>> echoes;
  std::vector<Tensor> sent;
  for (size_t i = 0; i < sizes.size(); ++i) {
    for (int from = 0; from < 2; ++from) {
      sent.push_back(pattern(sizes[i], static_cast<uint8_t>(i * 2 + from)));
      echoes.push_back(
          pair.workers[from].rpc_async<Tensor>(from ? "w0" : "w1", "echo", sent.back()));
    }
  }
  for (size_t i = 0; i < echoes.size(); ++i) {
    INFO("echo " << i << " of " << sent[i].nbytes() << " bytes");
    CHECK(same_bytes(echoes[i].value(), sent[i]));
  }
  CHECK(lane_mappings().size() == 4);
}

TEST_CASE("the lane is off when either side turns it off; calls go over TCP", "[pipe][shm]") {
  SECTION("both off") {
    Pair pair("0", "0");
    CHECK(pair.workers[0].rpc_sync<int64_t>("w1", "add", int64_t{1}, int64_t{2}) == 3);
    CHECK(pair.workers[1].rpc_sync<int64_t>("w0", "add", int64_t{1}, int64_t{2}) == 3);
    CHECK(same_bytes(pair.workers[0].rpc_sync<Tensor>("w1", "echo", pattern(9 << 20, 1)),
                     pattern(9 << 20, 1)));
    CHECK(lane_mappings().empty());
  }
  SECTION("one side off: it refuses the other's offer") {
    Pair pair("1", "0");
    CHECK(pair.workers[0].rpc_sync<int64_t>("w1", "add", int64_t{1}, int64_t{2}) == 3);
    CHECK(pair.workers[1].rpc_sync<int64_t>("w0", "add", int64_t{1}, int64_t{2}) == 3);
    // w0's offer was refused (its segment removed), and w1 offers none.
    CHECK(same_bytes(pair.workers[0].rpc_sync<Tensor>("w1", "echo", pattern(9 << 20, 2)),
                     pattern(9 << 20, 2)));
    CHECK(lane_mappings().empty());
  }
}

TEST_CASE("a ring the peer corrupts closes the connection, and the process goes on",
          "[pipe][shm][hostile]") {
  Pair pair;
  CHECK(pair.workers[0].rpc_sync<int64_t>("w1", "add", int64_t{1}, int64_t{2}) == 3);
  CHECK(pair.workers[1].rpc_sync<int64_t>("w0", "add", int64_t{1}, int64_t{2}) == 3);
  REQUIRE(testing::eventually([] { return lane_mappings().size() == 4; }));
  // A peer writes positions far beyond what the ring holds into every
  // ring: a head for its reader, a tail for its writer (bytes 64 and 128
  // of the header; docs/wire_formats.md). Whichever side looks next
  // refuses them.
  for (uintptr_t start : lane_mappings()) {
    reinterpret_cast<std::atomic<uint64_t>*>(start + 64)->store(uint64_t{1} << 40);
    reinterpret_cast<std::atomic<uint64_t>*>(start + 128)->store(uint64_t{1} << 41);
  }
  // The next calls find the connection closed: the readers refused the
  // ring. They fail with ConnectionError, never with a crash or a hang.
  auto fails = [&](int from) {
    try {
      (void)pair.workers[from].rpc_sync<int64_t>(from ? "w0" : "w1", "add", int64_t{1},
                                                 int64_t{1});
      return false;
    } catch (const ConnectionError&) {
      return true;
    } catch (const TimeoutError&) {
      return false;
    }
  };
  CHECK(testing::eventually([&] { return fails(0); }));
  CHECK(testing::eventually([&] { return fails(1); }));
}
