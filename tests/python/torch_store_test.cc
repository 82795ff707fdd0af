// The torch store adapter (python/csrc/torch_store.h) over PyTorch's own
// HashStore: torch's errors become Switchboard's by their type, and our
// "no timeout" is no timeout to torch (PyTorch 2.x reads a 0 ms wait as one
// that times out at once).
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <thread>

#include "common/error.h"
#include "python/csrc/torch_store.h"

using namespace switchboard;
using namespace std::chrono_literals;

TEST_CASE("a wait or get that runs out of time in torch's store is a TimeoutError naming the "
          "keys",
          "[torch][store]") {
  auto torch_store = c10::make_intrusive<c10d::HashStore>();
  torch_store->setTimeout(50ms);
  torch_rpc::TorchStore store(torch_store);
  try {
    store.wait({"never"}, 50ms);
    FAIL("wait returned for a key never set");
  } catch (const TimeoutError& e) {
    CHECK_THAT(e.what(), Catch::Contains("torch store wait of [never] timed out"));
  }
  CHECK_THROWS_AS(store.get("missing"), TimeoutError);
}

TEST_CASE("a wait or get that runs out of time in torch's FileStore (file://) is a TimeoutError "
          "too, though torch throws a plain error there",
          "[torch][store]") {
  // PyTorch 2.11's FileStore says "Wait timeout" in a c10::Error, not a
  // DistStoreError: PIPE's quiet round, which waits in slices and asks
  // again after each TimeoutError, took it for a failed store and gave up
  // its graceful shutdown ~100 ms in (torch's RpcTest.test_all_gather_timeout).
  char path[] = "/tmp/sb_torch_file_store_XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::close(fd);
  {
    auto torch_store = c10::make_intrusive<c10d::FileStore>(path, 1);
    torch_store->setTimeout(50ms);
    torch_rpc::TorchStore store(torch_store);
    try {
      store.wait({"never"}, 50ms);
      FAIL("wait returned for a key never set");
    } catch (const TimeoutError& e) {
      CHECK_THAT(e.what(), Catch::Contains("torch store wait of [never] timed out after 50 ms"));
    }
    CHECK_THROWS_AS(store.get("missing"), TimeoutError);
    store.set("k", to_bytes("v"));
    store.wait({"k"}, 50ms);
  }
  ::unlink(path);
}

TEST_CASE("a wait with no timeout waits until the key is set", "[torch][store]") {
  auto torch_store = c10::make_intrusive<c10d::HashStore>();
  torch_rpc::TorchStore store(torch_store);
  std::thread setter([&] { store.set("late", to_bytes("v")); });
  store.wait({"late"}, Store::kNoTimeout);
  setter.join();
  CHECK(to_string(store.get("late")) == "v");
}
