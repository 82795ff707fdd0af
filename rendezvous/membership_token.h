// MembershipToken: the lock that serializes joins and leaves of a dynamic
// group, held in the group's Store.
//
// A worker that joins or leaves a dynamic group first takes the token, then
// changes the membership, then releases it, so that every member sees
// changes one at a time and in one order. The token is one key whose value
// names the holder and the length of its lease:
//
//   "<holder>\n9223372036854775807\n<lease ms>\n<nonce>"   held
//   "" (or no key)                                        free
//
// Taking it is compare_set("", mine); releasing it is compare_set(mine, "").
// The nonce makes every value written unique (renew() writes a new one), so
// a value that two reads return unchanged was there all the time between.
// The second field is where versions before this one wrote an expiry in
// wall-clock time; it is the largest int64, so that an older worker never
// takes over a token written by this version (it waits for its release).
//
// A lease, not a session: the Store protocol (PyTorch's TCPStore) has no
// keys that vanish with their client's connection, so a holder that dies
// cannot release the token. Instead every hold is a lease of `lease` (10 s
// by default), chosen by the holder and written in the value. A holder that
// needs longer calls renew() within each lease, which writes a new value.
//
// Nothing depends on clocks agreeing. No time is written in the value and
// no wall clock is read: a waiter judges a lease only by what it observes
// itself, namely how long the token's value has stayed unchanged, measured
// by its own steady clock from the first poll that returned that value.
// Once that reaches the lease the value carries, the waiter takes the token
// over (compare_set(old, mine), so two of them cannot both win, and a
// renewal that landed meanwhile makes it fail). Measuring from first sight
// is conservative: a waiter does not know how old the value already was,
// so it waits a full lease after it first looks. The rule for users: a
// worker killed while joining or leaving holds the others up for at most
// one lease after they first look at the token, plus their polling
// (at most 50 ms). A live holder is safe as long as each renewal lands within a
// lease of its previous write, as the holder's own clock runs; only clock
// rates matter, and those of different hosts agree to far better than
// that.
//
// Values this version cannot read (an older version's
// "<holder>\n<expiry ms since the Unix epoch>\n<nonce>", or bytes that are
// no token value at all; the Store is reachable by peers) are never taken
// over sooner: they count as a lease of max(kDefaultLease, this worker's
// lease) from first sight, an older version's by its holder's name, any
// other by an unknown holder. Their times are ignored. Hostile bytes are
// escaped and shortened in messages.
//
// Errors: acquire() throws TimeoutError when the token stays taken past its
// timeout, naming the holder, how long this worker has seen its value
// unchanged and how much of the lease is left by that count, e.g.
//   `membership token "pipe/dyn/token": "w3" could not take it within 200 ms;
//    held by "w1" (its value unchanged for 200 ms as "w3" saw it; lease of
//    10000 ms ends in 9800 ms unless renewed)`
// renew() and release() throw Error(kFailedPrecondition) naming the worker
// that took the token over when this holder's lease had run out. Store
// errors propagate.
//
// Thread safety: none; one MembershipToken per joining or leaving worker,
// used from one thread. Different workers (processes) share the token
// through the Store.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "store/store.h"

namespace switchboard::rendezvous {

class MembershipToken {
 public:
  using Duration = std::chrono::milliseconds;
  using TimePoint = std::chrono::steady_clock::time_point;
  // The clock a token measures by: its acquire() timeout and how long it
  // has seen a holder's value unchanged. Empty: std::chrono::steady_clock.
  // For tests only: a test gives tokens clocks with different offsets (as
  // different hosts' clocks have) to show that nothing compares them, or a
  // clock that runs fast to wait out a long lease quickly.
  using Clock = std::function<TimePoint()>;
  static constexpr Duration kDefaultLease{10'000};

  // `key` is the token's key in `store`; `holder` names this worker in the
  // token (and in other workers' errors); `lease` is how long others wait
  // for this worker when it holds the token and stops renewing it. Makes
  // no Store call.
  MembershipToken(std::shared_ptr<Store> store, std::string key, std::string holder,
                  Duration lease = kDefaultLease, Clock clock = {});
  // Releases the token if still held (errors are logged, not thrown).
  ~MembershipToken();
  MembershipToken(const MembershipToken&) = delete;
  MembershipToken& operator=(const MembershipToken&) = delete;

  // Takes the token, taking over one whose value this worker has seen
  // unchanged for the lease it carries; waits (polling the Store, 1 ms
  // doubling to 50 ms between tries) up to `timeout` for a taken one to be
  // released or to run out. What it has seen carries over to the next
  // acquire() on this object. `abandon`, when given, is asked between
  // tries: true ends the wait with Error(kCancelled). Precondition: not
  // held.
  void acquire(Duration timeout, const std::function<bool()>& abandon = {});
  // Writes a new value, so that waiters start their count of the lease
  // again. Precondition: held.
  void renew();
  // Frees the token. Precondition: held. After it, acquire() may be called
  // again.
  void release();

  bool held() const { return !value_.empty(); }

  // The holder named in a token value: its first line, as stored ("" for a
  // free token). Unescaped; hostile values may hold any bytes.
  static std::string holder_of(const std::string& value);

 private:
  std::string make_value() const;
  TimePoint now() const;
  Duration fallback_lease() const;
  // Notes `value` as seen at `at`; restarts the count when it changed.
  void observe(const std::string& value, TimePoint at);

  std::shared_ptr<Store> store_;
  const std::string key_;
  const std::string holder_;
  const Duration lease_;
  const Clock clock_;
  std::string value_;  // what this holder wrote; empty when not held
  // The value that kept this worker out, as last seen, and when (by
  // clock_) this worker first saw it; empty while it has seen none.
  std::string observed_;
  TimePoint observed_since_{};
};

}  // namespace switchboard::rendezvous
