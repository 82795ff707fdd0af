#include "store/tcp_server_state.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace switchboard::tcpstore {
namespace {

const Bytes kEmpty;

// The field counts parse_request guarantees for each type (see Request).
bool well_formed(const Request& request) {
  size_t keys = request.keys.size();
  size_t values = request.values.size();
  switch (request.type) {
    case QueryType::kSet:
    case QueryType::kAppend:
      return keys == 1 && values == 1;
    case QueryType::kCompareSet:
      return keys == 1 && values == 2;
    case QueryType::kGet:
    case QueryType::kAdd:
    case QueryType::kWatchKey:
    case QueryType::kDeleteKey:
      return keys == 1;
    case QueryType::kMultiSet:
      return keys == values;
    case QueryType::kCheck:
    case QueryType::kWait:
    case QueryType::kMultiGet:
    case QueryType::kGetNumKeys:
    case QueryType::kCancelWait:
    case QueryType::kValidate:
    case QueryType::kPing:
      return true;
  }
  return false;
}

template <typename T>
void erase_one(std::vector<T>& items, const T& item) {
  auto it = std::find(items.begin(), items.end(), item);
  if (it != items.end()) items.erase(it);
}

}  // namespace

void ServerState::add_client(ClientId id, Peer* peer) {
  clients_[id].peer = peer;
}

void ServerState::remove_client(ClientId id) {
  auto it = clients_.find(id);
  if (it == clients_.end()) return;
  Client& client = it->second;
  cancel_waits(client);
  for (const std::string& key : client.watched_keys) {
    auto watchers = watchers_.find(key);
    if (watchers == watchers_.end()) continue;
    erase_one(watchers->second, id);
    if (watchers->second.empty()) watchers_.erase(watchers);
  }
  clients_.erase(it);
}

bool ServerState::apply(ClientId id, Request& request, std::string* error) {
  if (!well_formed(request)) {
    *error = fmt::format("malformed {} request", query_type_name(
                                                    static_cast<uint8_t>(request.type)));
    return false;
  }
  auto& keys = request.keys;
  auto& values = request.values;
  switch (request.type) {
    case QueryType::kSet:
      set(id, keys[0], std::move(values[0]));
      return true;
    case QueryType::kCompareSet:
      compare_set(id, keys[0], values[0], std::move(values[1]));
      return true;
    case QueryType::kGet:
      return get(id, keys[0], error);
    case QueryType::kAdd:
      return add(id, keys[0], request.delta, error);
    case QueryType::kCheck:
      check(id, keys);
      return true;
    case QueryType::kWait:
      wait(id, keys);
      return true;
    case QueryType::kGetNumKeys:
      put_i64(output(id), static_cast<int64_t>(data_.size()));
      return true;
    case QueryType::kWatchKey:
      watch(id, keys[0]);
      return true;
    case QueryType::kDeleteKey:
      delete_key(id, keys[0]);
      return true;
    case QueryType::kAppend:
      append(id, keys[0], values[0]);
      return true;
    case QueryType::kMultiGet:
      return multi_get(id, keys, error);
    case QueryType::kMultiSet:
      for (size_t i = 0; i < keys.size(); ++i) set(id, keys[i], std::move(values[i]));
      return true;
    case QueryType::kCancelWait:
      cancel_waits(clients_.at(id));
      put_u8(output(id), static_cast<uint8_t>(WaitResponse::kWaitCanceled));
      return true;
    case QueryType::kValidate:
      return true;  // the connection's stream switched to PyTorch 2.x's numbering
    case QueryType::kPing:
      put_u32(output(id), request.nonce);
      return true;
  }
  *error = "unknown query type";
  return false;
}

void ServerState::set(ClientId id, std::string& key, Bytes&& value) {
  auto [it, created] = data_.try_emplace(std::move(key));
  Bytes old_value = std::exchange(it->second, std::move(value));
  written(it->first, created, old_value, it->second);
}

bool ServerState::get(ClientId id, const std::string& key, std::string* error) {
  auto it = data_.find(key);
  if (it == data_.end()) {
    *error = fmt::format("GET of missing key \"{}\"", printable(key));
    return false;
  }
  put_bytes(output(id), it->second);
  return true;
}

bool ServerState::add(ClientId id, std::string& key, int64_t delta,
                      std::string* error) {
  auto it = data_.find(key);
  int64_t current = 0;
  if (it != data_.end() && !parse_store_integer(it->second, &current)) {
    *error = fmt::format("ADD on key \"{}\" holding \"{}\", not an integer",
                         printable(key), printable(to_string(it->second)));
    return false;
  }
  // Wraps like PyTorch's server (INT64_MAX + 1 -> INT64_MIN).
  auto result = static_cast<int64_t>(static_cast<uint64_t>(current) +
                                     static_cast<uint64_t>(delta));
  put_i64(output(id), result);
  std::string text = std::to_string(result);
  bool created = it == data_.end();
  if (created) it = data_.try_emplace(std::move(key)).first;
  Bytes old_value = std::exchange(it->second, Bytes(text.begin(), text.end()));
  written(it->first, created, old_value, it->second);
  return true;
}

void ServerState::compare_set(ClientId id, std::string& key, const Bytes& expected,
                              Bytes&& desired) {
  auto it = data_.find(key);
  if (it == data_.end()) {
    // A missing key with a non-empty `expected` answers `expected` and
    // creates nothing, as PyTorch does.
    if (!expected.empty()) {
      put_bytes(output(id), expected);
      return;
    }
    put_bytes(output(id), desired);
    it = data_.emplace(std::move(key), std::move(desired)).first;
    written(it->first, true, kEmpty, it->second);
    return;
  }
  if (it->second != expected) {
    put_bytes(output(id), it->second);
    return;
  }
  put_bytes(output(id), desired);
  Bytes old_value = std::exchange(it->second, std::move(desired));
  written(it->first, false, old_value, it->second);
}

