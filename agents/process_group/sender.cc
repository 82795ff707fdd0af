#include "agents/process_group/sender.h"

#include <fmt/format.h>

#include <exception>
#include <utility>

namespace switchboard::agents::process_group {

PeerSender::PeerSender(int peer, ProcessGroupLink& link, PeerEvents& events,
                       std::shared_ptr<rpc::PeerMetrics> metrics)
    : peer_(peer), link_(link), events_(events), metrics_(std::move(metrics)) {}

void PeerSender::start(std::shared_ptr<const void> owner) {
  thread_.start(fmt::format("sb-pg-send-{}", peer_), std::move(owner), [this] { run(); });
}

PeerSender::Queued PeerSender::enqueue(rpc::Message&& m, std::string* failure) {
  MutexLock lock(mu_);
  if (failed_) {
    *failure = failure_;
    return Queued::kFailed;
  }
  if (stopped_) return Queued::kStopped;
  outbox_.push_back(std::move(m));
  wake_.notify_one();
  return Queued::kQueued;
}

bool PeerSender::fail(const std::string& reason) {
  MutexLock lock(mu_);
  if (failed_ || stopped_) return false;
  failed_ = true;
  failure_ = reason;
  outbox_.clear();
  wake_.notify_all();
  return true;
}

void PeerSender::stop() {
  MutexLock lock(mu_);
  stopped_ = true;
  outbox_.clear();
  wake_.notify_all();
}

void PeerSender::join() { thread_.join(); }

void PeerSender::run() {
  for (;;) {
    rpc::Message m;
    {
      MutexLock lock(mu_);
      wake_.wait(mu_, [&]() SB_REQUIRES(mu_) { return stopped_ || failed_ || !outbox_.empty(); });
      if (stopped_ || failed_) return;
      m = std::move(outbox_.front());
      outbox_.pop_front();
    }
    try {
      const size_t bytes = link_.send(peer_, m);
      if (metrics_) metrics_->sent(bytes);
    } catch (...) {
      events_.on_peer_failed(peer_, what_of(std::current_exception()));
      return;
    }
  }
}

}  // namespace switchboard::agents::process_group
