#include "agents/process_group_listener.h"

#include <fmt/format.h>

#include <utility>

#include "agents/process_group_frame.h"

namespace switchboard::agents {

PeerListener::PeerListener(int peer, ProcessGroupLink& link, PeerEvents& events)
    : peer_(peer), link_(link), events_(events) {}

void PeerListener::start(std::shared_ptr<const void> owner) {
  thread_.start(fmt::format("sb-pg-recv-{}", peer_), std::move(owner), [this] { run(); });
}

void PeerListener::join() { thread_.join(); }

void PeerListener::run() {
  for (;;) {
    rpc::Message m;
    try {
      m = link_.receive(peer_);
    } catch (const ProtocolError& e) {
      events_.on_peer_failed(peer_, fmt::format("protocol error: {}", e.what()));
      return;
    } catch (...) {
      events_.on_peer_failed(peer_, what_of(std::current_exception()));
      return;
    }
    events_.on_message(peer_, std::move(m));
  }
}

}  // namespace switchboard::agents
