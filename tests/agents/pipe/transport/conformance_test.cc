// The transport conformance suite: what every PIPE transport promises the
// agent (agents/pipe/transport/transport.h, agents/pipe/transport/connection.h), run over
// every transport of the registry (agents/pipe/transport/registry.h): each stream
// transport (tcp, tls) alone and with each upgrade of it (tcp with shm, the same-host
// lane: frames through shared memory). Each case stands in for the agent: an endpoint
// that records the frames its connections hand it, answers the lane's negotiation, and
// trusts its peer from the start (no hello).
//
// Promises: frames go out in the order queued and arrive intact, in both
// directions of one connection, tensors of any size included; what was
// queued before close_after_flush() arrives before the peer sees the end;
// close_now() on one side ends the other's connection; a connect to a port
// nobody listens on fails with ConnectionError; timers tick until told to
// stop. Nothing here sleeps hoping for an order: every wait is on a
// condition, bounded by kGuard.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "agents/pipe/transport/connection.h"
#include "agents/pipe/transport/registry.h"
#include "agents/pipe/transport/transport.h"
#include "agents/pipe/wire/frame.h"
#include "common/error.h"
#include "common/mutex.h"
#include "core/tensor.h"
#include "tests/util/test_certs.h"

using namespace switchboard;
using namespace switchboard::agents;
using namespace switchboard::agents::pipe;
using namespace switchboard::agents::pipe::transport;
using namespace std::chrono_literals;
using rpc::Message;
using rpc::MessageType;

namespace {

constexpr std::chrono::milliseconds kGuard = 60s;

// Stands in for the agent on one side: every connection's frames, in
// order, and how its connections ended.
class Endpoint final : public ConnectionEvents {
 public:
  bool on_frame(const std::shared_ptr<Connection>& connection,
                pipe::wire::InboundFrame frame) override SB_EXCLUDES(mu_) {
    if (frame.kind == pipe::wire::FrameKind::kLane) {
      connection->on_lane_frame(frame.message.payload);
      return true;
    }
    MutexLock lock(mu_);
    frames_.push_back(std::move(frame));
    changed_.notify_all();
    return true;
  }
  void connection_failed(const std::shared_ptr<Connection>& connection,
                         const std::string& reason) override SB_EXCLUDES(mu_) {
    if (connection->failed.exchange(true)) return;
    connection->close_now();
    MutexLock lock(mu_);
    failures_.push_back(reason);
    changed_.notify_all();
  }

  // Waits until `n` frames arrived; false after kGuard.
  bool wait_frames(size_t n) SB_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return changed_.wait_for(mu_, kGuard,
                             [&]() SB_REQUIRES(mu_) { return frames_.size() >= n; });
  }
  // Waits until a connection ended; its reason, or "" after kGuard.
  std::string wait_failure() SB_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    changed_.wait_for(mu_, kGuard, [&]() SB_REQUIRES(mu_) { return !failures_.empty(); });
    return failures_.empty() ? std::string() : failures_.front();
  }
  std::vector<pipe::wire::InboundFrame> frames() SB_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return frames_;
  }
  size_t frame_count() SB_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return frames_.size();
  }

 private:
  Mutex mu_;
  CondVar changed_;
  std::vector<pipe::wire::InboundFrame> frames_ SB_GUARDED_BY(mu_);
  std::vector<std::string> failures_ SB_GUARDED_BY(mu_);
};

// One way of carrying a connection: a stream transport of the registry,
// and an upgrade of it ("" for none).
struct Kind {
  std::string stream;
  std::string upgrade;
};

// Every stream transport the registry has, alone and with each upgrade of
// it: the suite runs over all of them.
std::vector<Kind> every_kind() {
  std::vector<Kind> kinds;
  for (const TransportEntry& e : builtin_transports().entries()) {
    if (e.kind == TransportEntry::Kind::kStream) kinds.push_back({e.name, ""});
  }
  for (const TransportEntry& e : builtin_transports().entries()) {
    if (e.kind != TransportEntry::Kind::kUpgrade) continue;
    for (const std::string& stream : e.upgrades) kinds.push_back({stream, e.name});
  }
  return kinds;
}

