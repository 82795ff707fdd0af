#include "agents/process_group/listener.h"

#include <fmt/format.h>

#include <utility>

#include "agents/process_group/frame.h"

namespace switchboard::agents::process_group {

PeerListener::PeerListener(int peer, ProcessGroupLink& link, PeerEvents& events,
                           std::shared_ptr<rpc::PeerMetrics> metrics)
    : peer_(peer), link_(link), events_(events), metrics_(std::move(metrics)) {}

void PeerListener::start(std::shared_ptr<const void> owner) {
  thread_.start(fmt::format("sb-pg-recv-{}", peer_), std::move(owner), [this] { run(); });
}

void PeerListener::join() { thread_.join(); }

void PeerListener::run() {
  for (;;) {
    rpc::Message m;
    size_t bytes = 0;
    try {
      m = link_.receive(peer_, &bytes);
    } catch (const ProtocolError& e) {
      events_.on_peer_failed(peer_, fmt::format("protocol error: {}", e.what()));
      return;
    } catch (...) {
      events_.on_peer_failed(peer_, what_of(std::current_exception()));
      return;
    }
    if (metrics_) metrics_->received(bytes);
    events_.on_message(peer_, std::move(m));
  }
}

}  // namespace switchboard::agents::process_group
