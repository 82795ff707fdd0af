// PipeAgent beyond the RPC conformance suite (tests/rpc/rpc_pipe_test.cc
// runs that): peers that die (SIGKILL) or stop answering (SIGSTOP) in real
// processes, bytes that are not the protocol on a raw socket, the listen
// address rules, join() with a nested chain in flight, and many threads
// writing at once. Device maps are in pipe_device_test.cc, dynamic groups
// in pipe_dynamic_test.cc, floods and the call context in
// pipe_calls_test.cc, the job secret in pipe_auth_test.cc.
//
// In-process workers are RpcContexts (or PipeAgents) on threads over one
// HashStore; multi-process cases re-execute this binary (SB_CHILD_MAIN) and
// meet through a TcpStoreServer on 127.0.0.1, port 0. Nothing here sleeps
// hoping for an order: the test waits on the child's stdout lines, on
// futures, on a Gate a handler blocks on, all bounded by kGuard. The only
// tight timing assertion is the requirement that a killed peer's
// calls fail within 1 s of the kill.
#include "agents/pipe/agent.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "agents/builtin_backends.h"
#include "agents/pipe/address.h"
#include "agents/pipe/wire/frame.h"
#include "common/error.h"
#include "common/mutex.h"
#include "core/remote_error.h"
#include "core/tensor.h"
#include "rpc/backend_registry.h"
#include "rpc/call_context.h"
#include "rpc/rpc.h"
#include "store/hash_store.h"
#include "store/tcp_store.h"
#include "store/tcp_store_server.h"
#include "tests/util/scoped_env.h"
#include "tests/util/subprocess.h"
#include "tests/util/threads.h"

using namespace switchboard;
using namespace std::chrono_literals;
using agents::pipe::PipeAgent;
using agents::pipe::PipeAgentOptions;
using rpc::Future;
using rpc::Message;
using rpc::MessageType;
using rpc::RpcContext;
using rpc::with_timeout;
using rpc::WorkerInfo;
using sbtest::Subprocess;
using switchboard::testing::Gate;
using switchboard::testing::on_threads;
using switchboard::testing::rethrow_first;
using Clock = std::chrono::steady_clock;

#include "tests/agents/pipe/test_util.h"

using namespace switchboard::pipe_test;


// ---- a PIPE worker in its own process ---------------------------------------

// args: store port, rank, world size, heartbeat_interval_ms,
// heartbeat_timeout_ms. Joins the group as "w<rank>", says "ready", serves
// "add" and "block" (which says "running" and then waits on a gate nobody
// opens), and stays up until killed or until the store key "release" is set.
SB_CHILD_MAIN(pipe_worker) {
  const auto port = static_cast<uint16_t>(std::stoi(args.at(0)));
  const int rank = std::stoi(args.at(1));
  const int world_size = std::stoi(args.at(2));
  auto store = std::make_shared<TcpStore>("127.0.0.1", port, client_options());
  auto never = std::make_shared<Gate>(kGuard);
  RpcContext context;
  context.register_function("add", [](int64_t a, int64_t b) { return a + b; });
  context.register_function("block", [never] {
    say("running");
    never->pass();
    return int64_t{0};
  });
  context.init_rpc(worker_name(rank), "PIPE", rank, world_size,
                   pipe_options({{"heartbeat_interval_ms", args.at(3)},
                                 {"heartbeat_timeout_ms", args.at(4)}}),
                   store);
  say("ready");
  TcpStore waiter("127.0.0.1", port, client_options());
  waiter.wait({"release"}, kGuard);
  context.shutdown(false);
  return 0;
}

// ---- 1. a peer killed mid-call ------------------------------------------------

