#include "agents/process_group_sender.h"

#include <fmt/format.h>

#include <exception>
#include <utility>

namespace switchboard::agents {

PeerSender::PeerSender(int peer, ProcessGroupLink& link, PeerEvents& events)
    : peer_(peer), link_(link), events_(events) {}

PeerSender::~PeerSender() { join_or_release(thread_); }

void PeerSender::start(std::shared_ptr<const void> owner) {
  thread_ = std::thread([this, owner = std::move(owner)] { run(); });
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

void PeerSender::join() {
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void PeerSender::run() {
  name_thread(fmt::format("sb-pg-send-{}", peer_));
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
      link_.send(peer_, m);
    } catch (...) {
      events_.on_peer_failed(peer_, what_of(std::current_exception()));
      return;
    }
  }
}

}  // namespace switchboard::agents
