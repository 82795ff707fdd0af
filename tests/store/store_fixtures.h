// One fixture per Store implementation, for the conformance suite.
// Each fixture owns whatever backs its stores (a temp file, a server) and
// hands out handles: `open()` returns a new handle to the same store, as a
// second process or thread would see it.
#pragma once

#include <memory>

#include "store/hash_store.h"
#include "tests/store/file_store_fixture.h"
#include "store/prefix_store.h"
#include "store/store.h"
#include "store/tcp_store.h"
#include "store/tcp_store_server.h"

namespace sbtest {

struct HashStoreFixture {
  static constexpr const char* kName = "HashStore";
  std::shared_ptr<switchboard::HashStore> store =
      std::make_shared<switchboard::HashStore>();
  std::shared_ptr<switchboard::Store> open() { return store; }
};

struct PrefixStoreFixture {
  static constexpr const char* kName = "PrefixStore";
  std::shared_ptr<switchboard::HashStore> inner =
      std::make_shared<switchboard::HashStore>();
  std::shared_ptr<switchboard::Store> open() {
    return std::make_shared<switchboard::PrefixStore>("group0", inner);
  }
};

// A TcpStoreServer on an ephemeral loopback port; each handle is its own
// client connection.
struct TcpStoreFixture {
  static constexpr const char* kName = "TcpStore";
  switchboard::TcpStoreServer server;
  std::shared_ptr<switchboard::Store> open() {
    return std::make_shared<switchboard::TcpStore>("127.0.0.1", server.port());
  }
};

// A PrefixStore over a TcpStore: what a process group's rendezvous uses.
struct PrefixTcpStoreFixture {
  static constexpr const char* kName = "PrefixStore(TcpStore)";
  switchboard::TcpStoreServer server;
  std::shared_ptr<switchboard::Store> open() {
    return std::make_shared<switchboard::PrefixStore>(
        "pg", std::make_shared<switchboard::TcpStore>("127.0.0.1", server.port()));
  }
};

}  // namespace sbtest