std::string kind_name(const Kind& kind) {
  return kind.upgrade.empty() ? kind.stream
                              : kind.stream + " upgraded by " + kind.upgrade;
}

// A listening transport and a connecting one of `kind`, joined by one
// connection (trusted on both sides, reading).
class Pair {
 public:
  explicit Pair(const Kind& kind) : ca_("transport-test") {
    server_ = builtin_transports().make(server_events, options(kind, "server"));
    client_ = builtin_transports().make(client_events, options(kind, "client"));
    REQUIRE(server_->name() == kind.stream);
    server_->listen("127.0.0.1", [this](std::shared_ptr<Connection> c) {
      c->trusted = true;
      c->start_reading();
      MutexLock lock(mu_);
      accepted_ = std::move(c);
      accepted_cv_.notify_all();
    });
    client_->listen("127.0.0.1", [](std::shared_ptr<Connection> c) { c->close_now(); });
    client = client_->connect(server_->address(), server_->port(), kGuard);
    client->trusted = true;
    client->start_reading();
    MutexLock lock(mu_);
    accepted_cv_.wait_for(mu_, kGuard,
                          [&]() SB_REQUIRES(mu_) { return accepted_ != nullptr; });
    server = accepted_;
  }
  ~Pair() {
    for (const auto& c : {client, server}) {
      if (c) c->close_now();
    }
    client_->close();
    server_->close();
    client_->join();
    server_->join();
    // Connections go before their transports (transport.h, "Lifecycle").
    client = nullptr;
    server = nullptr;
    MutexLock lock(mu_);
    accepted_ = nullptr;
  }

  PipeTransport& server_transport() { return *server_; }

  Endpoint server_events;
  Endpoint client_events;
  std::shared_ptr<Connection> client;
  std::shared_ptr<Connection> server;  // null when no connection was accepted

 private:
  // Options under which the registry chooses `kind` and nothing else.
  TransportOptions options(const Kind& kind, const std::string& name) {
    TransportOptions o;
    o.agent_name = name;
    for (const std::string& transport : {kind.stream, kind.upgrade}) {
      if (transport.empty() || transport == "tcp") continue;
      if (transport == "shm") {
        o.lane_capacity = 1 << 20;  // 1 MiB rings
      } else if (transport == "tls") {
        const sbtest::TlsFiles files = ca_.issue(name);
        o.tls = {files.cert_file, files.key_file, ca_.ca_file()};
      } else {
        FAIL("the conformance suite cannot yet turn on transport \""
             << transport << "\": add it here");
      }
    }
    const TransportRegistry::Choice choice = builtin_transports().choose(o);
    REQUIRE(choice.stream->name == kind.stream);
    std::vector<std::string> upgrades;
    for (const TransportEntry* e : choice.upgrades) upgrades.push_back(e->name);
    REQUIRE(upgrades == (kind.upgrade.empty() ? std::vector<std::string>{}
                                              : std::vector<std::string>{kind.upgrade}));
    return o;
  }

  sbtest::TestCa ca_;
  std::unique_ptr<PipeTransport> server_;
  std::unique_ptr<PipeTransport> client_;
  Mutex mu_;
  CondVar accepted_cv_;
  std::shared_ptr<Connection> accepted_ SB_GUARDED_BY(mu_);
};

Message request(uint64_t id, std::vector<uint8_t> payload,
                std::vector<Tensor> tensors = {}) {
  Message m;
  m.type = MessageType::kRequest;
  m.id = id;
  m.function = "f";
  m.payload = std::move(payload);
  m.tensors = std::move(tensors);
  return m;
}

// `n` bytes of a pattern that tells positions apart.
Tensor pattern(int64_t n, uint8_t seed) {
  Tensor t = Tensor::empty({n}, DType::kUInt8);
  auto* p = t.data_as<uint8_t>();
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 12));
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

Kind any_kind() { return GENERATE(from_range(every_kind())); }

int unused_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  socklen_t length = sizeof(address);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0);
  ::close(fd);
  return ntohs(address.sin_port);
}

}  // namespace

