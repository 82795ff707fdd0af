// ProcessGroupLink: the PROCESS_GROUP agent's Gloo group, shared by every
// peer's sender (agents/process_group/sender.h) and listener
// (agents/process_group/listener.h): one message to or from one peer as
// Gloo sends and recvs of its parts (the wire format in
// agents/process_group/agent.h). Also PeerEvents, what a sender or a
// listener reports to its agent, and PeerThread, the thread each runs on.
// Internal to //agents/process_group.
//
// Thread safety: send() and receive() may run on many threads at once
// (each peer's sender and listener); close() from any thread: it destroys
// the group, which aborts every send and recv posted, and makes later
// ones fail with Error(kCancelled). Posting takes mu_ shared, close() takes
// it exclusively; waiting on a posted op takes nothing.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/tensor.h"
#include "common/mutex.h"
#include "core/message.h"

namespace switchboard::collective {
class GlooProcessGroup;
}

namespace switchboard::agents::process_group {

// What a peer's sender and listener report, on their own threads.
class PeerEvents {
 public:
  virtual ~PeerEvents() = default;
  // A whole message from `peer` (a request or a response).
  virtual void on_message(int peer, rpc::Message m) = 0;
  // The link to `peer` is unusable (`reason`: Gloo's error, a protocol
  // error, or the agent shutting down).
  virtual void on_peer_failed(int peer, const std::string& reason) = 0;
};

class ProcessGroupLink {
 public:
  // Shares `group` (null for a group of one, which has no peers);
  // `agent_name` names the agent in errors.
  ProcessGroupLink(std::string agent_name, std::unique_ptr<collective::GlooProcessGroup> group);
  ~ProcessGroupLink();
  ProcessGroupLink(const ProcessGroupLink&) = delete;
  ProcessGroupLink& operator=(const ProcessGroupLink&) = delete;

  // Sends every part of `m` to `peer`; returns when all went out, with the
  // bytes sent (header, body, tensors). Throws Error(kCancelled) once
  // closed, what Gloo throws otherwise.
  size_t send(int peer, const rpc::Message& m) SB_EXCLUDES(mu_);
  // Receives one whole message from `peer`; `bytes` (when not null) gets
  // the bytes received for it. Throws ProtocolError (common/error.h) for
  // bad bytes, else as send().
  rpc::Message receive(int peer, size_t* bytes = nullptr) SB_EXCLUDES(mu_);
  // Destroys the group (see above). Idempotent.
  void close() SB_EXCLUDES(mu_);

 private:
  // Sends (or receives into) every non-empty tensor of `parts`, in order,
  // on `tag`, and waits for all. GlooProcessGroup gives every posted op a
  // thread of its own, so at most kMaxPosted are posted at a time.
  void exchange(int peer, bool sending, const std::vector<Tensor>& parts, int tag)
      SB_EXCLUDES(mu_);

  const std::string agent_name_;
  SharedMutex mu_;
  std::unique_ptr<collective::GlooProcessGroup> group_ SB_GUARDED_BY(mu_);
  bool closed_ SB_GUARDED_BY(mu_) = false;
};

// What `error` says (its what(), or "unknown exception").
std::string what_of(const std::exception_ptr& error);

// The thread of a sender or a listener. It holds its owner (the agent)
// alive while it runs; join() or the destructor waits for it, except on
// the thread itself, which the destructor lets go (it is then past its
// last use of its owner: the owner died with its last reference, there).
class PeerThread {
 public:
  PeerThread() = default;
  ~PeerThread();
  PeerThread(const PeerThread&) = delete;
  PeerThread& operator=(const PeerThread&) = delete;

  // Runs `body` on a new thread named `name` (15 characters kept), which
  // holds `owner` until `body` returned.
  void start(const std::string& name, std::shared_ptr<const void> owner,
             std::function<void()> body);
  // Waits for the thread, unless called on it.
  void join();

 private:
  std::thread thread_;
};

}  // namespace switchboard::agents::process_group