void ServerState::check(ClientId id, const std::vector<std::string>& keys) {
  bool ready = std::all_of(keys.begin(), keys.end(),
                           [&](const std::string& key) { return data_.count(key) > 0; });
  put_u8(output(id), static_cast<uint8_t>(ready ? CheckResponse::kReady
                                                : CheckResponse::kNotReady));
}

void ServerState::wait(ClientId id, const std::vector<std::string>& keys) {
  std::vector<std::string> missing;
  for (const std::string& key : keys) {
    if (data_.count(key) == 0) missing.push_back(key);
  }
  if (missing.empty()) {
    put_u8(output(id), static_cast<uint8_t>(WaitResponse::kStopWaiting));
    return;
  }
  std::sort(missing.begin(), missing.end());
  missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
  uint64_t wait_id = next_wait_id_++;
  for (const std::string& key : missing) waiters_[key].push_back(wait_id);
  clients_.at(id).waits.push_back(wait_id);
  size_t remaining = missing.size();
  waits_.emplace(wait_id, Wait{id, std::move(missing), remaining});
}

void ServerState::watch(ClientId id, std::string& key) {
  Client& client = clients_.at(id);
  auto& watched = client.watched_keys;
  if (std::find(watched.begin(), watched.end(), key) == watched.end()) {
    watchers_[key].push_back(id);
    watched.push_back(std::move(key));
  }
  put_u8(client.peer->output(),
         static_cast<uint8_t>(WatchResponse::kCallbackRegistered));
}

void ServerState::delete_key(ClientId id, const std::string& key) {
  auto it = data_.find(key);
  if (it == data_.end()) {
    put_i64(output(id), 0);
    return;
  }
  Bytes old_value = std::move(it->second);
  data_.erase(it);
  put_i64(output(id), 1);
  // Deleting neither releases nor cancels a parked WAIT.
  notify_watchers(key, WatchResponse::kKeyDeleted, old_value, kEmpty);
}

void ServerState::append(ClientId id, std::string& key, const Bytes& value) {
  auto [it, created] = data_.try_emplace(std::move(key));
  Bytes& current = it->second;
  Bytes old_value = has_watchers(it->first) ? current : Bytes{};
  current.insert(current.end(), value.begin(), value.end());
  written(it->first, created, old_value, current);
}

bool ServerState::multi_get(ClientId id, const std::vector<std::string>& keys,
                            std::string* error) {
  // Check every key first so a failure leaves no partial reply behind.
  for (const std::string& key : keys) {
    if (data_.count(key) == 0) {
      *error = fmt::format("MULTI_GET of missing key \"{}\"", printable(key));
      return false;
    }
  }
  Bytes& out = output(id);
  for (const std::string& key : keys) put_bytes(out, data_.find(key)->second);
  return true;
}

void ServerState::cancel_waits(Client& client) {
  for (uint64_t wait_id : client.waits) {
    auto wait = waits_.find(wait_id);
    if (wait == waits_.end()) continue;
    for (const std::string& key : wait->second.keys) {
      auto waiters = waiters_.find(key);
      if (waiters == waiters_.end()) continue;  // created since
      erase_one(waiters->second, wait_id);
      if (waiters->second.empty()) waiters_.erase(waiters);
    }
    waits_.erase(wait);
  }
  client.waits.clear();
}

void ServerState::written(const std::string& key, bool created,
                          const Bytes& old_value, const Bytes& new_value) {
  // A parked WAIT only ever lists missing keys, so only a creation can
  // release one.
  if (created) wake_waiters(key);
  notify_watchers(key,
                  created ? WatchResponse::kKeyCreated : WatchResponse::kKeyUpdated,
                  created ? kEmpty : old_value, new_value);
}

void ServerState::wake_waiters(const std::string& key) {
  if (waiters_.empty()) return;
  auto node = waiters_.extract(key);
  if (node.empty()) return;
  for (uint64_t wait_id : node.mapped()) {
    auto wait = waits_.find(wait_id);
    if (wait == waits_.end() || --wait->second.remaining > 0) continue;
    Client& client = clients_.at(wait->second.client);
    erase_one(client.waits, wait_id);
    waits_.erase(wait);
    put_u8(client.peer->output(), static_cast<uint8_t>(WaitResponse::kStopWaiting));
    client.peer->flush();
  }
}

void ServerState::notify_watchers(const std::string& key, WatchResponse type,
                                  const Bytes& old_value, const Bytes& new_value) {
  if (watchers_.empty()) return;
  auto watchers = watchers_.find(key);
  if (watchers == watchers_.end()) return;
  event_.clear();
  put_u8(event_, static_cast<uint8_t>(type));
  put_bytes(event_, key);
  put_bytes(event_, old_value);
  put_bytes(event_, new_value);
  for (ClientId id : watchers->second) {
    Peer* peer = clients_.at(id).peer;
    peer->output().insert(peer->output().end(), event_.begin(), event_.end());
    peer->flush();
  }
}

bool ServerState::has_watchers(const std::string& key) const {
  return !watchers_.empty() && watchers_.count(key) > 0;
}

Bytes& ServerState::output(ClientId id) { return clients_.at(id).peer->output(); }

std::string printable(std::string_view text, size_t limit) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < limit; ++i) {
    auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '"') {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  if (text.size() > limit) out += "...";
  return out;
}

}  // namespace switchboard::tcpstore