TEST_CASE(
    "a peer killed with SIGKILL mid-call fails the call within 1 s naming it, and the "
    "agent keeps serving the others",
    "[pipe][failure][multiprocess]") {
  TcpStoreServer server;
  const std::string port = std::to_string(server.port());
  // w1 is the child; w0 and w2 live here. The parent's heartbeat check is
  // off: only the closed socket can fail the call in time.
  Subprocess child = sbtest::spawn_child("pipe_worker", {port, "1", "3", "250", "5000"});
  auto options = pipe_options({{"heartbeat_timeout_ms", "0"}});
  RpcContext contexts[2];  // w0, w2
  for (auto& context : contexts) {
    context.register_function("add", [](int64_t a, int64_t b) { return a + b; });
  }
  rethrow_first(on_threads(2, [&](int i) {
    const int rank = i == 0 ? 0 : 2;
    auto store = std::make_shared<TcpStore>("127.0.0.1", server.port(), client_options());
    contexts[i].init_rpc(worker_name(rank), "PIPE", rank, 3, options, store);
  }));
  RpcContext& w0 = contexts[0];
  RpcContext& w2 = contexts[1];
  expect_line(child, "ready");

  Future<int64_t> call = w0.rpc_async<int64_t>("w1", "block", with_timeout(60s));
  expect_line(child, "running");
  const auto killed_at = Clock::now();
  child.kill(SIGKILL);
  const Outcome outcome = outcome_of(call);
  const auto after_kill =
      std::chrono::duration_cast<std::chrono::milliseconds>(outcome.at - killed_at);
  INFO(outcome.kind << " " << after_kill.count() << " ms after the kill: "
                    << outcome.message);
  WARN("case 1: the call to the killed worker failed " << after_kill.count()
                                                       << " ms after SIGKILL");
  CHECK(outcome.kind == "ConnectionError");
  CHECK_THAT(outcome.message, Catch::Contains("\"w1\""));
  CHECK_THAT(outcome.message, Catch::Contains("block"));
  CHECK(after_kill < 1s);
  CHECK(child.wait() == 128 + SIGKILL);

  // The agent still serves (and reaches) the third worker, both ways.
  CHECK(w0.rpc_sync<int64_t>("w2", "add", with_timeout(kGuard), int64_t{2},
                             int64_t{3}) == 5);
  CHECK(w2.rpc_sync<int64_t>("w0", "add", with_timeout(kGuard), int64_t{4},
                             int64_t{5}) == 9);
  // A new call to the dead worker fails at once, from either survivor.
  for (RpcContext* from : {&w0, &w2}) {
    const auto start = Clock::now();
    const Outcome again = outcome_of(
        from->rpc_async<int64_t>("w1", "add", with_timeout(60s), int64_t{1}, int64_t{2}));
    INFO(again.kind << ": " << again.message);
    CHECK(again.kind == "ConnectionError");
    CHECK_THAT(again.message, Catch::Contains("\"w1\""));
    CHECK(again.at - start < 5s);
  }
  w0.shutdown(false);
  w2.shutdown(false);
}

// ---- a rank that never arrives ---------------------------------------------------

TEST_CASE(
    "a static group whose rank 2 never arrives fails init_rpc on the others within "
    "rpc_timeout, naming rank 2, though their store waits a minute per call",
    "[pipe][failure]") {
  TcpStoreServer server;
  constexpr auto kRpcTimeout = 2s;
  std::vector<std::string> failures(2);
  const auto began = Clock::now();
  rethrow_first(on_threads(2, [&](int rank) {
    RpcContext context;
    auto store = std::make_shared<TcpStore>("127.0.0.1", server.port(), client_options());
    try {
      context.init_rpc(worker_name(rank), "PIPE", rank, 3, pipe_options({}, kRpcTimeout), store);
      failures[rank] = "none";
    } catch (const TimeoutError& e) {
      failures[rank] = e.what();
    }
  }));
  const auto took = Clock::now() - began;
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank << ": " << failures[rank]);
    CHECK_THAT(failures[rank], Catch::Contains("ranks [2] did not arrive within"));
  }
  // One bound for the whole init; a second for the machine.
  CHECK(took < kRpcTimeout + 1s);
}

// ---- 2. a peer that stops answering -------------------------------------------

