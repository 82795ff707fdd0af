// wait_for_quiet_group(): what join() and graceful shutdown wait for in a
// static group: that no worker of the group has a call in flight, and that
// none will make another, however calls move between workers. One
// implementation for every agent built on the call table (rpc/call_table.h),
// over the group's store.
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
// Errors, each naming `who` and, where it applies, the workers:
//   TimeoutError after `timeout` (0: none): this worker still had calls in
//     flight or requests being handled; or workers did not report (named);
//     or the group was still busy (the workers still at work named);
//   ConnectionError: workers that `gone` reports gone (shut down without
//     joining, lost) before they reported;
//   Error(kCancelled): this worker's table was closed meanwhile.
// Thread safety: one call per worker at a time (join() is serialized).
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "rpc/call_table.h"
#include "store/store.h"

namespace switchboard::rpc {

struct QuietGroup {
  CallTable* calls = nullptr;  // this worker's table
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

}  // namespace switchboard::rpc
