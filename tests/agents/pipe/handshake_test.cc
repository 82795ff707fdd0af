// PIPE's hello authenticated with the job secret (agents/pipe/handshake.h):
// workers that share the secret form static and dynamic groups; a worker
// with another secret, or none, does not get in, and the group is
// unchanged; a stranger's hello without a proof, or with a proof recorded
// on another connection, is refused before any of its requests is read.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "agents/pipe/agent.h"
#include "agents/pipe/announcement.h"
#include "agents/pipe/wire/frame.h"
#include "common/auth.h"
#include "common/error.h"
#include "common/mutex.h"
#include "rpc/future.h"
#include "store/hash_store.h"
#include "tests/agents/pipe/test_util.h"
#include "tests/util/threads.h"

using namespace switchboard;
using namespace switchboard::agents;
using namespace switchboard::agents::pipe;
using namespace std::chrono_literals;
using rpc::Future;
using rpc::Message;
using rpc::MessageType;
using rpc::WorkerInfo;
using testing::on_threads;

namespace {

constexpr std::chrono::milliseconds kGuard = 60s;

std::shared_ptr<const Secret> secret_of(char fill) {
  return std::make_shared<const Secret>(std::vector<uint8_t>(32, static_cast<uint8_t>(fill)));
}

// A secret that no SWITCHBOARD_SECRET_FILE gives: "no secret" for an agent.
std::shared_ptr<const Secret> no_secret() { return nullptr; }

PipeAgentOptions options_with(std::shared_ptr<const Secret> secret,
                              std::chrono::milliseconds timeout = 30s) {
  PipeAgentOptions options;
  options.listen_address = "127.0.0.1";
  options.num_worker_threads = 2;
  options.rpc_timeout = timeout;
  options.secret = std::move(secret);
  return options;
}

// Echoes payloads; records the functions it served.
class Served {
 public:
  void serve(PipeAgent& agent) {
    agent.start([this](Message m, const WorkerInfo&) {
      {
        MutexLock lock(mu_);
        functions_.push_back(m.function);
      }
      Message reply;
      reply.type = MessageType::kResponse;
      reply.payload = std::move(m.payload);
      return Future<Message>::ready(std::move(reply));
    });
  }
  bool served(const std::string& function) {
    MutexLock lock(mu_);
    return std::find(functions_.begin(), functions_.end(), function) != functions_.end();
  }

 private:
  Mutex mu_;
  std::vector<std::string> functions_ SB_GUARDED_BY(mu_);
};

using pipe_test::request;

// A static group of `secrets.size()` workers "w<r>", worker r with
// secrets[r]; each construction's error ("none" when it joined).
struct StaticGroup {
  explicit StaticGroup(const std::vector<std::shared_ptr<const Secret>>& secrets,
                       std::chrono::milliseconds timeout = 30s,
                       const std::function<void(PipeAgentOptions&)>& adjust = nullptr) {
    auto store = std::make_shared<HashStore>();
    const int n = static_cast<int>(secrets.size());
    agents.resize(n);
    errors.resize(n);
    on_threads(n, [&](int r) {
      errors[r] = pipe_test::thrown_by([&] {
        PipeAgentOptions options = options_with(secrets[r], timeout);
        if (adjust) adjust(options);
        agents[r] = std::make_unique<PipeAgent>(store, fmt::format("w{}", r), r, n, options);
      });
    });
    for (auto& agent : agents) {
      if (agent) served.serve(*agent);
    }
  }
  std::vector<std::unique_ptr<PipeAgent>> agents;
  std::vector<std::string> errors;
  Served served;
};

// A plain TCP client of 127.0.0.1:port that speaks frames.
class RawPeer {
 public:
  explicit RawPeer(int port) : fd_(pipe_test::connect_loopback(port)) {}
  ~RawPeer() { ::close(fd_); }