TEST_CASE(
    "a peer stopped with SIGSTOP fails a pending call with ConnectionError after the "
    "heartbeat timeout",
    "[pipe][failure][heartbeat][multiprocess]") {
  TcpStoreServer server;
  Subprocess child = sbtest::spawn_child(
      "pipe_worker", {std::to_string(server.port()), "1", "2", "100", "1000"});
  RpcContext w0;
  auto store = std::make_shared<TcpStore>("127.0.0.1", server.port(), client_options());
  w0.init_rpc("w0", "PIPE", 0, 2,
              pipe_options({{"heartbeat_interval_ms", "100"},
                            {"heartbeat_timeout_ms", "1000"}}),
              store);
  expect_line(child, "ready");
  // The connection works before the stop.
  REQUIRE(w0.rpc_sync<int64_t>("w1", "add", with_timeout(kGuard), int64_t{1},
                               int64_t{1}) == 2);

  child.kill(SIGSTOP);
  int status = 0;
  REQUIRE(::waitpid(child.pid(), &status, WUNTRACED) == child.pid());
  REQUIRE(WIFSTOPPED(status));
  const auto stopped_at = Clock::now();
  Future<int64_t> call =
      w0.rpc_async<int64_t>("w1", "add", with_timeout(60s), int64_t{1}, int64_t{2});
  const Outcome outcome = outcome_of(call);
  const auto after_stop =
      std::chrono::duration_cast<std::chrono::milliseconds>(outcome.at - stopped_at);
  INFO(outcome.kind << " " << after_stop.count() << " ms after the stop: "
                    << outcome.message);
  WARN("case 2: the call to the stopped worker failed " << after_stop.count()
                                                        << " ms after SIGSTOP");
  CHECK(outcome.kind == "ConnectionError");
  CHECK_THAT(outcome.message, Catch::Contains("\"w1\""));
  CHECK_THAT(outcome.message, Catch::Contains("heartbeat"));
  CHECK(after_stop < 5s);
  // Later calls fail at once.
  const Outcome again = outcome_of(
      w0.rpc_async<int64_t>("w1", "add", with_timeout(60s), int64_t{1}, int64_t{2}));
  CHECK(again.kind == "ConnectionError");
  CHECK_THAT(again.message, Catch::Contains("heartbeat"));

  child.kill(SIGKILL);
  CHECK(child.wait() == 128 + SIGKILL);
  w0.shutdown(false);
}

// ---- 3. bytes that are not the protocol ---------------------------------------

namespace {

// A plain TCP client of 127.0.0.1:port.
class RawSocket {
 public:
  explicit RawSocket(int port) : fd_(connect_loopback(port)) {}
  ~RawSocket() { ::close(fd_); }
  RawSocket(const RawSocket&) = delete;
  RawSocket& operator=(const RawSocket&) = delete;

  // Sends every byte; false when the peer closed first (then the bytes it
  // already had were enough to judge us).
  bool send_all(const std::vector<uint8_t>& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }

  // Waits (at most `guard`) until the peer closes: EOF, or a reset when it
  // closed with our bytes unread. Discards whatever it is sent meanwhile.
  bool closed_by_peer(std::chrono::milliseconds guard) {
    const auto deadline = Clock::now() + guard;
    uint8_t buffer[4096];
    while (Clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      const int left = static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now())
              .count());
      const int ready = ::poll(&p, 1, std::max(left, 1));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) return false;
      const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
      if (n == 0) return true;
      if (n < 0 && errno == ECONNRESET) return true;
      if (n < 0 && errno != EINTR) return false;
    }
    return false;
  }

 private:
  int fd_ = -1;
};

std::vector<uint8_t> header_bytes(const agents::pipe::wire::FrameHeader& header) {
  std::vector<uint8_t> bytes(agents::pipe::wire::kHeaderSize);
  agents::pipe::wire::encode_header(header, bytes.data());
  return bytes;
}

// A hello as rank 1 ("w1") sends it: msgpack [kind 0 (static), 1, "w1", bin "", true, ""].
std::vector<uint8_t> hello_from_w1() {
  const std::vector<uint8_t> payload{0x96, 0x00, 0x01, 0xa2, 'w', '1', 0xc4, 0x00, 0xc3, 0xa0};
  std::vector<uint8_t> bytes;
  agents::pipe::wire::append_control_frame(bytes, agents::pipe::wire::FrameKind::kHello,
                                           0, payload.data(), payload.size());
  return bytes;
}

