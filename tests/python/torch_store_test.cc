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

namespace {

// Over `torch_store` (its timeout set to 50 ms): a wait and a get that run
// out of time are TimeoutErrors naming the keys. Returns the wait's message.
std::string require_timeouts(const c10::intrusive_ptr<c10d::Store>& torch_store) {
  torch_store->setTimeout(50ms);
  torch_rpc::TorchStore store(torch_store);
  std::string message;
  try {
    store.wait({"never"}, 50ms);
    FAIL("wait returned for a key never set");
  } catch (const TimeoutError& e) {
    message = e.what();
    CHECK_THAT(message, Catch::Contains("torch store wait of [never] timed out"));
  }
  CHECK_THROWS_AS(store.get("missing"), TimeoutError);
  store.set("k", to_bytes("v"));
  store.wait({"k"}, 50ms);
  return message;
}

}  // namespace

TEST_CASE("a wait or get that runs out of time in torch's store is a TimeoutError naming the "
          "keys",
          "[torch][store]") {
  require_timeouts(c10::make_intrusive<c10d::HashStore>());
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
  CHECK_THAT(require_timeouts(c10::make_intrusive<c10d::FileStore>(path, 1)),
             Catch::Contains("timed out after 50 ms"));
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
