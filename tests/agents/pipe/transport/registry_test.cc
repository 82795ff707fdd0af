// The transport registry (agents/pipe/transport/registry.h): the built-in
// transports and their priorities, which of them a worker's options
// choose, what turns an upgrade off, and the refusals of add() and
// choose().
#include "agents/pipe/transport/registry.h"

#include <catch2/catch.hpp>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

using namespace switchboard::agents::pipe::transport;

namespace {

std::vector<std::string> names(const std::vector<const TransportEntry*>& entries) {
  std::vector<std::string> out;
  for (const TransportEntry* e : entries) out.push_back(e->name);
  return out;
}

TransportOptions with_tls() {
  TransportOptions o;
  o.tls = {"cert.pem", "key.pem", "ca.pem"};  // only enabled() matters to the choice
  return o;
}

TransportEntry stream(std::string name, int priority, std::string why_not = "") {
  TransportEntry e;
  e.name = std::move(name);
  e.priority = priority;
  e.unavailable = [why_not](const TransportOptions&) { return why_not; };
  e.make = [](ConnectionEvents&, TransportOptions) -> std::unique_ptr<PipeTransport> {
    return nullptr;
  };
  return e;
}

}  // namespace

TEST_CASE("the built-ins are tls, tcp and the shm upgrade of tcp, by priority",
          "[pipe][transport]") {
  const std::vector<TransportEntry>& entries = builtin_transports().entries();
  REQUIRE(entries.size() == 3);
  CHECK(entries[0].name == "shm");
  CHECK(entries[0].priority == 300);
  CHECK(entries[0].kind == TransportEntry::Kind::kUpgrade);
  CHECK(entries[0].upgrades == std::vector<std::string>{"tcp"});
  CHECK(entries[1].name == "tls");
  CHECK(entries[1].priority == 200);
  CHECK(entries[2].name == "tcp");
  CHECK(entries[2].priority == 100);
}

TEST_CASE("a worker's options choose its transport", "[pipe][transport]") {
  const TransportRegistry& registry = builtin_transports();
  SECTION("no certificates, no ring: tcp alone") {
    const auto choice = registry.choose(TransportOptions{});
    CHECK(choice.stream->name == "tcp");
    CHECK(choice.upgrades.empty());
  }
  SECTION("a ring: tcp, upgraded by shm, the ring kept") {
    TransportOptions o;
    o.lane_capacity = 1 << 20;
    const auto choice = registry.choose(o);
    CHECK(choice.stream->name == "tcp");
    CHECK(names(choice.upgrades) == std::vector<std::string>{"shm"});
    CHECK(choice.options.lane_capacity == (1u << 20));
  }
  SECTION("certificates: tls, and never the lane, whose bytes would bypass TLS") {
    TransportOptions o = with_tls();
    o.lane_capacity = 1 << 20;
    const auto choice = registry.choose(o);
    CHECK(choice.stream->name == "tls");
    CHECK(choice.upgrades.empty());
    CHECK(choice.options.lane_capacity == 0);
  }
}

TEST_CASE("add refuses a second entry of a name, and an entry it cannot use",
          "[pipe][transport]") {
  TransportRegistry registry;
  registry.add(stream("a", 1));
  REQUIRE_THROWS_MATCHES(registry.add(stream("a", 2)), std::invalid_argument,
                         Catch::Message("PIPE transport \"a\" is registered already"));
  TransportEntry no_make = stream("b", 1);
  no_make.make = nullptr;
  CHECK_THROWS_AS(registry.add(no_make), std::invalid_argument);
  TransportEntry upgrade = stream("c", 1);
  upgrade.kind = TransportEntry::Kind::kUpgrade;  // upgrades nothing, no turn_off
  CHECK_THROWS_AS(registry.add(upgrade), std::invalid_argument);
  CHECK(registry.entries().size() == 1);
}

TEST_CASE("the available stream transport of highest priority wins",
          "[pipe][transport]") {
  TransportRegistry registry;
  registry.add(stream("low", 1));
  registry.add(stream("high", 3, "not here"));
  registry.add(stream("middle", 2));
  TransportOptions o;
  o.agent_name = "w";
  CHECK(registry.choose(o).stream->name == "middle");
}

TEST_CASE("choose names why no stream transport is available", "[pipe][transport]") {
  TransportRegistry registry;
  registry.add(stream("x", 2, "no certificates"));
  registry.add(stream("y", 1, "off"));
  TransportOptions o;
  o.agent_name = "w";
  REQUIRE_THROWS_MATCHES(registry.choose(o), std::invalid_argument,
                         Catch::Message("PIPE agent \"w\": no transport can serve this "
                                        "worker (x: no certificates; y: off)"));
}
