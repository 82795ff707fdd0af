#include "python/csrc/torch_store.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <optional>
#include <utility>

#include "common/check.h"
#include "common/error.h"

namespace switchboard::torch_rpc {

namespace {

// What "no timeout" is passed to torch as: a year.
constexpr std::chrono::milliseconds kForever = std::chrono::hours(24 * 365);

std::string joined(const std::vector<std::string>& keys) {
  return fmt::format("{}", fmt::join(keys, ", "));
}

using Clock = std::chrono::steady_clock;

// Runs `f`, turning torch's errors into Switchboard's by their type (see
// the header). `waits_up_to`: how long `f` may block waiting for keys (a
// wait's timeout, a get's store timeout); a failure after at least that
// long is that time running out, whatever torch threw.
template <typename F>
auto translated(const char* what, const std::string& keys, F&& f,
                std::optional<std::chrono::milliseconds> waits_up_to = std::nullopt)
    -> decltype(f()) {
  const Clock::time_point start = Clock::now();
  try {
    return f();
  } catch (const c10::DistStoreError& e) {
    throw TimeoutError(fmt::format("torch store {} of [{}] timed out: {}", what, keys,
                                   e.what_without_backtrace()));
  } catch (const c10::DistNetworkError& e) {
    throw ConnectionError(fmt::format("torch store {} of [{}] failed: {}", what, keys,
                                      e.what_without_backtrace()));
  } catch (const c10::Error& e) {
    if (waits_up_to && Clock::now() - start >= *waits_up_to) {
      throw TimeoutError(fmt::format("torch store {} of [{}] timed out after {} ms: {}", what,
                                     keys, waits_up_to->count(), e.what_without_backtrace()));
    }
    throw Error(ErrorCode::kUnavailable, fmt::format("torch store {} of [{}] failed: {}", what,
                                                     keys, e.what_without_backtrace()));
  }
}

}  // namespace

TorchStore::TorchStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {
  SB_REQUIRE(store_, "TorchStore: no store");
  set_timeout(store_->getTimeout());
}

void TorchStore::set(const std::string& key, const Bytes& value) {
  translated("set", key, [&] { store_->set(key, value); });
}

Bytes TorchStore::get(const std::string& key) {
  return translated("get", key, [&] { return store_->get(key); }, store_->getTimeout());
}

int64_t TorchStore::add(const std::string& key, int64_t delta) {
  return translated("add", key, [&] { return store_->add(key, delta); });
}

Bytes TorchStore::compare_set(const std::string& key, const Bytes& expected,
                              const Bytes& desired) {
  return translated("compare_set", key,
                    [&] { return store_->compareSet(key, expected, desired); });
}

void TorchStore::wait(const std::vector<std::string>& keys, Timeout timeout) {
  // Our kNoTimeout (0) is "forever"; PyTorch 2.x's TCPStore client reads a
  // 0 ms wait as one that times out at once.
  const Timeout torch_timeout = timeout == kNoTimeout ? kForever : timeout;
  translated("wait", joined(keys), [&] { store_->wait(keys, torch_timeout); }, torch_timeout);
}

bool TorchStore::check(const std::vector<std::string>& keys) {
  return translated("check", joined(keys), [&] { return store_->check(keys); });
}

bool TorchStore::delete_key(const std::string& key) {
  return translated("delete", key, [&] { return store_->deleteKey(key); });
}

int64_t TorchStore::num_keys() {
  return translated("num_keys", "", [&] { return store_->getNumKeys(); });
}

}  // namespace switchboard::torch_rpc