TEST_CASE(
    "frames go out in the order queued and arrive intact, in both directions of one "
    "connection",
    "[pipe][transport]") {
  const Kind kind = any_kind();
  INFO(kind_name(kind));
  Pair pair(kind);
  REQUIRE(pair.server != nullptr);
  constexpr int kFrames = 300;
  // Small frames, some with a tensor; every tenth goes out on the caller's
  // thread when it can (send_now).
  std::vector<Tensor> sent_tensors;
  for (int i = 0; i < kFrames; ++i) {
    std::vector<Tensor> tensors;
    if (i % 3 == 0) {
      sent_tensors.push_back(pattern(1 + i * 100, static_cast<uint8_t>(i)));
      tensors.push_back(sent_tensors.back());
    }
    const std::vector<uint8_t> payload(static_cast<size_t>(i % 50),
                                       static_cast<uint8_t>(i));
    REQUIRE(pair.client->enqueue(request(i, payload, tensors), {}, {}, i % 10 == 0));
    REQUIRE(pair.server->enqueue(request(1000 + i, payload), {}, {}, false));
  }
  REQUIRE(pair.server_events.wait_frames(kFrames));
  REQUIRE(pair.client_events.wait_frames(kFrames));
  const std::vector<pipe::wire::InboundFrame> at_server = pair.server_events.frames();
  const std::vector<pipe::wire::InboundFrame> at_client = pair.client_events.frames();
  size_t tensor = 0;
  for (int i = 0; i < kFrames; ++i) {
    INFO("frame " << i);
    REQUIRE(at_server[i].message.id == static_cast<uint64_t>(i));
    REQUIRE(at_server[i].message.payload.size() == static_cast<size_t>(i % 50));
    REQUIRE(at_client[i].message.id == static_cast<uint64_t>(1000 + i));
    if (i % 3 == 0) {
      REQUIRE(at_server[i].message.tensors.size() == 1);
      REQUIRE(same_bytes(at_server[i].message.tensors[0], sent_tensors[tensor++]));
    }
  }
}

TEST_CASE("a tensor larger than any buffer or ring arrives intact", "[pipe][transport]") {
  const Kind kind = any_kind();
  INFO(kind_name(kind));
  Pair pair(kind);
  REQUIRE(pair.server != nullptr);
  const Tensor big = pattern(int64_t{24} << 20, 3);  // 24 MiB, over the 1 MiB lane ring
  REQUIRE(pair.client->enqueue(request(7, {1, 2, 3}, {big}), {}, {}, false));
  REQUIRE(pair.server_events.wait_frames(1));
  const pipe::wire::InboundFrame got = pair.server_events.frames().at(0);
  REQUIRE(got.message.tensors.size() == 1);
  CHECK(same_bytes(got.message.tensors[0], big));
}

// Bytes made ready chunk by chunk from `pattern`, as a staged CUDA
// tensor's are (agents/pipe/channel/cuda_staged/staging.h); counts its advances.
class PatternSource final : public pipe::wire::ChunkedSource {
 public:
  PatternSource(Tensor pattern, size_t chunk)
      : pattern_(std::move(pattern)),
        host_(Tensor::zeros({static_cast<int64_t>(pattern_.nbytes())}, DType::kUInt8)),
        chunk_(chunk) {}
  size_t size() const override { return pattern_.nbytes(); }
  size_t ready() const override { return ready_.load(); }
  const uint8_t* data() const override {
    return static_cast<const uint8_t*>(host_.data());
  }
  void advance() override {
    const size_t at = ready_.load();
    const size_t n = std::min(chunk_, size() - at);
    std::memcpy(static_cast<uint8_t*>(host_.data()) + at,
                static_cast<const uint8_t*>(pattern_.data()) + at, n);
    ++advances;
    ready_.store(at + n);
  }
  const Tensor& host() const { return host_; }
  std::atomic<int> advances{0};

 private:
  const Tensor pattern_;
  const Tensor host_;
  const size_t chunk_;
  std::atomic<size_t> ready_{0};
};

