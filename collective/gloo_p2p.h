// GlooPointToPoint: a Gloo group's sends and recvs. Each is posted to Gloo
// at once (so a rank may post a send before its recv without deadlock) and
// finished by a waiter thread, which completes or fails its Work. A send
// and a recv meet only when their tag, dtype and byte count agree
// (p2p_slot, gloo_signature.h); otherwise both time out, saying so.
// Internal to //collective:gloo.
//
// Thread safety: post() from any thread; stop() once, from the group's
// destructor. The waiter threads are this object's.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "collective/process_group.h"
#include "core/tensor.h"

namespace gloo::rendezvous {
class Context;
}

namespace switchboard::collective {

// The error of an op the group's destruction ended: Error(kCancelled),
// "<where>: the group was destroyed before the op finished".
std::exception_ptr group_destroyed(const std::string& where);

class GlooPointToPoint {
 public:
  // What Gloo threw in `op`, as the group words it (`peer`: the rank the
  // op talks to, -1 for any).
  using Translate = std::function<std::exception_ptr(const std::string& op,
                                                     std::exception_ptr error, int peer)>;

  // How the group names an op: for errors ("send in group ..."), and for
  // its Works.
  struct Naming {
    int rank = 0;
    int size = 0;
    std::function<std::string(std::string_view op)> where;
    std::function<Work::Info(std::string_view op)> work_info;
  };

  GlooPointToPoint(Naming naming, std::shared_ptr<gloo::rendezvous::Context> context,
                   std::chrono::milliseconds op_timeout, Translate translate);
  // stop(), when it has not run.
  ~GlooPointToPoint();
  GlooPointToPoint(const GlooPointToPoint&) = delete;
  GlooPointToPoint& operator=(const GlooPointToPoint&) = delete;

  // Posts a send to `peer` (is_send) or a recv from `peer` (-1: from any
  // other rank) of `tensor`'s bytes under `tag`. Throws what Gloo threw
  // when posting, translated; Error(kCancelled) once stopped.
  Work post(const std::string& op, const Tensor& tensor, int peer, int tag, bool is_send);

  // Fails what no waiter took yet, aborts the waits that run (their Works
  // fail with group_destroyed()) and joins every waiter.
  void stop();

 private:
  struct State;
  void run_waiter();
  std::unique_ptr<State> state_;
};

}  // namespace switchboard::collective
