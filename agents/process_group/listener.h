// PeerListener: the PROCESS_GROUP agent's receives from one peer. A thread
// of its own receives one whole message after another through the
// ProcessGroupLink and hands each to the agent (PeerEvents::on_message);
// bad bytes or a failed receive end it with on_peer_failed(). Internal to
// //agents.
//
// Thread safety: start() once, then join() or the destructor, on the
// owner's thread; the events run on the listener's thread. No state is
// shared with other threads but the link's.
// Ownership: the link and the events are the agent's; the thread keeps
// the agent alive through start()'s `owner`.
// Metrics: each message received counts into the peer's rpc::PeerMetrics
// (relaxed atomic adds, no lock).
#pragma once

#include <memory>

#include "agents/process_group/link.h"
#include "rpc/metrics.h"

namespace switchboard::agents::process_group {

class PeerListener {
 public:
  // Receives from `peer` over `link`; reports to `events`; counts what
  // came in into `metrics` (may be null).
  PeerListener(int peer, ProcessGroupLink& link, PeerEvents& events,
               std::shared_ptr<rpc::PeerMetrics> metrics = nullptr);
  PeerListener(const PeerListener&) = delete;
  PeerListener& operator=(const PeerListener&) = delete;

  // Starts the thread, which holds `owner` until it returns. It returns
  // once the link to the peer failed or closed.
  void start(std::shared_ptr<const void> owner);
  // Waits for the thread, unless called on it.
  void join();

 private:
  void run();

  const int peer_;
  ProcessGroupLink& link_;
  PeerEvents& events_;
  const std::shared_ptr<rpc::PeerMetrics> metrics_;
  PeerThread thread_;  // last: joined before the rest goes
};

}  // namespace switchboard::agents::process_group
