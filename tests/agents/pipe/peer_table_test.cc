// PeerTable (agents/pipe/peer_table.h) on its own: fake connections, no sockets,
// no threads.
#include "agents/pipe/peer_table.h"

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"

using namespace switchboard;
using namespace switchboard::agents;
using namespace switchboard::agents::pipe;
using namespace switchboard::agents::pipe::transport;
using State = PeerTable::State;

namespace {

// A Connection that records what the table does with it.
class FakeConnection final : public Connection {
 public:
  bool enqueue(const rpc::Message&, const std::vector<Device>&,
               const std::vector<pipe::wire::TensorRoute>&, bool) override {
    return true;
  }
  bool enqueue_control(pipe::wire::FrameKind kind, const uint8_t*, size_t,
                       uint64_t) override {
    controls.push_back(kind);
    return true;
  }
  void start_reading() override { reading = true; }
  void replay(pipe::wire::InboundFrame frame) override {
    replayed.push_back(std::move(frame));
  }
  void close_after_flush() override {}
  bool wait_closed(std::chrono::steady_clock::time_point) override { return true; }
  void close_now() override {}

  std::vector<pipe::wire::FrameKind> controls;
  std::vector<pipe::wire::InboundFrame> replayed;
  bool reading = false;
};

std::vector<WorkerAnnouncement> announcements(int n) {
  std::vector<WorkerAnnouncement> all(n);
  for (int r = 0; r < n; ++r) all[r].name = "w" + std::to_string(r);
  return all;
}

PeerTable::RouteRule any_routes() {
  return [](const std::vector<rpc::WorkerDevices>&) { return PeerTable::DeviceRoutes{}; };
}

}  // namespace

TEST_CASE("a static table names the peers not up yet, and takes one connection per peer",
          "[pipe][peers]") {
  PeerTable peers("w0", 3, /*dynamic=*/false);
  peers.fill_static(announcements(3), 0, {});
  CHECK(peers.wait_all_up(std::chrono::milliseconds(1)) ==
        std::vector<std::string>{"w1", "w2"});

  auto first = std::make_shared<FakeConnection>();
  auto second = std::make_shared<FakeConnection>();
  CHECK(peers.add_unidentified(first));
  CHECK(peers.identify(1, first));
  CHECK(first->peer == 1);
  CHECK_FALSE(peers.identify(1, second));
  CHECK(second->peer == -1);
  CHECK(peers.identify(2, second));
  CHECK(peers.wait_all_up(std::chrono::milliseconds(1)).empty());

  CHECK(peers.find("w2").id == 2);
  CHECK(peers.find(1).name == "w1");
  CHECK_THROWS_AS(peers.find("w9"), NotFoundError);
  CHECK_THROWS_AS(peers.find(3), NotFoundError);
  CHECK(peers.workers().size() == 3);
  CHECK(peers.route(1).connection == first);
  CHECK(peers.route(0).up);  // this worker: up, no connection
}

TEST_CASE("hellos that come before the table is filled are replayed once it is",
          "[pipe][peers]") {
  PeerTable peers("w0", 2, /*dynamic=*/false);
  auto early = std::make_shared<FakeConnection>();
  rpc::Message hello;
  hello.payload = {1, 2, 3};
  CHECK(peers.defer_hello(early, hello));
  CHECK(early->replayed.empty());
  peers.fill_static(announcements(2), 0, {});
  REQUIRE(early->replayed.size() == 1);
  CHECK(early->replayed[0].kind == pipe::wire::FrameKind::kHello);
  CHECK(early->replayed[0].message.payload == hello.payload);
  CHECK_FALSE(peers.defer_hello(early, hello));
}

TEST_CASE("a lost peer's calls get its reason; after a goodbye the loss is quiet",
          "[pipe][peers]") {
  PeerTable peers("w0", 3, /*dynamic=*/false);
  peers.fill_static(announcements(3), 0, {});
  auto c1 = std::make_shared<FakeConnection>();
  auto c2 = std::make_shared<FakeConnection>();
  peers.identify(1, c1);
  peers.identify(2, c2);

  const PeerTable::Loss lost = peers.lose(c1, "reset by peer");
  CHECK(lost.current);
  CHECK(lost.was_up);
  CHECK_FALSE(lost.quiet);
  CHECK(lost.why == "lost its connection (reset by peer)");
  const PeerTable::Route route = peers.route(1);
  CHECK_FALSE(route.up);
  CHECK(route.reason == lost.why);

  CHECK(peers.mark_left(2));
  CHECK_FALSE(peers.mark_left(2));
  const PeerTable::Loss left = peers.lose(c2, "eof");
  CHECK(left.quiet);
  CHECK(left.why == "left the group");

  auto stranger = std::make_shared<FakeConnection>();
  peers.add_unidentified(stranger);
  CHECK_FALSE(peers.lose(stranger, "no hello").current);
  CHECK(peers.watched()->unidentified.empty());
}

TEST_CASE("a dynamic table admits a joiner once and refuses a taken rank, a used name, and "
          "everyone once closed to newcomers",
          "[pipe][peers]") {
  PeerTable peers("w0", 4, /*dynamic=*/true);
  WorkerAnnouncement me;
  me.name = "w0";
  peers.fill_members({}, 0, me, {});
  CHECK(peers.workers().size() == 1);

  WorkerAnnouncement joiner;
  joiner.name = "w1";
  auto c1 = std::make_shared<FakeConnection>();
  CHECK(peers.admit(1, "w1", joiner, c1, any_routes()).empty());
  CHECK(c1->peer == 1);
  CHECK(peers.is_up(1));
  CHECK(peers.admit(1, "w1", joiner, c1, any_routes()) == "rank 1 was taken by \"w1\"");
  CHECK(peers.admit(2, "w1", joiner, c1, any_routes()) ==
        "the name \"w1\" is used by rank 1");
  CHECK(peers.admit(9, "w9", joiner, c1, any_routes()) == "rank 9 is outside [0, 4)");
  WorkerAnnouncement other;
  other.name = "w2";
  CHECK(peers.admit(2, "w3", other, c1, any_routes()) ==
        "the hello names \"w3\" but the announcement \"w2\"");
  CHECK(peers.admit(2, "w2", other, c1, [](const std::vector<rpc::WorkerDevices>&)
                        -> PeerTable::DeviceRoutes { throw std::invalid_argument("bad map"); }) ==
        "bad map");

  const auto goodbyes = peers.close_to_newcomers();
  CHECK(goodbyes.size() == 1);
  CHECK(peers.admit(2, "w2", other, c1, any_routes()) == "\"w0\" is leaving the group");
  CHECK(peers.workers().size() == 2);
}
