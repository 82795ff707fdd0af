// NodeGroup: the launchers of a multi-node job as one of them sees them
// (supervisor.h, "Several nodes"): meeting in the job's store, the job's
// first failure, the heartbeats (node 0 watching the others'), and the
// job's end (each node saying it is done; node 0 keeping the store up until
// every node has). The keys are NodeLink's (node_link.h). Internal to
// //launch; the restart policy, which also goes through the store, stays
// the supervisor's (it reads and writes the attempt's keys through link()).
//
// Errors: join() and report_failure() handle the store's errors themselves
// (saying so on stderr); recorded_failure(), beat(), report_done() and
// nodes_done() throw them (the caller then lose()s the store).
// Thread safety: none; the launcher's own thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "common/auth.h"
#include "launch/node_link.h"
#include "launch/options.h"

namespace switchboard::launch {

class NodeGroup {
 public:
  using Clock = std::chrono::steady_clock;
  using TimePoint = Clock::time_point;

  // `options` must outlive the group. Nothing is connected until join().
  NodeGroup(const LaunchOptions& options, std::shared_ptr<const Secret> secret)
      : options_(options), secret_(std::move(secret)) {}

  // Connects to the job's store at options.master_addr and `port`
  // (retrying until --join-timeout), announces this node and waits until
  // every node has. `wait(d)` waits up to d for the launcher's signals and
  // returns false once the job is stopping. True when every node is there;
  // false when the job cannot start (said on stderr, with the job's first
  // failure where one is known) or wait() returned false.
  bool join(uint16_t port, const std::function<bool(std::chrono::milliseconds)>& wait);

  // Joined, and the store not lost since.
  bool linked() const { return link_ != nullptr; }
  NodeLink& link() { return *link_; }  // linked() only
  // The store cannot be reached any more: no more store traffic, and node 0
  // no longer waits for the others before stopping it.
  void lose();

  // Records `what` as the job's first failure unless one is (compare_set,
  // so one node's wins); first_failure() then is the one recorded. Without
  // the store, `what` is kept unless a failure is known already.
  void report_failure(const std::string& what);
  // A failure recorded in the store (by any node), kept as the first.
  std::optional<std::string> recorded_failure();
  // The job's first failure as far as this launcher knows, or "".
  const std::string& first_failure() const { return first_failure_; }

  // True once per --monitor-interval while linked (the supervisor then
  // looks at the store).
  bool due(TimePoint now);
  // When due() next is, for the launcher's poll(); none while not linked.
  std::optional<TimePoint> next_due(TimePoint now) const;

  // Once a second: this node's heartbeat, and with `watch` (node 0, the job
  // running) the others'. Returns what failed when a node that is not done
  // has not moved its counter for --node-timeout by this launcher's clock.
  std::optional<std::string> beat(TimePoint now, bool watch);

  // This node's job is over and its workers reaped: says so (once).
  void report_done();
  bool reported_done() const { return reported_done_; }
  // Node 0, after report_done(): whether the store may stop, every node
  // being done; after a failure (`failed`), every node that arrived, or
  // the stop timeout and 2 s more.
  bool nodes_done(TimePoint now, bool failed);
  // Node 0 must keep the store up: linked, and not every node is done.
  bool keeps_store() const { return link_ && !nodes_done_; }
  // The job's end waits for report_done(): linked and not said yet.
  bool owes_done() const { return link_ && !reported_done_; }

 private:
  const LaunchOptions& options_;
  const std::shared_ptr<const Secret> secret_;
  std::unique_ptr<NodeLink> link_;
  std::string first_failure_;
  std::optional<TimePoint> next_due_;
  std::optional<TimePoint> next_heartbeat_;
  // Node 0: each other node's heartbeat counter as last seen, and when (by
  // this launcher's steady clock) it was first seen at that value.
  std::map<int, std::pair<int64_t, TimePoint>> heartbeats_;
  bool reported_done_ = false;
  bool nodes_done_ = false;
  std::optional<TimePoint> grace_until_;  // node 0 after a failure
};

}  // namespace switchboard::launch