TEST_CASE(
    "a tensor whose bytes become ready chunk by chunk arrives intact, and what was "
    "queued after it waits for it",
    "[pipe][transport]") {
  const Kind kind = any_kind();
  INFO(kind_name(kind));
  Pair pair(kind);
  REQUIRE(pair.server != nullptr);
  const Tensor source_bytes = pattern(int64_t{10} << 20, 9);  // 10 MiB in 1 MiB chunks
  auto source = std::make_shared<PatternSource>(source_bytes, size_t{1} << 20);
  std::vector<pipe::wire::TensorRoute> routes(2);
  routes[1].source = source;
  const Tensor before = pattern(5000, 1);
  const bool send_now = GENERATE(false, true);
  REQUIRE(pair.client->enqueue(request(1, {1}, {before, source->host()}), {}, routes,
                               send_now));
  for (int i = 2; i <= 4; ++i) {
    REQUIRE(pair.client->enqueue(request(i, {static_cast<uint8_t>(i)}, {pattern(100, 2)}),
                                 {}, {}, send_now));
  }
  REQUIRE(pair.server_events.wait_frames(4));
  const std::vector<pipe::wire::InboundFrame> got = pair.server_events.frames();
  for (int i = 0; i < 4; ++i) CHECK(got[i].message.id == static_cast<uint64_t>(i + 1));
  REQUIRE(got[0].message.tensors.size() == 2);
  CHECK(same_bytes(got[0].message.tensors[0], before));
  CHECK(same_bytes(got[0].message.tensors[1], source_bytes));
  CHECK(source->advances == 10);
}

TEST_CASE("what was queued before close_after_flush arrives before the peer sees the end",
          "[pipe][transport]") {
  const Kind kind = any_kind();
  INFO(kind_name(kind));
  Pair pair(kind);
  REQUIRE(pair.server != nullptr);
  constexpr int kFrames = 50;
  for (int i = 0; i < kFrames; ++i) {
    REQUIRE(
        pair.client->enqueue(request(i, std::vector<uint8_t>(1000, 1)), {}, {}, false));
  }
  pair.client->close_after_flush();
  CHECK(pair.client->wait_closed(std::chrono::steady_clock::now() + kGuard));
  const std::string end = pair.server_events.wait_failure();
  INFO("the server saw: " << end);
  CHECK_FALSE(end.empty());
  CHECK(pair.server_events.frame_count() == kFrames);
  // A closed connection takes nothing more.
  CHECK_FALSE(pair.client->enqueue(request(99, {}), {}, {}, false));
}

TEST_CASE("close_now on one side ends the other side's connection", "[pipe][transport]") {
  const Kind kind = any_kind();
  INFO(kind_name(kind));
  Pair pair(kind);
  REQUIRE(pair.server != nullptr);
  REQUIRE(pair.client->enqueue(request(1, {1}), {}, {}, false));
  REQUIRE(pair.server_events.wait_frames(1));
  pair.server->close_now();
  CHECK_FALSE(pair.client_events.wait_failure().empty());
}

TEST_CASE(
    "a connect to a port nobody listens on fails with ConnectionError, and timers tick "
    "until told to stop",
    "[pipe][transport]") {
  // A port bound a moment ago and closed: nobody listens there.
  const int port = unused_port();
  std::unique_ptr<PipeTransport> other;
  Endpoint events;
  TransportOptions options;
  options.agent_name = "other";
  other = builtin_transports().make(events, options);
  other->listen("127.0.0.1", [](std::shared_ptr<Connection> c) { c->close_now(); });
  CHECK_THROWS_AS(other->connect("127.0.0.1", port, 5s), ConnectionError);

  Mutex mu;
  CondVar cv;
  int ticks = 0;
  other->every(1ms, [&] {
    MutexLock lock(mu);
    ++ticks;
    cv.notify_all();
    return ticks < 5;  // stops itself after the fifth
  });
  {
    MutexLock lock(mu);
    REQUIRE(cv.wait_for(mu, kGuard, [&]() SB_REQUIRES(mu) { return ticks >= 5; }));
  }
  other->close();
  other->join();
  MutexLock lock(mu);
  CHECK(ticks == 5);
}