// Two PipeAgents ("w0", "w1") on 127.0.0.1 over one HashStore, answering
// every request with its payload and counting the requests per function.
struct AgentPair {
  explicit AgentPair(std::chrono::milliseconds heartbeat_timeout = 5s) {
    auto store = std::make_shared<HashStore>();
    agents.resize(2);
    rethrow_first(on_threads(2, [&](int rank) {
      PipeAgentOptions options;
      options.listen_address = "127.0.0.1";
      options.num_worker_threads = 2;
      options.rpc_timeout = 30s;
      options.heartbeat_interval = 50ms;
      options.heartbeat_timeout = heartbeat_timeout;
      agents[rank] = std::make_unique<PipeAgent>(store, worker_name(rank), rank, 2, options);
    }));
    for (auto& agent : agents) {
      agent->start([this](Message m, const WorkerInfo&) {
        {
          MutexLock lock(mu);
          served.push_back(m.function);
        }
        Message reply;
        reply.type = MessageType::kResponse;
        reply.payload = std::move(m.payload);
        return Future<Message>::ready(std::move(reply));
      });
    }
  }

  // A round trip between the two agents, in both directions.
  void check_round_trips() {
    for (int from = 0; from < 2; ++from) {
      PipeAgent& agent = *agents[from];
      const std::vector<uint8_t> payload{7, static_cast<uint8_t>(from), 9};
      Future<Message> reply =
          agent.send(agent.worker(1 - from), request("echo", payload), kGuard);
      REQUIRE(reply.wait_for(kGuard));
      CHECK(reply.value().payload == payload);
    }
  }

  bool served_function(const std::string& function) SB_EXCLUDES(mu) {
    MutexLock lock(mu);
    return std::find(served.begin(), served.end(), function) != served.end();
  }

  std::vector<std::unique_ptr<PipeAgent>> agents;
  Mutex mu;
  std::vector<std::string> served SB_GUARDED_BY(mu);
};

}  // namespace

TEST_CASE(
    "a connection that sends bytes which are not the protocol is closed and the agent "
    "keeps serving its real peer",
    "[pipe][protocol]") {
  namespace pipe = agents::pipe;
  AgentPair pair;
  pair.check_round_trips();
  const int port = pair.agents[0]->listen_port();
  REQUIRE(port > 0);

  struct Bad {
    std::string what;
    std::vector<uint8_t> bytes;
  };
  std::vector<Bad> cases;
  {
    std::vector<uint8_t> garbage(100);
    for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<uint8_t>(i * 37 + 11);
    cases.push_back({"garbage bytes", garbage});
  }
  {
    pipe::wire::FrameHeader header;
    header.kind = pipe::wire::FrameKind::kHeartbeat;
    std::vector<uint8_t> bytes = header_bytes(header);
    bytes[0] ^= 0xff;
    cases.push_back({"a header with a bad magic", bytes});
  }
  {
    std::vector<uint8_t> bytes;
    pipe::wire::append_frame(bytes, request("sneaky", {1, 2, 3}));
    cases.push_back({"a request before any hello", bytes});
  }
  {
    std::vector<uint8_t> bytes;
    pipe::wire::append_control_frame(bytes, pipe::wire::FrameKind::kHeartbeat, 0);
    cases.push_back({"a heartbeat before any hello", bytes});
  }
  cases.push_back({"a hello claiming rank 1, which is already connected", hello_from_w1()});
  {
    // The same hello, then a request that must not be served as w1's.
    std::vector<uint8_t> bytes = hello_from_w1();
    pipe::wire::append_frame(bytes, request("impostor", {4}));
    cases.push_back({"a hello claiming rank 1 followed by a request", bytes});
  }
  {
    // Regression: a hello whose payload did not decode threw out of the
    // I/O thread and ended the process.
    const std::vector<uint8_t> payload{0x01};
    std::vector<uint8_t> bytes;
    pipe::wire::append_control_frame(bytes, pipe::wire::FrameKind::kHello, 0,
                                     payload.data(), payload.size());
    cases.push_back({"a hello whose payload is not a hello", bytes});
  }
  {
    // A dynamic group's join hello sent to a static group.
    const std::vector<uint8_t> payload{0x96, 0x01, 0x05, 0xa1, 'x', 0xc4, 0x00, 0xc3, 0xa0};
    std::vector<uint8_t> bytes;
    pipe::wire::append_control_frame(bytes, pipe::wire::FrameKind::kHello, 0,
                                     payload.data(), payload.size());
    cases.push_back({"a dynamic group's join hello to a static group", bytes});
  }
  {
    pipe::wire::FrameHeader header;
    header.kind = pipe::wire::FrameKind::kRequest;
    header.id = 1;
    header.function_length = pipe::wire::FrameLimits{}.max_function_length + 1;
    cases.push_back({"an oversized function_length", header_bytes(header)});
  }

  for (const Bad& bad : cases) {
    INFO(bad.what);
    {
      RawSocket raw(port);
      raw.send_all(bad.bytes);
      CHECK(raw.closed_by_peer(10s));
    }
    pair.check_round_trips();
  }
  CHECK_FALSE(pair.served_function("sneaky"));
  CHECK_FALSE(pair.served_function("impostor"));
}

