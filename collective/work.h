// Work: the handle every ProcessGroup operation returns.
//
// An operation is queued when the ProcessGroup method returns; wait() blocks
// until it finished and rethrows its error. Works of one group complete in
// the order they were issued (ops run in issue order on the group's own
// thread, as in c10d).
//
// Timeouts: wait() waits at most the group's timeout, wait(timeout) at most
// `timeout` (Work::kNoTimeout: forever). When the wait expires first it
// throws TimeoutError naming the op, the group, the rank and the timeout.
// The operation itself is bounded by the group's timeout too (the backend
// fails it with the same kind of error), so nothing waits forever; after a
// timed-out collective the group's peers are out of step, and the group
// should be destroyed and created again (as with c10d's Gloo and NCCL).
//
// Thread safety: a Work is a shared handle; any number of threads may wait
// on copies of it. Destroying a Work does not cancel the operation.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace switchboard::collective {

class Work {
 public:
  using Timeout = std::chrono::milliseconds;
  static constexpr Timeout kNoTimeout{0};

  // Describes the op for errors: e.g. op "allreduce", group "default",
  // rank 1, with the group's default timeout.
  struct Info {
    std::string op;
    std::string group;
    int rank = 0;
    Timeout default_timeout{0};
    int size = 0;  // group size; 0 when unknown
    // Said after a timeout (e.g. what a send or recv expected to match).
    std::string detail;
  };

  // A pending Work; the backend completes it through complete()/fail().
  explicit Work(Info info);
  // A Work finished by driving it from wait(): `drive(timeout)` blocks at
  // most `timeout` (kNoTimeout: forever) for the op, returns true when it
  // finished and false when the timeout passed first, and throws the op's
  // error. One waiter drives at a time; the others wait for it. Used for
  // ops posted without the group's queue (send/recv, NCCL kernels).
  using Driver = std::function<bool(Timeout)>;
  Work(Info info, Driver drive);
  // An already finished Work (for ops that need no communication).
  static Work done(Info info);

  // Blocks until the op finished (or the timeout passed) and rethrows its
  // error, if any.
  void wait() const;
  void wait(Timeout timeout) const;
  bool is_completed() const;
  // The error the op failed with, or nullptr (also while still running).
  std::exception_ptr exception() const;
  const Info& info() const;

  // The rank a recv_any() received from, once it completed; -1 otherwise
  // (torch's recv(src=None) returns it).
  int source_rank() const;

  // Backend side: mark finished. Only the first call has an effect.
  void complete() const;
  // A receive from any source finished, from `source`.
  void complete_from(int source) const;
  void fail(std::exception_ptr error) const;

 private:
  struct State {
    Info info;
    mutable std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr error;
    int source = -1;
    Driver drive;               // empty for queue-completed Works
    std::timed_mutex drive_mu;  // serializes drivers
  };
  void finish(std::exception_ptr error) const;
  std::shared_ptr<State> state_;
};

}  // namespace switchboard::collective
