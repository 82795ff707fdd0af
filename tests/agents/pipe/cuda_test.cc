// CUDA tensors through the PIPE agent: staged to the CPU by the sender,
// placed on the mapped device by the receiver, sent back along the
// reverse map.
//
// One source, two binaries:
//   pipe_cuda_test       registers a stand-in CUDA runtime (two "devices"
//                        whose memory is host memory, counting every copy)
//                        through core/tensor.h's hooks, and a stand-in
//                        DeviceIpc (tests/agents/pipe/fake_device_ipc.h) that
//                        lets the two workers of this process use the
//                        cuda_ipc channel, so the whole path runs on any
//                        machine;
//   pipe_cuda_gpu_test   (SB_REAL_CUDA) links //core:cuda_allocator and
//                        runs the same cases on real GPUs; each case prints
//                        "skipped: <reason>" and returns where none is
//                        visible.
// Workers are RpcContexts on threads over one HashStore, on 127.0.0.1.
#include <fmt/format.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "agents/builtin_backends.h"
#include "agents/pipe/channel/cuda_staged/staging.h"
#include "common/error.h"
#include "core/remote_error.h"
#include "core/tensor.h"
#include "rpc/backend_registry.h"
#include "rpc/rpc.h"
#include "store/hash_store.h"
#include "tests/util/threads.h"

#ifdef SB_REAL_CUDA
#include "core/cuda_allocator.h"
#else
#include "tests/agents/pipe/fake_device_ipc.h"
#endif

using namespace switchboard;
using namespace std::chrono_literals;
using rpc::RpcContext;
using testing::on_threads;
using testing::rethrow_first;

