#include "collective/gloo_p2p.h"

#include <fmt/format.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <deque>
#include <map>
#include <thread>
#include <vector>

#include "collective/gloo_signature.h"
#include "common/error.h"
#include "common/mutex.h"

namespace switchboard::collective {

std::exception_ptr group_destroyed(const std::string& where) {
  return std::make_exception_ptr(
      Error(ErrorCode::kCancelled,
            fmt::format("{}: the group was destroyed before the op finished", where)));
}

struct GlooPointToPoint::State {
  State(Naming n, std::shared_ptr<gloo::rendezvous::Context> c,
        std::chrono::milliseconds timeout, Translate t)
      : group(std::move(n)),
        context(std::move(c)),
        op_timeout(timeout),
        translate(std::move(t)) {}

  const Naming group;
  std::shared_ptr<gloo::rendezvous::Context> context;
  const std::chrono::milliseconds op_timeout;
  const Translate translate;

  // A posted send or recv waiting for a waiter thread.
  struct Posted {
    Work work{Work::Info{}};
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
    Tensor tensor;  // keeps the bytes alive while Gloo may touch them
    bool is_send = false;
    bool any_source = false;  // recv_any(): the Work learns the sender
    int peer = -1;            // the rank sent to or received from; -1 any
    std::string what;  // "float32[5] (20 bytes) from rank 1 with tag 3", for errors
  };

  Mutex mu;
  CondVar cv;
  std::deque<Posted> queue SB_GUARDED_BY(mu);
  bool stopping SB_GUARDED_BY(mu) = false;
  int idle_waiters SB_GUARDED_BY(mu) = 0;
  // Buffers a waiter is blocked on (and whether each is a send), so that
  // stop() can abort those waits.
  std::map<gloo::transport::UnboundBuffer*, bool> in_flight SB_GUARDED_BY(mu);
  // Added by post() until `stopping`; stop() takes them and joins them.
  std::vector<std::thread> waiters SB_GUARDED_BY(mu);
};

GlooPointToPoint::GlooPointToPoint(Naming naming,
                                   std::shared_ptr<gloo::rendezvous::Context> context,
                                   std::chrono::milliseconds op_timeout,
                                   Translate translate)
    : state_(std::make_unique<State>(std::move(naming), std::move(context), op_timeout,
                                     std::move(translate))) {}

GlooPointToPoint::~GlooPointToPoint() { stop(); }

void GlooPointToPoint::stop() {
  State& s = *state_;
  std::deque<State::Posted> posted;
  std::vector<std::thread> threads;
  {
    MutexLock lock(s.mu);
    s.stopping = true;
    posted.swap(s.queue);
    // No waiter is added once `stopping` is set (post() checks it).
    threads.swap(s.waiters);
    for (auto [buffer, is_send] : s.in_flight) {
      if (is_send) {
        buffer->abortWaitSend();
      } else {
        buffer->abortWaitRecv();
      }
    }
  }
  s.cv.notify_all();
  for (auto& p : posted) p.work.fail(group_destroyed(s.group.where(p.work.info().op)));
  for (auto& waiter : threads) waiter.join();
}

// Posts a send or recv now; a waiter thread finishes its Work. Gloo
// closes every connection of the context when a wait on an unbound buffer
// times out, so only the op timeout is ever given to Gloo: Work::wait with
// a shorter timeout waits on the Work, not on Gloo. Each posted op gets a
// waiter of its own (idle waiters are reused, new ones started when none
// is idle), so a send that completes late never holds up another.
// `peer` -1 (a recv only): from any other rank.
Work GlooPointToPoint::post(const std::string& op, const Tensor& tensor, int peer,
                            int tag, bool is_send) {
  State& s = *state_;
  const bool any_source = peer < 0;
  const std::string what = fmt::format(
      "{} {} ({} bytes) {} with tag {}: a send and a recv match only when their tag, "
      "dtype and byte count agree",
      is_send ? "a send of" : "a recv into", tensor.describe(), tensor.nbytes(),
      is_send      ? fmt::format("to rank {}", peer)
      : any_source ? std::string("from any rank")
                   : fmt::format("from rank {}", peer),
      tag);
  Work::Info info = s.group.work_info(op);
  info.detail = what;
  Work work(std::move(info));
  if (tensor.nbytes() == 0 && !any_source) {
    work.complete();
    return work;
  }
  auto buffer = s.context->createUnboundBuffer(tensor.data(), tensor.nbytes());
  const uint64_t slot = p2p_slot(tag, tensor);
  try {
    if (is_send) {
      buffer->send(peer, slot);
    } else if (any_source) {
      std::vector<int> sources;
      for (int r = 0; r < s.group.size; ++r) {
        if (r != s.group.rank) sources.push_back(r);
      }
      buffer->recv(sources, slot);
    } else {
      buffer->recv(peer, slot);
    }
  } catch (...) {
    std::rethrow_exception(s.translate(op, std::current_exception(), peer));
  }
  {
    MutexLock lock(s.mu);
    if (s.stopping) std::rethrow_exception(group_destroyed(s.group.where(op)));
    s.queue.push_back(
        State::Posted{work, std::move(buffer), tensor, is_send, any_source, peer, what});
    if (s.idle_waiters == 0) {
      s.waiters.emplace_back([this] { run_waiter(); });
    } else {
      --s.idle_waiters;
    }
  }
  s.cv.notify_one();
  return work;
}

void GlooPointToPoint::run_waiter() {
  State& s = *state_;
  for (;;) {
    State::Posted p2p;
    {
      MutexLock lock(s.mu);
      s.cv.wait(s.mu, [&]() SB_REQUIRES(s.mu) { return s.stopping || !s.queue.empty(); });
      if (s.queue.empty()) return;
      p2p = std::move(s.queue.front());
      s.queue.pop_front();
      s.in_flight.emplace(p2p.buffer.get(), p2p.is_send);
    }
    try {
      int source = -1;
      const bool finished = p2p.is_send ? p2p.buffer->waitSend(s.op_timeout)
                                        : p2p.buffer->waitRecv(&source, s.op_timeout);
      if (finished && p2p.any_source) {
        p2p.work.complete_from(source);
      } else if (finished) {
        p2p.work.complete();
      } else {
        p2p.work.fail(group_destroyed(s.group.where(p2p.work.info().op)));
      }
    } catch (...) {
      std::exception_ptr error =
          s.translate(p2p.work.info().op, std::current_exception(), p2p.peer);
      try {
        std::rethrow_exception(error);
      } catch (const TimeoutError& e) {
        // A send and a recv whose sizes or dtypes differ never meet (their
        // slots differ), rather than ending the process in Gloo: say so.
        error = std::make_exception_ptr(
            TimeoutError(fmt::format("{} ({})", e.what(), p2p.what)));
      } catch (...) {
      }
      p2p.work.fail(error);
    }
    MutexLock lock(s.mu);
    s.in_flight.erase(p2p.buffer.get());
    p2p = State::Posted{};  // drop the buffer and tensor before idling
    ++s.idle_waiters;
  }
}

}  // namespace switchboard::collective
