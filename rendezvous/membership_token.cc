#include "rendezvous/membership_token.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "common/check.h"
#include "common/error.h"

namespace switchboard::rendezvous {

namespace {

using Duration = MembershipToken::Duration;

// Where older versions wrote the lease's expiry (see the header): the
// largest int64, an expiry they never reach.
constexpr int64_t kOlderVersionsExpiry = std::numeric_limits<int64_t>::max();

std::string to_string(const Bytes& bytes) { return std::string(bytes.begin(), bytes.end()); }
Bytes to_bytes(const std::string& text) { return Bytes(text.begin(), text.end()); }

int64_t to_ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration_cast<Duration>(d).count();
}

// A whole field that is a decimal int64; nullopt for anything else (a
// sign, spaces, overflow, trailing bytes).
std::optional<int64_t> parse_int(std::string_view field) {
  int64_t value = 0;
  const char* end = field.data() + field.size();
  auto [ptr, ec] = std::from_chars(field.data(), end, value);
  if (field.empty() || ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

std::vector<std::string_view> split_lines(std::string_view value) {
  std::vector<std::string_view> fields;
  size_t start = 0;
  while (true) {
    const size_t newline = value.find('\n', start);
    if (newline == std::string_view::npos) break;
    fields.push_back(value.substr(start, newline - start));
    start = newline + 1;
    if (fields.size() > 4) return fields;  // more than any value has; not one
  }
  fields.push_back(value.substr(start));
  return fields;
}

// Bytes from the Store, fit for a message: quoted, with quotes,
// backslashes and anything but printable ASCII escaped, and cut after 64
// bytes (the Store is reachable by peers; a value may be anything).
std::string quoted(std::string_view bytes) {
  constexpr size_t kShown = 64;
  std::string out = "\"";
  for (size_t i = 0; i < bytes.size() && i < kShown; ++i) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  out += '"';
  if (bytes.size() > kShown) out += fmt::format(" (first {} of {} bytes)", kShown, bytes.size());
  return out;
}

// What a waiter reads in a token value: who holds it and what the value
// is, for messages, and the lease to wait out, counted from its own first
// sight of the value.
struct Lease {
  std::string holder;  // `"w1"`, or `an unknown holder`
  std::string value;   // `its value`, `an older version's value` or `the value "..."`
  Duration length;
  bool assumed;  // the value carries no lease this version reads
};

Lease read_lease(const std::string& value, Duration fallback) {
  const std::vector<std::string_view> fields = split_lines(value);
  if (fields.size() == 4 && !fields[0].empty() && parse_int(fields[1]) == kOlderVersionsExpiry) {
    const std::optional<int64_t> ms = parse_int(fields[2]);
    if (ms && *ms > 0) return {quoted(fields[0]), "its value", Duration(*ms), false};
  }
  if (fields.size() == 3 && !fields[0].empty() && parse_int(fields[1])) {
    // An older version's value: its expiry is in the writer's wall-clock
    // time, which this worker does not trust.
    return {quoted(fields[0]), "an older version's value", fallback, true};
  }
  return {"an unknown holder", "the value " + quoted(value) + ", no token value,", fallback,
          true};
}

// Who took a token away from a holder, for renew()'s and release()'s
// errors: `current` is what compare_set(mine, ...) returned instead of
// succeeding; `mine` back means the key is gone.
std::string taker_of(const std::string& current, const std::string& mine) {
  if (current == mine) return "nobody (the token's key was deleted from the store)";
  if (current.empty()) return "another worker, which has released it since";
  const Lease lease = read_lease(current, MembershipToken::kDefaultLease);
  return lease.assumed ? fmt::format("{} ({})", lease.holder, lease.value) : lease.holder;
}

}  // namespace

MembershipToken::MembershipToken(std::shared_ptr<Store> store, std::string key,
                                 std::string holder, Duration lease, Clock clock)
    : store_(std::move(store)),
      key_(std::move(key)),
      holder_(std::move(holder)),
      lease_(lease),
      clock_(std::move(clock)) {
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

MembershipToken::TimePoint MembershipToken::now() const {
  return clock_ ? clock_() : std::chrono::steady_clock::now();
}

// A value this version cannot read gets no shorter wait than the default,
// nor than this worker's own lease (the one its group is configured with).
MembershipToken::Duration MembershipToken::fallback_lease() const {
  return std::max(kDefaultLease, lease_);
}

std::string MembershipToken::make_value() const {
  // The nonce makes every value unique, so that compare_set returning the
  // desired value means this call wrote it, and a value seen twice was
  // never replaced in between. A random per-process prefix keeps it apart
  // from other processes' (whose counters run alike), a counter from this
  // process' other values; no clock is involved.
  static const uint64_t process = [] {
    std::random_device device;
    return (static_cast<uint64_t>(device()) << 32) ^ device();
  }();
  static std::atomic<uint64_t> counter{0};
  return fmt::format("{}\n{}\n{}\n{:x}-{:x}", holder_, kOlderVersionsExpiry, lease_.count(),
                     process, counter.fetch_add(1));
}

void MembershipToken::observe(const std::string& value, TimePoint at) {
  if (value == observed_) return;
  observed_ = value;
  observed_since_ = at;
}

void MembershipToken::acquire(Duration timeout, const std::function<bool()>& abandon) {
  SB_REQUIRE(!held(), "membership token \"{}\": \"{}\" already holds it", key_, holder_);
  const auto deadline = now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  while (true) {
    const std::string mine = make_value();
    std::string current = to_string(store_->compare_set(key_, {}, to_bytes(mine)));
    if (current == mine) {
      value_ = mine;
      observed_.clear();
      return;
    }
    // The Store read the value before this clock reading: counting from
    // here can only make the value look younger than it is.
    const TimePoint seen_at = now();
    observe(current, seen_at);
    if (!current.empty()) {
      const Lease lease = read_lease(current, fallback_lease());
      // In ms: a lease read from the Store may be any int64, too long for
      // the clock's nanoseconds.
      const int64_t unchanged = to_ms(seen_at - observed_since_);
      if (unchanged >= lease.length.count()) {
        // Unchanged for a whole lease as this worker saw it: take it over,
        // unless the holder renewed meanwhile or another waiter got there
        // first (then compare_set returns that value).
        const std::string taken = current;
        current = to_string(store_->compare_set(key_, to_bytes(taken), to_bytes(mine)));
        if (current == mine) {
          spdlog::warn("membership token \"{}\": \"{}\" took it over from {} ({} unchanged "
                       "for {} ms as \"{}\" saw it, a whole lease of {} ms{})",
                       key_, holder_, lease.holder, lease.value, unchanged, holder_,
                       lease.length.count(), lease.assumed ? ", assumed" : "");
          value_ = mine;
          observed_.clear();
          return;
        }
        // A missing key returns `taken` again: the next try takes it.
        observe(current, now());
      }
    }
    const auto t = now();
    if (t >= deadline) {
      if (observed_.empty()) {
        throw TimeoutError(fmt::format(
            "membership token \"{}\": \"{}\" could not take it within {} ms; the store "
            "answered with an empty value that compare_set did not replace",
            key_, holder_, timeout.count()));
      }
      const Lease lease = read_lease(observed_, fallback_lease());
      const int64_t unchanged = to_ms(t - observed_since_);
      throw TimeoutError(fmt::format(
          "membership token \"{}\": \"{}\" could not take it within {} ms; held by {} ({} "
          "unchanged for {} ms as \"{}\" saw it; lease of {} ms{} ends in {} ms unless "
          "renewed)",
          key_, holder_, timeout.count(), lease.holder, lease.value, unchanged, holder_,
          lease.length.count(), lease.assumed ? ", assumed," : "",
          std::max<int64_t>(0, lease.length.count() - unchanged)));
    }
    if (abandon && abandon()) {
      throw Error(ErrorCode::kCancelled,
                  fmt::format("membership token \"{}\": \"{}\" stopped waiting for it", key_,
                              holder_));
    }
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(pause, deadline - t));
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

void MembershipToken::renew() {
  SB_REQUIRE(held(), "membership token \"{}\": renew() by \"{}\", which does not hold it",
             key_, holder_);
  const std::string mine = make_value();
  const std::string current = to_string(store_->compare_set(key_, to_bytes(value_), to_bytes(mine)));
  if (current != mine) {
    const std::string lost = std::exchange(value_, std::string());
    throw Error(ErrorCode::kFailedPrecondition,
                fmt::format("membership token \"{}\": \"{}\" lost it to {} (its lease had "
                            "ended)",
                            key_, holder_, taker_of(current, lost)));
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
                fmt::format("membership token \"{}\": \"{}\" lost it to {} before "
                            "releasing it (its lease had ended)",
                            key_, holder_, taker_of(current, mine)));
  }
}

}  // namespace switchboard::rendezvous