namespace {

constexpr std::chrono::milliseconds kGuard = 60s;

// ---- the CUDA runtime under test ------------------------------------------------

#ifdef SB_REAL_CUDA

int device_count() { return cuda_device_count(); }
std::string unavailable_reason() { return cuda_unavailable_reason(); }
int64_t copies() { return -1; }  // not counted on real GPUs

#else

constexpr int kFakeDevices = 2;
std::atomic<int64_t> fake_copies{0};
std::atomic<int64_t> fake_pins{0};
// Copies from the host onto a device of fewer bytes than DeviceLanding's
// kMinCopyBytes (each costs a GPU context switch on a real one).
std::atomic<int64_t> fake_small_h2d{0};

// "Device" memory is host memory tagged with a CUDA device; copies are
// memcpy. Allocation fails like cudaMalloc for a device that does not exist.
void install_fake_runtime() {
  set_device_counter([] { return kFakeDevices; });
  set_device_allocator([](size_t nbytes, Device device) -> std::shared_ptr<void> {
    if (!device.is_cuda() || device.index < 0 || device.index >= kFakeDevices) {
      throw Error(ErrorCode::kFailedPrecondition,
                  fmt::format("fake cudaMalloc on {}: no such device", device.str()));
    }
    void* p = std::aligned_alloc(64, std::max<size_t>(64, (nbytes + 63) / 64 * 64));
    if (p == nullptr) throw std::bad_alloc();
    return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  });
  set_host_pinner({[](void*, size_t) {
                     ++fake_pins;
                     return true;
                   },
                   [](void*) {}});
  set_device_copier([](const Tensor& dst, const Tensor& src) {
    REQUIRE(dst.nbytes() == src.nbytes());
    REQUIRE(!(dst.device().is_cpu() && src.device().is_cpu()));
    ++fake_copies;
    if (src.device().is_cpu() &&
        src.nbytes() < agents::pipe::channel::DeviceLanding::kMinCopyBytes)
      ++fake_small_h2d;
    if (src.nbytes() > 0) std::memcpy(dst.data(), src.data(), src.nbytes());
  });
}

const auto fake_ipc = std::make_shared<sbtest::FakeDeviceIpc>(kFakeDevices);
const bool kInstalled = (install_fake_runtime(), set_device_ipc(fake_ipc), true);

int device_count() { return kFakeDevices; }
std::string unavailable_reason() { return ""; }
int64_t copies() { return fake_copies.load(); }

#endif

// True (after printing why) when fewer than `needed` devices are visible.
bool skip_unless_devices(int needed) {
  const int count = device_count();
  if (count >= needed) return false;
  const std::string reason =
      count == 0 ? unavailable_reason()
                 : fmt::format("needs {} CUDA devices, {} visible", needed, count);
  WARN("skipped: " << reason);
  fmt::print("skipped: {}\n", reason);
  return true;
}

// The device w1 uses: cuda:1 where there are two devices, else cuda:0.
Device remote_device() { return Device::cuda(std::min(1, device_count() - 1)); }

// A float32 tensor of `n` elements 0, 1, 2, ... on `device`.
Tensor iota_on(int64_t n, Device device) {
  std::vector<float> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = static_cast<float>(i);
  return Tensor::from_vector(values, {n}).to(device);
}

std::vector<float> values_of(const Tensor& t) {
  return t.to(Device::cpu()).to_vector<float>();
}

agents::PipeRpcBackendOptions& typed(
    const std::shared_ptr<rpc::RpcBackendOptions>& options) {
  return dynamic_cast<agents::PipeRpcBackendOptions&>(*options);
}

// Two PIPE workers "w0" and "w1". w0 maps its cuda:0 to w1's
// remote_device(); w1 has no map of its own (its replies travel along the
// reverse map). `w1_device_count` overrides what w1 validates against.
// Both serve:
//   "scale"   (Tensor t, double k) -> t * k on t's device, after checking
//             that t arrived on `expect_device`;
//   "where"   (Tensor t) -> t's device as a string;
//   "mixed"   (Tensor cpu, Tensor cuda) -> the two devices, "cpu|cuda:N";
//   "make"    (int64 n) -> iota on remote_device();
//   "refuse"  (Tensor t) -> throws, naming t.
// `cuda_ipc`: each worker's "cuda_ipc" option ("0", "1"; "" for the
// default).
struct Pair {
  // `w1_extras`: more of w1's options; `more` registers more functions.
  explicit Pair(int w1_device_count = -1, Device w0_target = remote_device(),
                std::vector<std::string> cuda_ipc = {"", ""}, rpc::Extras w1_extras = {},
                const std::function<void(RpcContext&)>& more = nullptr) {
    auto store = std::make_shared<HashStore>();
    for (int rank = 0; rank < 2; ++rank) {
      contexts.push_back(std::make_unique<RpcContext>());
      RpcContext& c = *contexts[rank];
      c.register_function("scale", [](Tensor t, double k) {
        std::vector<float> v = values_of(t);
        for (float& x : v) x = static_cast<float>(x * k);
        return Tensor::from_vector(v, t.shape()).to(t.device());
      });
      c.register_function("where", [](Tensor t) { return t.device().str(); });
      c.register_function("mixed", [](Tensor a, Tensor b) {
        return a.device().str() + "|" + b.device().str();
      });
      c.register_function("make", [](int64_t n) { return iota_on(n, remote_device()); });
      c.register_function("add", [](int64_t a, int64_t b) { return a + b; });
      if (more) more(c);
      c.register_function("refuse", [](Tensor t) -> int64_t {
        throw std::runtime_error(fmt::format("refused {}", t.describe()));
      });
    }
    rethrow_first(on_threads(2, [&](int rank) {
      rpc::Extras extras{{"listen_address", "127.0.0.1"}, {"num_worker_threads", "4"}};
      if (rank == 1 && w1_device_count >= 0) {
        extras["device_count"] = std::to_string(w1_device_count);
      }
      if (!cuda_ipc[rank].empty()) extras["cuda_ipc"] = cuda_ipc[rank];
      if (rank == 1) {
        for (const auto& [key, value] : w1_extras) extras[key] = value;
      }
      auto options = rpc::construct_rpc_backend_options(rpc::backend_type("PIPE"), 30s,
                                                        "env://", extras);
      if (rank == 0) typed(options).set_device_map("w1", {{"cuda:0", w0_target.str()}});
      contexts[rank]->init_rpc(fmt::format("w{}", rank), "PIPE", rank, 2, options, store);
    }));
  }
  ~Pair() {
    on_threads(2, [&](int rank) { contexts[rank]->shutdown(true, kGuard); });
  }
  RpcContext& operator[](int rank) { return *contexts[rank]; }

