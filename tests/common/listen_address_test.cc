// The rule every listener of a worker follows (common/listen_address.h):
// the option, SWITCHBOARD_IFNAME, the component's older variables, then the
// address that routes to the store. Across real hosts (network namespaces)
// in tests/multihost.
#include "common/listen_address.h"

#include <catch2/catch.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/util/scoped_env.h"

using sbtest::ScopedEnv;
using switchboard::choose_listen_address;
using switchboard::ListenAddressRequest;
using switchboard::route_source_address;

namespace {

ListenAddressRequest pipe_like(std::string option = "") {
  ListenAddressRequest r;
  r.component = "PIPE";
  r.option = std::move(option);
  r.aliases = {{"SB_TEST_OLD_IFNAME"}, {"SB_TEST_OLD_HOSTNAME", /*host_name=*/true}};
  return r;
}

std::string error_of(const ListenAddressRequest& r) {
  try {
    choose_listen_address(r);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  FAIL("no error");
  return "";
}

}  // namespace

TEST_CASE("the option, then SWITCHBOARD_IFNAME, then the older variables, in that order",
          "[listen_address]") {
  ScopedEnv ifname("SWITCHBOARD_IFNAME", std::nullopt);
  ScopedEnv old_if("SB_TEST_OLD_IFNAME", std::nullopt);
  ScopedEnv old_host("SB_TEST_OLD_HOSTNAME", std::nullopt);
  ScopedEnv master("MASTER_ADDR", "127.0.0.1");
  CHECK(choose_listen_address(pipe_like("127.0.0.3")).address == "127.0.0.3");
  CHECK(choose_listen_address(pipe_like("lo")).address == "127.0.0.1");
  {
    ScopedEnv host("SB_TEST_OLD_HOSTNAME", "localhost");
    const auto chosen = choose_listen_address(pipe_like());
    CHECK((chosen.address == "127.0.0.1" || chosen.address == "::1"));
    CHECK_THAT(chosen.reason, Catch::Contains("SB_TEST_OLD_HOSTNAME"));
    ScopedEnv old("SB_TEST_OLD_IFNAME", "127.0.0.4");
    CHECK(choose_listen_address(pipe_like()).address == "127.0.0.4");  // earlier alias
    ScopedEnv one("SWITCHBOARD_IFNAME", "127.0.0.5");
    CHECK(choose_listen_address(pipe_like()).address == "127.0.0.5");  // before aliases
    CHECK(choose_listen_address(pipe_like("127.0.0.6")).address == "127.0.0.6");  // option
  }
}

TEST_CASE("a setting that names no address, interface or host is an error naming it",
          "[listen_address]") {
  ScopedEnv ifname("SWITCHBOARD_IFNAME", std::nullopt);
  CHECK_THAT(error_of(pipe_like("no_such_if0")),
             Catch::Contains("PIPE") && Catch::Contains("option") &&
                 Catch::Contains("\"no_such_if0\""));
  ScopedEnv bad("SWITCHBOARD_IFNAME", "no_such_if0");
  CHECK_THAT(error_of(pipe_like()),
             Catch::Contains("SWITCHBOARD_IFNAME") && Catch::Contains("\"no_such_if0\""));
}

TEST_CASE("without a setting, the address that routes to the store: loopback exactly when "
          "the store is on loopback",
          "[listen_address]") {
  ScopedEnv ifname("SWITCHBOARD_IFNAME", std::nullopt);
  ScopedEnv old_if("SB_TEST_OLD_IFNAME", std::nullopt);
  ScopedEnv old_host("SB_TEST_OLD_HOSTNAME", std::nullopt);
  CHECK(route_source_address("127.0.0.1") == "127.0.0.1");
  CHECK(route_source_address("127.0.0.9") == "127.0.0.1");
  CHECK(route_source_address("no-such-host.invalid").empty());
  {
    ScopedEnv master("MASTER_ADDR", "127.0.0.1");
    const auto chosen = choose_listen_address(pipe_like());
    CHECK(chosen.address == "127.0.0.1");
    CHECK_THAT(chosen.reason, Catch::Contains("routes to the store at 127.0.0.1"));
  }
  ListenAddressRequest r = pipe_like();
  r.store_host = "127.0.0.1";  // what the caller knows wins over MASTER_ADDR
  ScopedEnv master("MASTER_ADDR", "no-such-host.invalid");
  CHECK(choose_listen_address(r).address == "127.0.0.1");
}

TEST_CASE("SWITCHBOARD_PORT_RANGE and the option: LO-HI or one port, errors naming them",
          "[listen_address][ports]") {
  using switchboard::port_range;
  ScopedEnv unset("SWITCHBOARD_PORT_RANGE", std::nullopt);
  CHECK_FALSE(port_range().has_value());
  auto r = port_range("30000-30010");
  REQUIRE(r.has_value());
  CHECK(r->lo == 30000);
  CHECK(r->hi == 30010);
  CHECK(r->source == "the port_range option");
  r = port_range("29500");
  REQUIRE(r.has_value());
  CHECK((r->lo == 29500 && r->hi == 29500));
  {
    ScopedEnv env("SWITCHBOARD_PORT_RANGE", "40000-40001");
    r = port_range();
    REQUIRE(r.has_value());
    CHECK((r->lo == 40000 && r->hi == 40001 && r->source == "SWITCHBOARD_PORT_RANGE"));
    CHECK(port_range("5-6")->lo == 5);  // the option wins
  }
  for (const char* bad : {"0-10", "10-5", "1-65536", "a-b", "-5", "5-", "1--2", " 5"}) {
    INFO(bad);
    ScopedEnv env("SWITCHBOARD_PORT_RANGE", bad);
    try {
      port_range();
      FAIL("accepted");
    } catch (const std::invalid_argument& e) {
      CHECK_THAT(e.what(), Catch::Contains("SWITCHBOARD_PORT_RANGE") &&
                               Catch::Contains(std::string("\"") + bad + "\""));
    }
  }
}

TEST_CASE("bind_in_range takes the first port that binds, and names the range when none does",
          "[listen_address][ports]") {
  using switchboard::bind_in_range;
  using switchboard::PortRange;
  const PortRange range{30000, 30003, "SWITCHBOARD_PORT_RANGE"};
  std::vector<uint16_t> tried;
  const uint16_t port = bind_in_range(range, "PIPE agent \"w0\"", [&](uint16_t p) {
    tried.push_back(p);
    return p < 30002 ? std::string("Address already in use") : std::string();
  });
  CHECK(port == 30002);
  CHECK(tried == std::vector<uint16_t>{30000, 30001, 30002});
  try {
    bind_in_range(range, "PIPE agent \"w0\"",
                  [](uint16_t) { return std::string("Address already in use"); });
    FAIL("no error");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) ==
          "PIPE agent \"w0\": no free port in 30000-30003 (SWITCHBOARD_PORT_RANGE); the last "
          "one tried, 30003: Address already in use");
  }
}
