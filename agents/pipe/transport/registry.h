// The transport registry: PIPE's transports by name, each with a priority,
// in TensorPipe's manner. A worker's transport is the available stream
// transport of highest priority; an upgrade transport then carries a
// connection's frames, peer by peer, once both ends agree in the hello.
//
// The built-ins (builtin_transports()):
//   tls  stream,  priority 200: mutual TLS over TCP; available when the
//        worker has certificates (options.tls), and then always chosen.
//   tcp  stream,  priority 100: plain TCP; always available.
//   shm  upgrade, priority 300, of tcp: the same-host lane; available when
//        the worker offers a ring (options.lane_capacity), used with each
//        peer on the same host that accepts it (shm/shm_lane.h).
// Adding a transport is a folder under agents/pipe/transport/ and one
// entry in builtin_transports() (registry.cc); the conformance suite
// (tests/agents/pipe/transport/conformance_test.cc) runs over every entry.
//
// Errors: add() throws std::invalid_argument for a duplicate name or an
// entry that cannot be used; choose() throws std::invalid_argument when no
// stream transport is available, naming why each is not.
// Thread safety: a registry is built once, then only read (any thread).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "agents/pipe/transport/connection.h"
#include "agents/pipe/transport/options.h"
#include "agents/pipe/transport/transport.h"

namespace switchboard::agents::pipe::transport {

struct TransportEntry {
  enum class Kind {
    kStream,   // listens and connects (make)
    kUpgrade,  // carries the frames of a stream transport's connections
  };
  std::string name;
  int priority = 0;
  Kind kind = Kind::kStream;
  // "" when this transport can serve a worker made with `options`; else
  // why not ("no certificates", "off").
  std::function<std::string(const TransportOptions& options)> unavailable;
  // kStream: the transport.
  std::function<std::unique_ptr<PipeTransport>(ConnectionEvents& events,
                                               TransportOptions options)>
      make;
  // kUpgrade: the stream transports it upgrades, and what turns it off in
  // the options of a worker that will not use it.
  std::vector<std::string> upgrades;
  std::function<void(TransportOptions& options)> turn_off;
};

class TransportRegistry {
 public:
  void add(TransportEntry entry);
  // Every entry, the highest priority first.
  const std::vector<TransportEntry>& entries() const { return entries_; }

  struct Choice {
    const TransportEntry* stream = nullptr;
    std::vector<const TransportEntry*> upgrades;  // the highest priority first
    // `options` as the chosen transports take them: every upgrade not
    // chosen turned off (lane_capacity 0 unless shm upgrades the stream
    // transport).
    TransportOptions options;
  };
  Choice choose(TransportOptions options) const;
  // The chosen stream transport, made with the chosen options.
  std::unique_ptr<PipeTransport> make(ConnectionEvents& events,
                                      TransportOptions options) const;

 private:
  std::vector<TransportEntry> entries_;  // the highest priority first
};

// tls, tcp and shm (see above).
const TransportRegistry& builtin_transports();

}  // namespace switchboard::agents::pipe::transport