  std::vector<std::unique_ptr<RpcContext>> contexts;
};

}  // namespace

TEST_CASE(
    "a mapped CUDA tensor arrives on the mapped device and its reply comes back on "
    "the caller's device",
    "[pipe][cuda]") {
  if (skip_unless_devices(1)) return;
  Pair pair;
  const int64_t before = copies();
  const Tensor t = iota_on(1000, Device::cuda(0));
  CHECK(pair[0].rpc_sync<std::string>("w1", "where", t) == remote_device().str());
  const Tensor scaled = pair[0].rpc_sync<Tensor>("w1", "scale", t, 2.0);
  // Back along w1's reverse map: remote_device() -> cuda:0.
  CHECK(scaled.device() == Device::cuda(0));
  const std::vector<float> got = values_of(scaled);
  REQUIRE(got.size() == 1000);
  for (size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == 2.0f * static_cast<float>(i));
  if (copies() >= 0) {
    // where: stage + place; scale: stage + place, the handler's two, stage
    // and place of the reply; plus this test's own iota and values_of.
    CHECK(copies() - before >= 8);
  }
}

TEST_CASE("CPU tensors stay on the CPU next to a mapped CUDA tensor", "[pipe][cuda]") {
  if (skip_unless_devices(1)) return;
  Pair pair;
  const Tensor cpu = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3});
  const Tensor cuda = iota_on(3, Device::cuda(0));
  CHECK(pair[0].rpc_sync<std::string>("w1", "mixed", cpu, cuda) ==
        "cpu|" + remote_device().str());
}

TEST_CASE("a 32 MiB CUDA tensor round-trips intact, staged and by cuda_ipc",
          "[pipe][cuda]") {
  if (skip_unless_devices(1)) return;
  const std::string ipc = GENERATE("0", "1");
  Pair pair(-1, remote_device(), {ipc, ipc});
  const int64_t n = 8 << 20;  // 32 MiB of float32
  const Tensor t = iota_on(n, Device::cuda(0));
  const Tensor back = pair[0].rpc_sync<Tensor>("w1", "scale", t, 1.0);
  CHECK(back.device() == Device::cuda(0));
  const std::vector<float> got = values_of(back);
  REQUIRE(got.size() == static_cast<size_t>(n));
  bool same = true;
  for (int64_t i = 0; i < n && same; i += 4099) same = got[i] == static_cast<float>(i);
  CHECK(same);
  CHECK(got.back() == static_cast<float>(n - 1));
}

TEST_CASE("a CUDA tensor made by the handler travels back along the reverse map",
          "[pipe][cuda]") {
  if (skip_unless_devices(1)) return;
  Pair pair;
  const Tensor made = pair[0].rpc_sync<Tensor>("w1", "make", int64_t{5});
  CHECK(made.device() == Device::cuda(0));
  CHECK(values_of(made) == std::vector<float>{0, 1, 2, 3, 4});
  // w1 calling w0 with a CUDA tensor has no map of its own: refused, naming
  // the worker and the device, and the pair keeps working.
  auto call = pair[1].rpc_async<std::string>("w0", "where", iota_on(2, remote_device()));
  std::string message;
  try {
    call.value();
    FAIL("w1 sent a CUDA tensor without a device map");
  } catch (const std::invalid_argument& e) {
    message = e.what();
  }
  CHECK_THAT(message, Catch::Contains("\"w0\""));
  CHECK_THAT(message, Catch::Contains(remote_device().str()));
  CHECK(pair[1].rpc_sync<int64_t>("w0", "add", int64_t{2}, int64_t{3}) == 5);
}