TEST_CASE("a connection that never says hello is closed after the heartbeat timeout",
          "[pipe][protocol]") {
  AgentPair pair(300ms);
  RawSocket silent(pair.agents[0]->listen_port());
  // Nothing is sent; the agent must not keep the socket forever.
  CHECK(silent.closed_by_peer(kGuard));
  pair.check_round_trips();
}

namespace {

// This process' peak resident set (VmHWM), in bytes; 0 when unknown.
size_t peak_rss() {
  FILE* status = std::fopen("/proc/self/status", "r");
  if (!status) return 0;
  char line[256];
  size_t kib = 0;
  while (std::fgets(line, sizeof line, status)) {
    if (std::sscanf(line, "VmHWM: %zu kB", &kib) == 1) break;
  }
  std::fclose(status);
  return kib * 1024;
}

// Resets the peak (Linux: "5" to clear_refs); false when it cannot.
bool reset_peak_rss() {
  FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

}  // namespace

TEST_CASE("headers announcing huge bodies before any hello cost no memory until the bytes "
          "come",
          "[pipe][protocol][limits]") {
  AgentPair pair(300ms);
  if (!reset_peak_rss()) {
    fmt::print("skipped: /proc/self/clear_refs cannot reset the peak resident set here\n");
    return;
  }
  const size_t before = peak_rss();
  agents::pipe::wire::FrameHeader header;
  header.kind = agents::pipe::wire::FrameKind::kHello;
  header.payload_length =
      static_cast<uint32_t>(agents::pipe::wire::FrameLimits{}.max_payload_bytes);
  // Three strangers, each announcing a 1 GiB hello and sending none of it;
  // each is closed when its hello does not come.
  std::vector<std::unique_ptr<RawSocket>> strangers;
  for (int i = 0; i < 3; ++i) {
    strangers.push_back(std::make_unique<RawSocket>(pair.agents[0]->listen_port()));
    REQUIRE(strangers.back()->send_all(header_bytes(header)));
  }
  for (auto& stranger : strangers) CHECK(stranger->closed_by_peer(kGuard));
  const size_t grew = peak_rss() - before;
  INFO("peak RSS grew by " << grew / (1 << 20) << " MiB");
  CHECK(grew < (64u << 20));
  pair.check_round_trips();
}

// ---- 4. the listen address ----------------------------------------------------

namespace {

using sbtest::ScopedEnv;

bool is_numeric_address(const std::string& text) {
  in_addr v4{};
  in6_addr v6{};
  return inet_pton(AF_INET, text.c_str(), &v4) == 1 ||
         inet_pton(AF_INET6, text.c_str(), &v6) == 1;
}

// Whether an up, non-loopback interface has an IPv4 address.
bool has_external_ipv4() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool found = false;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    if ((it->ifa_flags & IFF_UP) != 0 && (it->ifa_flags & IFF_LOOPBACK) == 0) found = true;
  }
  freeifaddrs(list);
  return found;
}

}  // namespace