  void send_hello(const Hello& hello) {
    const std::vector<uint8_t> payload = encode_hello(hello);
    std::vector<uint8_t> bytes;
    pipe::wire::append_control_frame(bytes, pipe::wire::FrameKind::kHello, 0,
                                     payload.data(), payload.size());
    send(bytes);
  }
  // Sends `bytes`; false once the agent closed the connection.
  bool send_raw(const std::vector<uint8_t>& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }
  // Whether the agent closed the connection within `wait` (what it sent
  // meanwhile is read and dropped).
  bool closed_within(std::chrono::milliseconds wait) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(wait.count())) != 1) return false;
    uint8_t scratch[4096];
    const ssize_t n = ::recv(fd_, scratch, sizeof(scratch), MSG_DONTWAIT);
    return n <= 0;
  }
  void send_request(const std::string& function) {
    std::vector<uint8_t> bytes;
    pipe::wire::append_frame(bytes, request(function));
    send(bytes);
  }
  // The next hello the agent sends (heartbeats skipped); nullopt when it
  // closed the connection first.
  std::optional<Hello> read_hello() {
    for (;;) {
      pipe::wire::InboundFrame frame;
      while (reader_.pop(frame)) {
        if (frame.kind == pipe::wire::FrameKind::kHello)
          return decode_hello(frame.message.payload);
      }
      if (!receive()) return std::nullopt;
    }
  }
  // Whether the agent closes the connection (within the guard).
  bool closed_by_peer() {
    for (;;) {
      pipe::wire::InboundFrame frame;
      while (reader_.pop(frame)) {
      }
      if (!receive()) return true;
    }
  }

 private:
  void send(const std::vector<uint8_t>& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return;  // closed: what it had was enough to judge
      sent += static_cast<size_t>(n);
    }
  }
  // Reads some bytes into the frame reader; false on EOF or reset.
  bool receive() {
    pollfd p{fd_, POLLIN, 0};
    REQUIRE(::poll(&p, 1, static_cast<int>(kGuard.count())) == 1);
    auto [buffer, room] = reader_.next_buffer();
    const ssize_t n = ::recv(fd_, buffer, room, 0);
    if (n <= 0) return false;
    reader_.commit(static_cast<size_t>(n));
    return true;
  }

  int fd_ = -1;
  pipe::wire::FrameReader reader_;
};

}  // namespace

TEST_CASE("workers that share the job secret form a static group and call each other",
          "[pipe][auth]") {
  const auto secret = secret_of('s');
  StaticGroup group({secret, secret, secret});
  for (const std::string& error : group.errors) CHECK(error == "none");
  for (int from = 0; from < 3; ++from) {
    for (int to = 0; to < 3; ++to) {
      INFO("w" << from << " to w" << to);
      CHECK(pipe_test::echo_round_trip(*group.agents[from], fmt::format("w{}", to)));
    }
  }
}

TEST_CASE("a worker with another secret cannot join a static group; it says why", "[pipe][auth]") {
  const auto secret = secret_of('s');
  StaticGroup group({secret, secret, secret_of('x')}, 3s);
  CHECK_THAT(group.errors[2], Catch::StartsWith("AuthenticationError"));
  CHECK_THAT(group.errors[2], Catch::Contains("proof does not match this worker's job secret"));
  // The others never count it in: they time out naming it.
  for (int r = 0; r < 2; ++r) {
    INFO("w" << r << ": " << group.errors[r]);
    CHECK_THAT(group.errors[r], Catch::StartsWith("TimeoutError"));
    CHECK_THAT(group.errors[r], Catch::Contains("\"w2\""));
  }
}

