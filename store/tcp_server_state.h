// ServerState: the key-value map, parked WAITs and watches behind
// TcpStoreServer, with no sockets. It applies one parsed request at a time
// and writes the reply bytes (and the STOP_WAITING bytes and watch events
// other clients are owed) into each client's Peer. The server feeds it from
// its connections; the fuzzer (tests/store/fuzz) feeds it directly.
//
// Semantics are PyTorch 1.13's TCPStore server's (see
// docs/wire_formats.md, "Semantics") plus APPEND, MULTI_GET, MULTI_SET and
// CANCEL_WAIT. Differences from torch, all invisible to its clients: a
// creating COMPARE_SET wakes waiters; each WAIT is tracked on its own (torch
// keeps one counter per connection); a connection that watches a key twice
// gets one event per change.
//
// Thread safety: none. The server calls every method on its loop thread.
//
// Invariants: every parked wait belongs to a registered client and is listed
// under each of its keys that has not been created since it was parked; a
// client's watches are listed under their keys. remove_client() erases both,
// so the state never holds a Peer* past its client's removal.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "store/store.h"
#include "store/tcp_protocol.h"

namespace switchboard::tcpstore {

using ClientId = uint64_t;

// Where ServerState writes the messages one client is owed.
class Peer {
 public:
  virtual ~Peer() = default;
  // The buffer to append complete messages to. ServerState appends whole
  // messages only, so bytes of two messages never interleave.
  virtual Bytes& output() = 0;
  // Called after messages were appended outside the reply to the client's
  // own request (a woken WAIT, a watch event): the connection should send
  // them soon.
  virtual void flush() = 0;
};

class ServerState {
 public:
  ServerState() = default;
  ServerState(const ServerState&) = delete;
  ServerState& operator=(const ServerState&) = delete;

  // Registers a client. `peer` is not owned and must stay valid until
  // remove_client(id). `id` must not be registered already.
  void add_client(ClientId id, Peer* peer);

  // Forgets a client's parked WAITs and watches. Sends nothing. Unknown ids
  // are ignored.
  void remove_client(ClientId id);

  // Applies `request` (its keys and values may be moved from) on behalf of
  // registered client `id`, appending its reply, if it has one, to that
  // client's Peer. Returns false with *error set when the request is one the
  // protocol answers by closing the connection (GET or MULTI_GET of a
  // missing key, ADD on a non-integer); the state is then unchanged.
  bool apply(ClientId id, Request& request, std::string* error);

  size_t num_keys() const { return data_.size(); }
  // For tests and the fuzzer's invariant checks.
  size_t num_clients() const { return clients_.size(); }
  size_t num_parked_waits() const { return waits_.size(); }
  size_t num_watched_keys() const { return watchers_.size(); }
  size_t num_waited_keys() const { return waiters_.size(); }

 private:
  struct Client {
    Peer* peer = nullptr;
    std::vector<uint64_t> waits;            // ids of parked WAITs
    std::vector<std::string> watched_keys;  // distinct
  };
  struct Wait {
    ClientId client = 0;
    std::vector<std::string> keys;  // the distinct keys missing when parked
    size_t remaining = 0;           // of those, not created since
  };

  void set(ClientId id, std::string& key, Bytes&& value);
  bool get(ClientId id, const std::string& key, std::string* error);
  bool add(ClientId id, std::string& key, int64_t delta, std::string* error);
  void compare_set(ClientId id, std::string& key, const Bytes& expected,
                   Bytes&& desired);
  void check(ClientId id, const std::vector<std::string>& keys);
  void wait(ClientId id, const std::vector<std::string>& keys);
  void watch(ClientId id, std::string& key);
  void delete_key(ClientId id, const std::string& key);
  void append(ClientId id, std::string& key, const Bytes& value);
  bool multi_get(ClientId id, const std::vector<std::string>& keys,
                 std::string* error);
  void cancel_waits(Client& client);

  // After `key` was written: releases the WAITs this completes and sends
  // `type` (KEY_CREATED or KEY_UPDATED) to its watchers.
  void written(const std::string& key, bool created, const Bytes& old_value,
               const Bytes& new_value);
  void wake_waiters(const std::string& key);
  void notify_watchers(const std::string& key, WatchResponse type,
                       const Bytes& old_value, const Bytes& new_value);
  bool has_watchers(const std::string& key) const;
  Bytes& output(ClientId id);

  std::unordered_map<std::string, Bytes> data_;
  std::unordered_map<ClientId, Client> clients_;
  std::unordered_map<uint64_t, Wait> waits_;
  // key -> ids of the parked WAITs still counting on its creation.
  std::unordered_map<std::string, std::vector<uint64_t>> waiters_;
  // key -> clients watching it.
  std::unordered_map<std::string, std::vector<ClientId>> watchers_;
  uint64_t next_wait_id_ = 1;
  Bytes event_;  // scratch for one watch event, reused
};

// `text` made safe for a one-line log: printable ASCII kept, other bytes as
// \xNN, cut after `limit` bytes with "...".
std::string printable(std::string_view text, size_t limit = 64);

}  // namespace switchboard::tcpstore
