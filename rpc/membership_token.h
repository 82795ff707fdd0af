// MembershipToken: the lock that serializes joins and leaves of a dynamic
// group, held in the group's Store.
//
// A worker that joins or leaves a dynamic group first takes the token, then
// changes the membership, then releases it, so that every member sees
// changes one at a time and in one order. The token is one key whose value
// names the holder:
//
//   "<holder>\n<expiry: ms since the Unix epoch>\n<nonce>"   held
//   "" (or no key)                                          free
//
// Taking it is compare_set("", mine); releasing it is compare_set(mine, "").
//
// A lease, not a session: the Store protocol (PyTorch's TCPStore) has no
// keys that vanish with their client's connection, so a holder that dies
// cannot release the token. Instead every hold is a lease of `lease` (10 s
// by default): once it is over, the next worker that wants the token takes
// it over (compare_set(old, mine), so two of them cannot both win). A
// holder that needs longer calls renew() before its lease ends. The rule
// for users: a worker killed while joining or leaving holds the others up
// for at most one lease. Expiry compares wall clocks (system_clock), so
// workers on different hosts need clocks that agree to well within a lease.
//
// Errors: acquire() throws TimeoutError when the token stays taken past its
// timeout, naming the holder and when its lease ends, e.g.
//   `membership token "pipe/dyn/token": "w3" could not take it within 200 ms;
//    held by "w1" (lease ends in 9800 ms)`
// renew() and release() throw Error(kFailedPrecondition) naming the worker that took
// the token over when this holder's lease had run out. Store errors
// propagate.
//
// Thread safety: none; one MembershipToken per joining or leaving worker,
// used from one thread. Different workers (processes) share the token
// through the Store.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "store/store.h"

namespace switchboard::rpc {

class MembershipToken {
 public:
  using Duration = std::chrono::milliseconds;
  static constexpr Duration kDefaultLease{10'000};

  // `key` is the token's key in `store`; `holder` names this worker in the
  // token (and in other workers' errors). Makes no Store call.
  MembershipToken(std::shared_ptr<Store> store, std::string key, std::string holder,
                  Duration lease = kDefaultLease);
  // Releases the token if still held (errors are logged, not thrown).
  ~MembershipToken();
  MembershipToken(const MembershipToken&) = delete;
  MembershipToken& operator=(const MembershipToken&) = delete;

  // Takes the token, taking over one whose lease has ended; waits (polling
  // the Store, 1 ms doubling to 50 ms between tries) up to `timeout` for a
  // taken one to be released. Precondition: not held.
  void acquire(Duration timeout);
  // Extends the lease to `lease` from now. Precondition: held.
  void renew();
  // Frees the token. Precondition: held. After it, acquire() may be called
  // again.
  void release();

  bool held() const { return !value_.empty(); }

  // The holder named in a token value ("" for a free token).
  static std::string holder_of(const std::string& value);

 private:
  std::string make_value() const;

  std::shared_ptr<Store> store_;
  const std::string key_;
  const std::string holder_;
  const Duration lease_;
  std::string value_;  // what this holder wrote; empty when not held
};

}  // namespace switchboard::rpc
