// wait_for_quiet_group(): what join() and graceful shutdown wait for in a
// static group: that no worker of the group has a call in flight, and that
// none will make another, however calls move between workers. One
// implementation for every agent, over the group's store; the agent's call
// table (rpc/call_table.h) tells this worker's side through LocalCalls.
//
// Why a barrier after draining is not enough: a worker that drained may be
// called again by a peer still at work (a call that moves on from worker to
// worker, each handler calling the next one without waiting for it), and
// starts new calls after it passed. PyTorch repeats its all-worker check
// until no worker has calls in flight; so does this.
//
// The rounds: each worker waits until its own table is idle (no call in
// flight, no request being handled), then publishes its activity: the calls
// in flight and the requests being handled now, plus the calls it started
// since its previous report. A round where every worker reported none ends
// the wait: no call was in flight anywhere, and any call started later would
// have to come from a handler serving a call that was counted. (A handler
// that hands work to a thread of its own, to call later, escapes this, as it
// escapes PyTorch's check.)
//
// After the quiet round, rank 0 returns only once every other rank has said
// it read it (or is gone, or the timeout passed): rank 0 may host the store
// (an in-process TcpStore server), and leaving first it would fail the
// others' last reads.
//
// A worker that is gone (`gone` says so while it is awaited) is left out of
// the rounds from then on: the workers still there go on until they are
// quiet among themselves, so that none stops while another still calls it,
// and then every one of them fails, naming the workers that are gone.
// The timeout bounds every store call of the wait as well
// (store/call_bound.h): a store whose server went away fails the wait by
// then.
//
// Errors, each naming `who` and, where it applies, the workers:
//   TimeoutError after `timeout` (0: none): this worker still had calls in
//     flight or requests being handled; or workers did not report (named);
//     or the group was still busy (the workers still at work named);
//   ConnectionError: workers that `gone` reported gone (shut down without
//     joining, lost) before they reported, once the others were quiet; or
//     the store could not be reached;
//   Error(kCancelled): this worker's table was closed meanwhile.
// Thread safety: one call per worker at a time (join() is serialized).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "store/store.h"

namespace switchboard::rendezvous {

// This worker's calls, as the rounds need them (rpc::CallTable's adapter is
// rpc::QuietCalls). Called from the thread that waits.
class LocalCalls {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Idle { kIdle, kTimedOut, kClosed };
  struct Activity {
    uint64_t in_flight = 0;  // calls made and not yet completed
    uint64_t handling = 0;   // requests accepted and not yet answered
    uint64_t started = 0;    // every call ever made
  };
  virtual ~LocalCalls() = default;
  // Returns once no call is in flight and no request is being handled
  // (kIdle), at `deadline` (kTimedOut), or once the agent shut down (kClosed).
  virtual Idle wait_idle(std::optional<Clock::time_point> deadline) = 0;
  virtual Activity activity() const = 0;
  virtual bool closed() const = 0;
  virtual std::string agent_name() const = 0;
};

struct QuietGroup {
  LocalCalls* calls = nullptr;  // this worker's
  Store* store = nullptr;      // shared by the group
  // Where this wait's rounds go: unique to the wait, the same on every
  // worker (e.g. "rpc/join/<generation>/"). Round k of rank r is the key
  // "<prefix><k>/<r>".
  std::string prefix;
  int rank = 0;
  std::vector<std::string> names;  // the workers, by rank (for errors)
  // How rank r is gone, when it is ("shut down", "was lost: ..."); null or
  // nullopt: not known to be gone. Called while waiting for a round.
  std::function<std::optional<std::string>(int rank)> gone;
  std::chrono::milliseconds timeout{0};  // 0: no bound
  std::string who;  // starts every error, e.g. `join on rpc worker "w0"`
};

// Returns once the group is quiet (see the top of this file); throws as
// described there. Returns the number of rounds it took.
int wait_for_quiet_group(const QuietGroup& group);

}  // namespace switchboard::rendezvous
