// The rule every listener of a worker follows (common/listen_address.h):
// the option, SWITCHBOARD_IFNAME, the component's older variables, then the
// address that routes to the store. Across real hosts (network namespaces)
// in tests/multihost.
#include "common/listen_address.h"

#include <catch2/catch.hpp>
#include <stdexcept>
#include <string>

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