TEST_CASE("a hello without a proof is refused before any request after it is read",
          "[pipe][auth]") {
  const auto secret = secret_of('s');
  StaticGroup group({secret, secret});
  REQUIRE(group.errors == std::vector<std::string>{"none", "none"});
  RawPeer stranger(group.agents[0]->listen_port());
  Hello claim;  // as w1, with no nonce: what a worker without the secret sends
  claim.rank = 1;
  claim.name = "w1";
  stranger.send_hello(claim);
  stranger.send_request("sneaky");
  const std::optional<Hello> answer = stranger.read_hello();
  REQUIRE(answer);
  CHECK(answer->kind == Hello::Kind::kChallenge);
  CHECK_FALSE(answer->accepted);
  CHECK_THAT(answer->reason, Catch::Contains("requires the job secret"));
  CHECK(stranger.closed_by_peer());
  CHECK_FALSE(group.served.served("sneaky"));
  CHECK(pipe_test::echo_round_trip(*group.agents[0], "w1"));
  CHECK(pipe_test::echo_round_trip(*group.agents[1], "w0"));
}

namespace {

// The header of a hello frame that announces `payload_length` bytes.
std::vector<uint8_t> hello_header(uint32_t payload_length) {
  const std::vector<uint8_t> payload(16, 0);
  std::vector<uint8_t> frame;
  pipe::wire::append_control_frame(frame, pipe::wire::FrameKind::kHello, 0,
                                   payload.data(), payload.size());
  frame.resize(pipe::wire::kHeaderSize);
  for (int i = 0; i < 4; ++i) frame[20 + i] = static_cast<uint8_t>(payload_length >> (8 * i));
  return frame;
}

}  // namespace

TEST_CASE("a stranger that announces a large hello is closed at its header, before any of "
          "its body is buffered",
          "[pipe][auth][limits]") {
  const bool with_secret = GENERATE(true, false);
  INFO((with_secret ? "with" : "without") << " a job secret");
  const auto secret = with_secret ? secret_of('s') : no_secret();
  StaticGroup group({secret, secret});
  REQUIRE(group.errors == std::vector<std::string>{"none", "none"});
  RawPeer stranger(group.agents[0]->listen_port());
  REQUIRE(stranger.send_raw(hello_header(1u << 30)));  // a 1 GiB hello
  // It streams the body: the worker closed the connection long before
  // 64 MiB went (what the sockets' buffers hold may go first).
  const std::vector<uint8_t> chunk(1 << 20, 0x41);
  size_t sent = 0;
  while (sent < (64u << 20) && stranger.send_raw(chunk)) sent += chunk.size();
  CHECK(sent < (64u << 20));
  CHECK(pipe_test::echo_round_trip(*group.agents[0], "w1"));
  CHECK(pipe_test::echo_round_trip(*group.agents[1], "w0"));
}

TEST_CASE("a stranger that sends its hello a byte at a time is closed at the hello deadline",
          "[pipe][auth][limits]") {
  const auto secret = secret_of('s');
  // Heartbeat timeout 1 s, RPC timeout 3 s: the hello deadline is 3 s.
  StaticGroup group({secret, secret}, 3s, [](PipeAgentOptions& options) {
    options.heartbeat_interval = 200ms;
    options.heartbeat_timeout = 1s;
  });
  REQUIRE(group.errors == std::vector<std::string>{"none", "none"});
  RawPeer stranger(group.agents[0]->listen_port());
  std::vector<uint8_t> frame = hello_header(60 * 1024);  // under the stranger limit
  REQUIRE(stranger.send_raw(frame));
  // A byte every 100 ms: never silent for the heartbeat timeout, and the
  // hello would take 100 minutes. Closed at the deadline (3 s after it
  // connected, plus a heartbeat tick); 60 s means it never was.
  const auto start = std::chrono::steady_clock::now();
  bool closed = false;
  while (!closed && std::chrono::steady_clock::now() - start < 60s) {
    closed = !stranger.send_raw({0x41}) || stranger.closed_within(100ms);
  }
  CHECK(closed);
  CHECK(std::chrono::steady_clock::now() - start >= 2s);  // not for a byte it sent
  CHECK(pipe_test::echo_round_trip(*group.agents[0], "w1"));
}