#ifndef SB_REAL_CUDA
// A device the receiver validated against (its device_count option) but
// cannot allocate on: the handler never runs, the caller gets the
// receiver's error naming the device, and the pair keeps working.
TEST_CASE("a tensor for a device the receiver cannot allocate on fails that call only",
          "[pipe][cuda]") {
  Pair pair(/*w1_device_count=*/3, /*w0_target=*/Device::cuda(2));
  auto call = pair[0].rpc_async<std::string>("w1", "where", iota_on(4, Device::cuda(0)));
  std::string message;
  try {
    call.value();
    FAIL("the call succeeded although w1 cannot allocate on cuda:2");
  } catch (const rpc::RemoteError& e) {
    message = e.what();
  }
  CHECK_THAT(message, Catch::Contains("cuda:2"));
  CHECK(pair[0].rpc_sync<int64_t>("w1", "add", int64_t{20}, int64_t{22}) == 42);
  CHECK(pair[0].rpc_sync<std::string>(
            "w1", "where", Tensor::from_vector(std::vector<float>{1}, {1})) == "cpu");
}

// A float32 tensor of `n` elements k, k+1, ... on `device`.
Tensor pattern_on(int64_t n, float k, Device device) {
  std::vector<float> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    values[static_cast<size_t>(i)] = k + static_cast<float>(i);
  return Tensor::from_vector(values, {n}).to(device);
}

TEST_CASE(
    "CUDA tensors between workers of one host go device to device through outboxes, "
    "each mapped once",
    "[pipe][cuda][cuda_ipc]") {
  Pair pair;
  const int made = fake_ipc->outboxes_made, opens = fake_ipc->opens,
            fills = fake_ipc->fills, drains = fake_ipc->drains;
  for (int k = 0; k < 5; ++k) {
    const Tensor t =
        pattern_on(256 << 10, static_cast<float>(k), Device::cuda(0));  // 1 MiB
    const Tensor back = pair[0].rpc_sync<Tensor>("w1", "scale", t, 2.0);
    CHECK(back.device() == Device::cuda(0));
    const std::vector<float> got = values_of(back);
    REQUIRE(got.size() == 256u << 10);
    CHECK(got[0] == 2.0f * static_cast<float>(k));
    CHECK(got.back() ==
          2.0f * (static_cast<float>(k) + static_cast<float>((256 << 10) - 1)));
  }
  // Each call: the request into w0's outbox, the reply into w1's.
  CHECK(fake_ipc->fills - fills == 10);
  CHECK(fake_ipc->drains - drains == 10);
  // One outbox each way, exported and mapped once, reused for every call.
  CHECK(fake_ipc->outboxes_made - made == 2);
  CHECK(fake_ipc->opens - opens == 2);
  CHECK(pair[0].rpc_sync<std::string>("w1", "where",
                                      pattern_on(1 << 20, 0, Device::cuda(0))) ==
        remote_device().str());
}

TEST_CASE(
    "small CUDA tensors, and workers that turned CUDA IPC off, take the staged path",
    "[pipe][cuda][cuda_ipc]") {
  const int fills = fake_ipc->fills;
  SECTION("a tensor under the outbox threshold") {
    Pair pair;
    const Tensor back =
        pair[0].rpc_sync<Tensor>("w1", "scale", pattern_on(16, 1, Device::cuda(0)), 3.0);
    CHECK(values_of(back)[15] == 48.0f);
  }
  SECTION("the receiver has it off") {
    Pair pair(-1, remote_device(), {"", "0"});
    const Tensor back = pair[0].rpc_sync<Tensor>(
        "w1", "scale", pattern_on(1 << 20, 1, Device::cuda(0)), 1.0);
    CHECK(values_of(back)[(1 << 20) - 1] == static_cast<float>(1 << 20));
  }
  SECTION("the sender has it off") {
    Pair pair(-1, remote_device(), {"0", ""});
    const Tensor back = pair[0].rpc_sync<Tensor>(
        "w1", "scale", pattern_on(1 << 20, 1, Device::cuda(0)), 1.0);
    CHECK(values_of(back)[0] == 1.0f);
  }
  CHECK(fake_ipc->fills == fills);
}