TEST_CASE("the listen address is an address, an interface, the environment's or a default",
          "[pipe][address]") {
  using agents::pipe::resolve_listen_address;
  ScopedEnv no_switchboard("SWITCHBOARD_PIPE_SOCKET_IFNAME", std::nullopt);
  CHECK(resolve_listen_address("127.0.0.1") == "127.0.0.1");
  CHECK(resolve_listen_address("::1") == "::1");
  CHECK(resolve_listen_address("lo") == "127.0.0.1");
  try {
    resolve_listen_address("no_such_if0");
    FAIL("an unknown interface was accepted");
  } catch (const std::invalid_argument& e) {
    CHECK_THAT(e.what(), Catch::Contains("\"no_such_if0\""));
  }
  {
    ScopedEnv tp("TP_SOCKET_IFNAME", "lo");
    CHECK(resolve_listen_address("") == "127.0.0.1");
    // An explicit option wins over the environment.
    CHECK(resolve_listen_address("127.0.0.2") == "127.0.0.2");
  }
  {
    ScopedEnv tp("TP_SOCKET_IFNAME", "no_such_if0");
    try {
      resolve_listen_address("");
      FAIL("an unknown interface in TP_SOCKET_IFNAME was accepted");
    } catch (const std::invalid_argument& e) {
      CHECK_THAT(e.what(), Catch::Contains("TP_SOCKET_IFNAME"));
      CHECK_THAT(e.what(), Catch::Contains("\"no_such_if0\""));
    }
  }
  ScopedEnv no_tp("TP_SOCKET_IFNAME", std::nullopt);
  const std::string chosen = resolve_listen_address("");
  INFO("the default listen address: " << chosen);
  CHECK(is_numeric_address(chosen));
  CHECK(chosen != "127.0.1.1");
  if (chosen.rfind("127.", 0) == 0) {
    CHECK(chosen == "127.0.0.1");
    CHECK_FALSE(has_external_ipv4());
  }
}

TEST_CASE("an agent listens on the interface its options name", "[pipe][address]") {
  auto store = std::make_shared<HashStore>();
  PipeAgentOptions options;
  options.listen_address = "lo";
  options.num_worker_threads = 1;
  PipeAgent agent(store, "solo", 0, 1, options);
  CHECK(agent.listen_address() == "127.0.0.1");
  CHECK(agent.listen_port() > 0);
  agent.shutdown();
  options.listen_address = "no_such_if0";
  CHECK_THROWS_AS(PipeAgent(std::make_shared<HashStore>(), "solo", 0, 1, options),
                  std::invalid_argument);
}

// ---- 5. join with a nested chain in flight ------------------------------------

