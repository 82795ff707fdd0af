// How GlooProcessGroup picks its network interface: options first, then
// SWITCHBOARD_GLOO_SOCKET_IFNAME, then PyTorch's GLOO_SOCKET_IFNAME.
#include <catch2/catch.hpp>
#include <stdlib.h>

#include <string>

#include "collective/gloo_process_group.h"
#include "common/error.h"
#include "store/hash_store.h"
#include "tests/util/scoped_env.h"

namespace sb = switchboard;
namespace col = switchboard::collective;
using Catch::Matchers::Contains;

namespace {

using sbtest::ScopedEnv;

col::GlooOptions named(const std::string& name) {
  col::GlooOptions options;
  options.group_name = name;
  options.timeout = std::chrono::seconds(30);
  return options;
}

}  // namespace

TEST_CASE("The loopback interface can be chosen by name", "[gloo][iface]") {
  sb::HashStore store;
  auto options = named("iface_option");
  options.iface = "lo";
  col::GlooProcessGroup group(store, 0, 1, options);
  CHECK_THAT(group.device_description(), Contains("127.0.0.1"));
}

TEST_CASE("SWITCHBOARD_GLOO_SOCKET_IFNAME and GLOO_SOCKET_IFNAME choose the "
          "interface",
          "[gloo][iface]") {
  sb::HashStore store;
  SECTION("Switchboard's variable") {
    ScopedEnv env("SWITCHBOARD_GLOO_SOCKET_IFNAME", "lo");
    col::GlooProcessGroup group(store, 0, 1, named("iface_env_sb"));
    CHECK_THAT(group.device_description(), Contains("127.0.0.1"));
  }
  SECTION("PyTorch's variable") {
    ScopedEnv env("GLOO_SOCKET_IFNAME", "lo");
    col::GlooProcessGroup group(store, 0, 1, named("iface_env_torch"));
    CHECK_THAT(group.device_description(), Contains("127.0.0.1"));
  }
}

TEST_CASE("An interface that does not exist is an error naming it",
          "[gloo][iface]") {
  sb::HashStore store;
  auto options = named("iface_missing");
  options.iface = "no-such-if0";
  REQUIRE_THROWS_MATCHES(
      col::GlooProcessGroup(store, 0, 1, options), sb::ConnectionError,
      Catch::Matchers::Predicate<sb::ConnectionError>(
          [](const sb::ConnectionError& e) {
            const std::string what = e.what();
            return what.find("no-such-if0") != std::string::npos &&
                   what.find("iface_missing") != std::string::npos;
          },
          "names the interface and the group"));
}

TEST_CASE("A hostname option binds that address", "[gloo][iface]") {
  sb::HashStore store;
  auto options = named("iface_hostname");
  options.hostname = "127.0.0.1";
  col::GlooProcessGroup group(store, 0, 1, options);
  CHECK_THAT(group.device_description(), Contains("127.0.0.1"));
}