TEST_CASE("a proof recorded on one connection is refused on another", "[pipe][auth]") {
  const auto secret = secret_of('s');
  StaticGroup group({secret, secret});
  REQUIRE(group.errors == std::vector<std::string>{"none", "none"});
  const int port = group.agents[0]->listen_port();
  Hello claim;
  claim.rank = 1;
  claim.name = "w1";
  const Nonce nonce = random_nonce();
  claim.nonce.assign(nonce.begin(), nonce.end());
  // Someone who saw a proof for the challenge on a first connection...
  std::vector<uint8_t> recorded;
  {
    RawPeer first(port);
    first.send_hello(claim);
    const std::optional<Hello> challenge = first.read_hello();
    REQUIRE(challenge);
    REQUIRE(challenge->accepted);
    const std::string connector = "w1";
    const std::string acceptor = "w0";
    static constexpr uint8_t kSeparator[1] = {0};
    const Mac proof = secret->mac({bytes_of("switchboard pipe connect"), nonce,
                                   challenge->nonce, bytes_of(connector), kSeparator,
                                   bytes_of(acceptor)});
    recorded.assign(proof.begin(), proof.end());
  }
  // ... replays it with the same claim on a second one: a new challenge.
  RawPeer replay(port);
  replay.send_hello(claim);
  const std::optional<Hello> challenge = replay.read_hello();
  REQUIRE(challenge);
  Hello proof;
  proof.kind = Hello::Kind::kProof;
  proof.rank = 1;
  proof.name = "w1";
  proof.proof = recorded;
  replay.send_hello(proof);
  replay.send_request("replayed");
  CHECK(replay.closed_by_peer());
  CHECK_FALSE(group.served.served("replayed"));
  CHECK(pipe_test::echo_round_trip(*group.agents[1], "w0"));
}

TEST_CASE("a joiner with another secret, or none, cannot join a dynamic group, which is "
          "unchanged",
          "[pipe][auth][dynamic]") {
  const auto secret = secret_of('s');
  auto store = std::make_shared<HashStore>();
  PipeAgent m0(store, "m0", 0, std::nullopt, options_with(secret));
  PipeAgent m1(store, "m1", 1, std::nullopt, options_with(secret));
  Served served;
  served.serve(m0);
  served.serve(m1);
  std::vector<std::string> joined;
  Mutex mu;
  m0.set_membership_listener([&](const rpc::MembershipChange& change) {
    MutexLock lock(mu);
    if (change.kind == rpc::MembershipChange::Kind::kJoined) joined.push_back(change.worker.name);
  });

  const std::string other = pipe_test::thrown_by(
      [&] { PipeAgent j(store, "j", 2, std::nullopt, options_with(secret_of('x'), 5s)); });
  CHECK_THAT(other, Catch::StartsWith("AuthenticationError"));
  CHECK_THAT(other, Catch::Contains("cannot join the dynamic group"));
  CHECK_THAT(other, Catch::Contains("does not match this worker's job secret"));

  const std::string none = pipe_test::thrown_by(
      [&] { PipeAgent j(store, "k", 3, std::nullopt, options_with(no_secret(), 5s)); });
  CHECK_THAT(none, Catch::StartsWith("invalid_argument"));
  CHECK_THAT(none, Catch::Contains("requires the job secret"));

  // Nobody got in; a joiner with the secret does.
  PipeAgent good(store, "good", 4, std::nullopt, options_with(secret));
  served.serve(good);
  CHECK(m0.workers().size() == 3);
  CHECK(pipe_test::echo_round_trip(good, "m0"));
  CHECK(pipe_test::echo_round_trip(m1, "good"));
  MutexLock lock(mu);
  CHECK(std::find(joined.begin(), joined.end(), "j") == joined.end());
  CHECK(std::find(joined.begin(), joined.end(), "k") == joined.end());
}
