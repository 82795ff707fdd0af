#include "agents/pipe/transport/registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "agents/pipe/transport/tcp/tcp_transport.h"
#include "agents/pipe/transport/tls/tls_transport.h"

namespace switchboard::agents::pipe::transport {

void TransportRegistry::add(TransportEntry entry) {
  for (const TransportEntry& e : entries_) {
    if (e.name == entry.name) {
      throw std::invalid_argument(
          fmt::format("PIPE transport \"{}\" is registered already", entry.name));
    }
  }
  const bool stream = entry.kind == TransportEntry::Kind::kStream;
  if (entry.name.empty() || !entry.unavailable || (stream && !entry.make) ||
      (!stream && (entry.upgrades.empty() || !entry.turn_off))) {
    throw std::invalid_argument(fmt::format(
        "PIPE transport \"{}\": an entry needs a name, unavailable(), and make() (a "
        "stream "
        "transport), or the transports it upgrades and turn_off() (an upgrade)",
        entry.name));
  }
  entries_.push_back(std::move(entry));
  std::stable_sort(entries_.begin(), entries_.end(),
                   [](const TransportEntry& a, const TransportEntry& b) {
                     return a.priority > b.priority;
                   });
}

TransportRegistry::Choice TransportRegistry::choose(TransportOptions options) const {
  Choice choice;
  std::vector<std::string> why_not;
  for (const TransportEntry& e : entries_) {
    if (e.kind != TransportEntry::Kind::kStream) continue;
    if (std::string why = e.unavailable(options); !why.empty()) {
      why_not.push_back(fmt::format("{}: {}", e.name, why));
      continue;
    }
    choice.stream = &e;
    break;
  }
  if (choice.stream == nullptr) {
    throw std::invalid_argument(
        fmt::format("PIPE agent \"{}\": no transport can serve this worker ({})",
                    options.agent_name, fmt::join(why_not, "; ")));
  }
  for (const TransportEntry& e : entries_) {
    if (e.kind != TransportEntry::Kind::kUpgrade) continue;
    const bool upgrades_stream = std::find(e.upgrades.begin(), e.upgrades.end(),
                                           choice.stream->name) != e.upgrades.end();
    if (upgrades_stream && e.unavailable(options).empty()) choice.upgrades.push_back(&e);
  }
  choice.options = std::move(options);
  for (const TransportEntry& e : entries_) {
    if (e.kind == TransportEntry::Kind::kUpgrade &&
        std::find(choice.upgrades.begin(), choice.upgrades.end(), &e) ==
            choice.upgrades.end()) {
      e.turn_off(choice.options);
    }
  }
  return choice;
}

std::unique_ptr<PipeTransport> TransportRegistry::make(ConnectionEvents& events,
                                                       TransportOptions options) const {
  Choice choice = choose(std::move(options));
  return choice.stream->make(events, std::move(choice.options));
}

const TransportRegistry& builtin_transports() {
  static const TransportRegistry registry = [] {
    TransportRegistry r;
    r.add({.name = "tls",
           .priority = 200,
           .kind = TransportEntry::Kind::kStream,
           .unavailable = [](const TransportOptions& o) -> std::string {
             return o.tls.enabled() ? "" : "no certificates";
           },
           .make = make_tls_transport,
           .upgrades = {},
           .turn_off = nullptr});
    r.add({.name = "tcp",
           .priority = 100,
           .kind = TransportEntry::Kind::kStream,
           .unavailable = [](const TransportOptions&) { return std::string(); },
           .make = make_tcp_transport,
           .upgrades = {},
           .turn_off = nullptr});
    r.add({.name = "shm",
           .priority = 300,
           .kind = TransportEntry::Kind::kUpgrade,
           .unavailable = [](const TransportOptions& o) -> std::string {
             return o.lane_capacity > 0 ? "" : "off";
           },
           .make = nullptr,
           .upgrades = {"tcp"},
           .turn_off = [](TransportOptions& o) { o.lane_capacity = 0; }});
    return r;
  }();
  return registry;
}

}  // namespace switchboard::agents::pipe::transport