TEST_CASE(
    "graceful shutdown on every worker waits for a nested chain in flight and delivers "
    "its result",
    "[pipe][join]") {
  auto gate = std::make_shared<Gate>(kGuard);
  auto store = std::make_shared<HashStore>();
  std::vector<std::unique_ptr<RpcContext>> contexts;
  for (int rank = 0; rank < 3; ++rank) {
    contexts.push_back(std::make_unique<RpcContext>());
    RpcContext& self = *contexts.back();
    // w1: asks `to` for gated(v), adds one. w2: waits at the gate.
    self.register_function("relay", [&self](std::string to, int64_t v) {
      return self.rpc_sync<int64_t>(to, "gated", with_timeout(kGuard), v) + 1;
    });
    self.register_function("gated", [gate](int64_t v) {
      gate->pass();
      return v * 10;
    });
  }
  rethrow_first(on_threads(3, [&](int rank) {
    contexts[rank]->init_rpc(worker_name(rank), "PIPE", rank, 3, pipe_options(), store);
  }));
  Future<int64_t> chain = contexts[0]->rpc_async<int64_t>(
      "w1", "relay", with_timeout(kGuard), std::string("w2"), int64_t{4});
  REQUIRE(gate->wait_arrived(1));

  // Every worker calls shutdown while the chain is held at the gate; the
  // gate opens once all three are about to (whether each is already inside
  // join() does not matter: none may return before the gate opened).
  std::mutex mu;
  std::condition_variable cv;
  int entered = 0;
  std::atomic<bool> gate_opened{false};
  std::vector<int> returned_after_gate(3, 0);  // per rank; bools would share bytes
  std::optional<bool> chain_done_at_return;
  std::thread opener([&] {
    std::unique_lock lock(mu);
    cv.wait_for(lock, kGuard, [&] { return entered == 3; });
    gate_opened = true;
    gate->open();
  });
  const auto errors = on_threads(3, [&](int rank) {
    {
      std::lock_guard lock(mu);
      ++entered;
      cv.notify_all();
    }
    contexts[rank]->shutdown(true, kGuard);
    returned_after_gate[rank] = gate_opened.load() ? 1 : 0;
    if (rank == 0) chain_done_at_return = chain.done();
  });
  opener.join();
  for (int rank = 0; rank < 3; ++rank) {
    INFO("w" << rank);
    std::string message;
    if (errors[rank]) FAIL_CHECK(kind_of(errors[rank], message) << ": " << message);
    CHECK(returned_after_gate[rank] == 1);
  }
  CHECK(chain_done_at_return == true);
  const Outcome outcome = outcome_of(chain);
  INFO(outcome.kind << ": " << outcome.message);
  REQUIRE(outcome.kind == "none");
  CHECK(chain.value() == 41);
}

// ---- 6. writes from many threads at once --------------------------------------

// Sends go out inline from the calling thread when nothing else is being
// written, else through the I/O thread; a partial inline send leaves the
// rest of a frame (possibly in the middle of a tensor) queued. Many
// threads in both directions with tensors of awkward sizes must still see
// every byte in order.
TEST_CASE("concurrent calls with tensors of many sizes, in both directions, arrive intact",
          "[pipe][write]") {
  auto store = std::make_shared<HashStore>();
  std::vector<std::unique_ptr<RpcContext>> contexts;
  for (int rank = 0; rank < 2; ++rank) {
    contexts.push_back(std::make_unique<RpcContext>());
    // Returns the tensor plus one, so that the reply is new bytes.
    contexts.back()->register_function("inc", [](Tensor t) {
      Tensor out = Tensor::empty(t.shape(), t.dtype());
      auto in = t.span<uint8_t>();
      auto bytes = out.span<uint8_t>();
      for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(in[i] + 1);
      return out;
    });
  }
  rethrow_first(on_threads(2, [&](int rank) {
    contexts[rank]->init_rpc(worker_name(rank), "PIPE", rank, 2, pipe_options(), store);
  }));
  const std::vector<int64_t> sizes = {0, 1, 17, 4096, 65'537, 300'001, 3'000'017};
  // Four callers per worker, each with several calls in flight.
  rethrow_first(on_threads(8, [&](int caller) {
    RpcContext& from = *contexts[caller % 2];
    const std::string to = worker_name(1 - caller % 2);
    for (int round = 0; round < 6; ++round) {
      std::vector<std::pair<Tensor, Future<Tensor>>> calls;
      for (size_t k = 0; k < sizes.size(); ++k) {
        Tensor t = Tensor::empty({sizes[(k + round + caller) % sizes.size()]}, DType::kUInt8);
        auto bytes = t.span<uint8_t>();
        for (size_t i = 0; i < bytes.size(); ++i) {
          bytes[i] = static_cast<uint8_t>(i * 7 + k + caller);
        }
        calls.emplace_back(t, from.rpc_async<Tensor>(to, "inc", with_timeout(kGuard), t));
      }
      for (auto& [sent, call] : calls) {
        const Tensor got = call.value();
        REQUIRE(got.numel() == sent.numel());
        auto a = sent.span<uint8_t>();
        auto b = got.span<uint8_t>();
        bool same = true;
        for (size_t i = 0; i < a.size() && same; ++i) {
          same = b[i] == static_cast<uint8_t>(a[i] + 1);
        }
        REQUIRE(same);
      }
    }
  }));
  on_threads(2, [&](int rank) { contexts[rank]->shutdown(true, kGuard); });
}