TEST_CASE(
    "concurrent calls each take an outbox of their own or the staged path, and no "
    "outbox is refilled before it was released",
    "[pipe][cuda][cuda_ipc]") {
  const int made = fake_ipc->outboxes_made;
  {
    Pair pair;
    constexpr int kCalls = 32;
    constexpr int64_t kN = 256 << 10;  // 1 MiB each (cuda_ipc from 512 KiB)
    std::vector<rpc::Future<Tensor>> calls;
    for (int k = 0; k < kCalls; ++k) {
      calls.push_back(pair[0].rpc_async<Tensor>(
          "w1", "scale",
          pattern_on(kN, static_cast<float>(k) * 100000.0f, Device::cuda(0)), 1.0));
    }
    for (int k = 0; k < kCalls; ++k) {
      const std::vector<float> got = values_of(calls[static_cast<size_t>(k)].value());
      REQUIRE(got.size() == static_cast<size_t>(kN));
      bool same = true;
      for (int64_t i = 0; i < kN && same; i += 97) {
        same = got[static_cast<size_t>(i)] ==
               static_cast<float>(k) * 100000.0f + static_cast<float>(i);
      }
      CHECK(same);
    }
    // At most four outboxes per connection and device, each way.
    CHECK(fake_ipc->outboxes_made - made <= 8);
  }
  // Nothing is left once the workers are gone: every outbox freed, every
  // mapping closed.
  CHECK(fake_ipc->outboxes_alive == 0);
  CHECK(fake_ipc->inboxes_alive == 0);
}

TEST_CASE(
    "small CUDA tensors land on the device in one padded copy from a pinned buffer, "
    "pinned once",
    "[pipe][cuda]") {
  Pair pair;  // cuda_ipc on: these are under its threshold, so staged
  const int64_t small_before = fake_small_h2d, pins_before = fake_pins;
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1000}, int64_t{4000}, int64_t{8191}}) {
    const Tensor back =
        pair[0].rpc_sync<Tensor>("w1", "scale", pattern_on(n, 2, Device::cuda(0)), 2.0);
    CHECK(back.device() == Device::cuda(0));
    REQUIRE(back.numel() == n);
    const std::vector<float> got = values_of(back);
    for (int64_t i = 0; i < n; i += 997) CHECK(got[static_cast<size_t>(i)] == 2 * (2.0f + i));
    if (n > 0) CHECK(got.back() == 2 * (2.0f + static_cast<float>(n - 1)));
  }
  // Received request and reply each land padded: no small copy onto a
  // device but the test's own (pattern_on, the handler's result).
  CHECK(fake_small_h2d - small_before == 2 * 5);
  // The padded buffers are pinned once and reused: a few more may be pinned
  // when a call's buffer is not yet back in the cache as the next call
  // needs one (its release is asynchronous), but not one per call (without
  // the cache's small pinned buffers, 2 or more per call: 64 and up).
  const int64_t pins_after_first = fake_pins;
  CHECK(pins_after_first - pins_before <= 8);
  for (int k = 0; k < 32; ++k)
    (void)pair[0].rpc_sync<Tensor>("w1", "scale", pattern_on(100, 0, Device::cuda(0)), 1.0);
  CHECK(fake_pins - pins_after_first <= 8);
}

TEST_CASE("staged CUDA tensors go through pinned buffers, pinned once and reused",
          "[pipe][cuda]") {
  Pair pair(-1, remote_device(), {"0", "0"});
  const int64_t n = 1 << 20;  // 4 MiB
  const int64_t before = fake_pins;
  for (int k = 0; k < 4; ++k) {
    const Tensor back = pair[0].rpc_sync<Tensor>(
        "w1", "scale", pattern_on(n, static_cast<float>(k), Device::cuda(0)), 1.0);
    CHECK(values_of(back)[n - 1] == static_cast<float>(k + n - 1));
  }
  // Each side pins its staging buffers for the first call (the request
  // staged and received, the reply staged and received) and reuses them.
  const int64_t pinned = fake_pins - before;
  CHECK(pinned >= 2);
  CHECK(pinned <= 8);
  const int64_t after_first_four = fake_pins;
  for (int k = 0; k < 4; ++k) {
    (void)pair[0].rpc_sync<Tensor>("w1", "scale", pattern_on(n, 0, Device::cuda(0)), 1.0);
  }
  CHECK(fake_pins == after_first_four);
  // A tensor of 8 MiB or more is copied off the device in 4 MiB chunks as
  // the connection sends it, and onto the device in 4 MiB chunks as it
  // arrives: for 16 MiB, 4 + 4 for the request and 4 + 4 for the reply,
  // where staging at once would copy once each. The other three: the
  // handler's two and this test's values_of.
  const Tensor big = pattern_on(4 << 20, 0, Device::cuda(0));
  const int64_t copies_before = fake_copies;
  const Tensor back = pair[0].rpc_sync<Tensor>("w1", "scale", big, 1.0);
  CHECK(values_of(back)[(4 << 20) - 1] == static_cast<float>((4 << 20) - 1));
  // Received, each lands on its device in 4 MiB chunks as it arrives.
  CHECK(fake_copies - copies_before ==
        (4 + 4) * 2 + 3);  // pattern_on ran before the count
}

