// PeerSender: the PROCESS_GROUP agent's sends to one peer. A thread of its
// own drains an outbox, one message at a time, through the
// ProcessGroupLink. Also the peer's failure: once the link to the peer
// failed, the outbox is dropped and nothing more is queued. Internal to
// //agents.
//
// Thread safety: enqueue(), fail() and stop() from any thread; start()
// once, then join() or the destructor on the owner's thread. mu_ guards
// the outbox and the failure; it is not held while sending.
// Ownership: the link and the events are the agent's; the sender's thread
// keeps the agent alive through start()'s `owner`.
// Metrics: each message the link sent counts into the peer's
// rpc::PeerMetrics (relaxed atomic adds, no lock).
#pragma once

#include <deque>
#include <memory>
#include <string>

#include "agents/process_group/link.h"
#include "common/mutex.h"
#include "core/message.h"
#include "rpc/metrics.h"

namespace switchboard::agents::process_group {

class PeerSender {
 public:
  // Sends to `peer` over `link`; reports a failed send to `events`;
  // counts what went out into `metrics` (may be null).
  PeerSender(int peer, ProcessGroupLink& link, PeerEvents& events,
             std::shared_ptr<rpc::PeerMetrics> metrics = nullptr);
  PeerSender(const PeerSender&) = delete;
  PeerSender& operator=(const PeerSender&) = delete;

  // Starts the thread, which holds `owner` until it returns.
  void start(std::shared_ptr<const void> owner);

  enum class Queued { kQueued, kStopped, kFailed };
  // Queues `m` (moved from only then). kStopped after stop(); kFailed
  // once the peer failed, with the failure in `failure`.
  Queued enqueue(rpc::Message&& m, std::string* failure) SB_EXCLUDES(mu_);
  // Records that the peer failed with `reason` and drops the outbox; false
  // when it had failed already or the sender was stopped.
  bool fail(const std::string& reason) SB_EXCLUDES(mu_);
  // Drops the outbox and lets the thread return (a send in progress ends
  // when the link closes).
  void stop() SB_EXCLUDES(mu_);
  // Waits for the thread, unless called on it.
  void join();

 private:
  void run() SB_EXCLUDES(mu_);

  const int peer_;
  ProcessGroupLink& link_;
  PeerEvents& events_;
  const std::shared_ptr<rpc::PeerMetrics> metrics_;

  Mutex mu_;
  CondVar wake_;  // a message queued, failed or stopped
  std::deque<rpc::Message> outbox_ SB_GUARDED_BY(mu_);
  bool failed_ SB_GUARDED_BY(mu_) = false;  // gone or sent bad bytes
  std::string failure_ SB_GUARDED_BY(mu_);
  bool stopped_ SB_GUARDED_BY(mu_) = false;
  PeerThread thread_;  // last: joined before the rest goes
};

}  // namespace switchboard::agents::process_group
