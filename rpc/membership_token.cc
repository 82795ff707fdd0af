#include "rpc/membership_token.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <optional>
#include <utility>
#include <thread>

#include "common/check.h"
#include "common/error.h"

namespace switchboard::rpc {

namespace {

using SteadyClock = std::chrono::steady_clock;

int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string to_string(const Bytes& bytes) { return std::string(bytes.begin(), bytes.end()); }
Bytes to_bytes(const std::string& text) { return Bytes(text.begin(), text.end()); }

// The expiry written in a token value; nullopt when the value is not one
// (then it is treated as expired, so a corrupt token cannot wedge a group).
std::optional<int64_t> expiry_of(const std::string& value) {
  const size_t first = value.find('\n');
  if (first == std::string::npos) return std::nullopt;
  const size_t second = value.find('\n', first + 1);
  if (second == std::string::npos) return std::nullopt;
  int64_t expiry = 0;
  const char* begin = value.data() + first + 1;
  const char* end = value.data() + second;
  auto [ptr, ec] = std::from_chars(begin, end, expiry);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return expiry;
}

}  // namespace

MembershipToken::MembershipToken(std::shared_ptr<Store> store, std::string key,
                                 std::string holder, Duration lease)
    : store_(std::move(store)), key_(std::move(key)), holder_(std::move(holder)), lease_(lease) {
  SB_REQUIRE(store_ != nullptr, "membership token \"{}\": the store is null", key_);
  SB_REQUIRE(!holder_.empty() && holder_.find('\n') == std::string::npos,
             "membership token \"{}\": the holder name must be non-empty and have no "
             "newline, got \"{}\"",
             key_, holder_);
  SB_REQUIRE(lease_.count() > 0, "membership token \"{}\": the lease must be positive", key_);
}

MembershipToken::~MembershipToken() {
  if (!held()) return;
  try {
    release();
  } catch (const std::exception& e) {
    spdlog::warn("membership token \"{}\": \"{}\" could not release it: {}", key_, holder_,
                 e.what());
  }
}

std::string MembershipToken::holder_of(const std::string& value) {
  return value.substr(0, value.find('\n'));
}

std::string MembershipToken::make_value() const {
  // The nonce makes every value unique, so that compare_set returning the
  // desired value means this call wrote it.
  static std::atomic<uint64_t> counter{0};
  const uint64_t nonce =
      (static_cast<uint64_t>(SteadyClock::now().time_since_epoch().count()) << 8) ^
      counter.fetch_add(1) ^ reinterpret_cast<uintptr_t>(this);
  return fmt::format("{}\n{}\n{:x}", holder_, wall_ms() + lease_.count(), nonce);
}

void MembershipToken::acquire(Duration timeout) {
  SB_REQUIRE(!held(), "membership token \"{}\": \"{}\" already holds it", key_, holder_);
  const auto deadline = SteadyClock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  std::string seen;  // the value that kept us out last time
  while (true) {
    const std::string mine = make_value();
    std::string current = to_string(store_->compare_set(key_, {}, to_bytes(mine)));
    if (current == mine) {
      value_ = mine;
      return;
    }
    const std::optional<int64_t> expiry = expiry_of(current);
    if (!current.empty() && (!expiry || *expiry <= wall_ms())) {
      // The holder's lease is over: take it over, unless another waiter
      // got there first (then compare_set returns that one's value).
      current = to_string(store_->compare_set(key_, to_bytes(current), to_bytes(mine)));
      if (current == mine) {
        spdlog::warn("membership token \"{}\": \"{}\" took it over from \"{}\", whose lease "
                     "had ended",
                     key_, holder_, holder_of(seen.empty() ? current : seen));
        value_ = mine;
        return;
      }
    }
    seen = current;
    const auto now = SteadyClock::now();
    if (now >= deadline) {
      const std::optional<int64_t> ends = expiry_of(seen);
      throw TimeoutError(fmt::format(
          "membership token \"{}\": \"{}\" could not take it within {} ms; held by \"{}\" "
          "(lease ends in {} ms)",
          key_, holder_, timeout.count(), holder_of(seen),
          ends ? std::max<int64_t>(0, *ends - wall_ms()) : 0));
    }
    std::this_thread::sleep_for(
        std::min<SteadyClock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

void MembershipToken::renew() {
  SB_REQUIRE(held(), "membership token \"{}\": renew() by \"{}\", which does not hold it",
             key_, holder_);
  const std::string mine = make_value();
  const std::string current = to_string(store_->compare_set(key_, to_bytes(value_), to_bytes(mine)));
  if (current != mine) {
    value_.clear();
    throw Error(ErrorCode::kFailedPrecondition,
                fmt::format("membership token \"{}\": \"{}\" lost it to \"{}\" (its lease had "
                            "ended)",
                            key_, holder_, holder_of(current)));
  }
  value_ = mine;
}

void MembershipToken::release() {
  SB_REQUIRE(held(), "membership token \"{}\": release() by \"{}\", which does not hold it",
             key_, holder_);
  const std::string mine = std::exchange(value_, std::string());
  const std::string current = to_string(store_->compare_set(key_, to_bytes(mine), {}));
  if (!current.empty()) {
    throw Error(ErrorCode::kFailedPrecondition,
                fmt::format("membership token \"{}\": \"{}\" lost it to \"{}\" before "
                            "releasing it (its lease had ended)",
                            key_, holder_, holder_of(current)));
  }
}

}  // namespace switchboard::rpc