// ---- channel conformance: what every tensor channel promises ----------------
//
// Run over each channel a tensor can take between two workers of this
// process: cpu (CPU tensors), cuda_staged (CUDA tensors with cuda_ipc off)
// and cuda_ipc (the stand-in DeviceIpc). Tensors of every size arrive
// intact both ways, several in one message; concurrent calls keep their
// own bytes; a call whose handler throws gives back what its tensors held;
// and the channel the counters show is the one configured.

enum class Channel { kCpu, kStaged, kIpc };

const char* channel_name(Channel c) {
  return c == Channel::kCpu ? "cpu" : c == Channel::kStaged ? "cuda_staged" : "cuda_ipc";
}

struct ChannelPair {
  explicit ChannelPair(Channel c)
      : channel(c),
        pair(-1, remote_device(),
             c == Channel::kStaged ? std::vector<std::string>{"0", "0"}
                                   : std::vector<std::string>{"", ""}) {}
  Device device() const {
    return channel == Channel::kCpu ? Device::cpu() : Device::cuda(0);
  }
  Channel channel;
  Pair pair;
};

TEST_CASE(
    "channel conformance: tensors of every size arrive intact both ways, several in "
    "one message",
    "[pipe][channel]") {
  const Channel channel = GENERATE(Channel::kCpu, Channel::kStaged, Channel::kIpc);
  INFO("channel " << channel_name(channel));
  ChannelPair p(channel);
  for (int64_t n :
       {int64_t{0}, int64_t{1}, int64_t{1000}, int64_t{64} << 10, int64_t{4} << 20}) {
    INFO(n << " floats");
    const Tensor back =
        p.pair[0].rpc_sync<Tensor>("w1", "scale", pattern_on(n, 7, p.device()), 2.0);
    CHECK(back.device() == p.device());
    const std::vector<float> got = values_of(back);
    REQUIRE(got.size() == static_cast<size_t>(n));
    bool same = true;
    for (int64_t i = 0; i < n && same; i += 257) same = got[i] == 2.0f * (7.0f + i);
    CHECK(same);
    if (n > 0) CHECK(got.back() == 2.0f * (7.0f + static_cast<float>(n - 1)));
  }
  const Tensor cpu = pattern_on(3, 0, Device::cpu());
  CHECK(p.pair[0].rpc_sync<std::string>("w1", "mixed", cpu,
                                        pattern_on(1 << 20, 0, p.device())) ==
        "cpu|" + (channel == Channel::kCpu ? std::string("cpu") : remote_device().str()));
}

TEST_CASE("channel conformance: concurrent calls keep their own bytes",
          "[pipe][channel]") {
  const Channel channel = GENERATE(Channel::kCpu, Channel::kStaged, Channel::kIpc);
  INFO("channel " << channel_name(channel));
  ChannelPair p(channel);
  constexpr int kCalls = 24;
  constexpr int64_t kN = 128 << 10;  // 512 KiB each: cuda_ipc's smallest
  std::vector<rpc::Future<Tensor>> calls;
  for (int k = 0; k < kCalls; ++k) {
    calls.push_back(p.pair[0].rpc_async<Tensor>(
        "w1", "scale", pattern_on(kN, static_cast<float>(k) * 100000.0f, p.device()),
        1.0));
  }
  for (int k = 0; k < kCalls; ++k) {
    const std::vector<float> got = values_of(calls[static_cast<size_t>(k)].value());
    REQUIRE(got.size() == static_cast<size_t>(kN));
    bool same = true;
    for (int64_t i = 0; i < kN && same; i += 101) {
      same = got[static_cast<size_t>(i)] ==
             static_cast<float>(k) * 100000.0f + static_cast<float>(i);
    }
    CHECK(same);
  }
}

TEST_CASE(
    "channel conformance: a call whose handler throws gives back what its tensors held, "
    "and the channel in use is the one configured",
    "[pipe][channel]") {
  const Channel channel = GENERATE(Channel::kCpu, Channel::kStaged, Channel::kIpc);
  INFO("channel " << channel_name(channel));
  const int made = fake_ipc->outboxes_made, fills = fake_ipc->fills;
  const int64_t copies_before = fake_copies, pins_before = fake_pins;
  {
    ChannelPair p(channel);
    for (int k = 0; k < 12; ++k) {
      auto call = p.pair[0].rpc_async<int64_t>("w1", "refuse",
                                               pattern_on(1 << 18, 0, p.device()));
      CHECK_THROWS_WITH(call.value(), Catch::Contains("refused"));
    }
    // Nothing stayed held: more calls than outboxes still take the channel.
    for (int k = 0; k < 12; ++k) {
      const Tensor back = p.pair[0].rpc_sync<Tensor>(
          "w1", "scale", pattern_on(1 << 18, 1, p.device()), 1.0);
      CHECK(values_of(back)[5] == 6.0f);
    }
    switch (channel) {
      case Channel::kCpu:
        CHECK(fake_ipc->fills == fills);
        CHECK(fake_copies == copies_before);  // no device copy at all
        break;
      case Channel::kStaged:
        CHECK(fake_ipc->fills == fills);
        CHECK(fake_pins > pins_before);
        break;
      case Channel::kIpc:
        CHECK(fake_ipc->fills - fills ==
              12 + 24);  // refused requests, requests and replies
        CHECK(fake_ipc->outboxes_made - made == 2);  // one each way, never stuck
        break;
    }
  }
  CHECK(fake_ipc->outboxes_alive == 0);
  CHECK(fake_ipc->inboxes_alive == 0);
}

TEST_CASE("a request refused before it ran gives back the outboxes its tensors held",
          "[pipe][cuda][cuda_ipc]") {
  auto gate = std::make_shared<testing::Gate>(kGuard);
  Pair pair(-1, remote_device(), {"", ""}, {{"max_requests_per_peer", "1"}},
            [gate](RpcContext& c) {
              c.register_function("gated", [gate](Tensor t) {
                gate->pass();
                return t.numel();
              });
            });
  // One request takes w1's only place for w0 and waits there.
  auto held =
      pair[0].rpc_async<int64_t>("w1", "gated", pattern_on(1 << 18, 0, Device::cuda(0)));
  REQUIRE(gate->wait_arrived(1));
  // Six more are refused at once by the per-caller limit, each with its
  // tensor in one of w0's four outboxes.
  for (int k = 0; k < 6; ++k) {
    auto refused = pair[0].rpc_async<Tensor>(
        "w1", "scale", pattern_on(1 << 18, 1, Device::cuda(0)), 1.0);
    CHECK_THROWS_WITH(refused.value(), Catch::Contains("max_requests_per_peer"));
  }
  gate->open();
  CHECK(held.value() == 1 << 18);
  // Their outboxes came back: the next calls still go by cuda_ipc, each
  // filling an outbox with its request and one with its reply (a held
  // outbox would leave the requests staged).
  const int fills = fake_ipc->fills;
  for (int k = 0; k < 6; ++k) {
    const Tensor back = pair[0].rpc_sync<Tensor>(
        "w1", "scale", pattern_on(1 << 18, 2, Device::cuda(0)), 1.0);
    CHECK(values_of(back)[7] == 9.0f);
  }
  CHECK(fake_ipc->fills - fills == 12);
}
#endif
