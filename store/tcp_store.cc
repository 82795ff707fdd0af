#include "store/tcp_store.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>

#include "common/error.h"
#include "common/mutex.h"
#include "store/call_bound.h"
#include "store/tcp_client_connection.h"
#include "store/tcp_protocol.h"
#include "store/tcp_store_server.h"

namespace switchboard {

using tcpstore::Clock;
using tcpstore::Deadline;
using tcpstore::QueryType;
using tcpstore::Request;

namespace {

// The PyTorch client prefixes every user key with "/"; so do we.
std::string wire_key(const std::string& key) { return "/" + key; }

std::vector<std::string> wire_keys(const std::vector<std::string>& keys) {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& key : keys) out.push_back(wire_key(key));
  return out;
}

// The key PyTorch's wait_for_workers counts on, sent without the prefix.
constexpr const char* kInitKey = "init/";

}  // namespace

// The connection and what the client learned about the server. Every
// method requires `mutex`.
class TcpStore::Connection {
 public:
  Connection(std::string host, uint16_t port, std::shared_ptr<const Secret> secret)
      : socket(std::move(host), port, std::move(secret)) {}

  // Encodes and writes `request` (reconnecting first if needed).
  void send(const Request& request, Deadline deadline) SB_REQUIRES(mutex) {
    socket.ensure_open(deadline);
    out.clear();
    tcpstore::encode_request(out, request, socket.dialect());
    socket.write(out, deadline);
  }

  // Sends CANCEL_WAIT on a connection with no pending wait: our server (and
  // PyTorch 2.x) answers WAIT_CANCELED; PyTorch 1.13 closes the connection.
  bool probe_extensions(Deadline deadline) SB_REQUIRES(mutex) {
    if (has_extensions) return *has_extensions;
    socket.ensure_open(deadline);
    // PyTorch 2.x's numbering has them all (ours and PyTorch 2.x's servers).
    if (socket.dialect() == tcpstore::Dialect::kTorch2) {
      has_extensions = true;
      return true;
    }
    try {
      send(Request{QueryType::kCancelWait, {}, {}, 0}, deadline);
      uint8_t reply = socket.read_u8(deadline);
      has_extensions = reply == static_cast<uint8_t>(tcpstore::WaitResponse::kWaitCanceled);
      if (!*has_extensions) socket.close();  // out of step: start afresh
    } catch (const ConnectionError&) {
      has_extensions = false;  // closed on the unknown code: a 1.13 server
    }
    return *has_extensions;
  }

  // After a WAIT timed out: cancel it so no late STOP_WAITING is left on
  // the connection, or drop the connection when the server cannot cancel.
  void abandon_wait(Deadline deadline) SB_REQUIRES(mutex) {
    if (has_extensions.value_or(true) == false) {
      socket.close();
      return;
    }
    try {
      send(Request{QueryType::kCancelWait, {}, {}, 0}, deadline);
      uint8_t reply = socket.read_u8(deadline);
      // The wait may have completed just before the cancel arrived.
      if (reply == static_cast<uint8_t>(tcpstore::WaitResponse::kStopWaiting)) {
        reply = socket.read_u8(deadline);
      }
      has_extensions = true;
      if (reply != static_cast<uint8_t>(tcpstore::WaitResponse::kWaitCanceled)) {
        socket.close();
      }
    } catch (const Error&) {
      has_extensions = false;
      socket.close();
    }
  }

  Mutex mutex;
  tcpstore::ClientConnection socket SB_GUARDED_BY(mutex);
  std::optional<bool> has_extensions SB_GUARDED_BY(mutex);  // unknown until seen
  Bytes out SB_GUARDED_BY(mutex);                           // reused buffer
};

TcpStore::TcpStore(std::string host, uint16_t port, TcpStoreOptions options)
    : host_(std::move(host)), port_(port) {
  Store::set_timeout(options.timeout);
  if (options.is_master) {
    TcpStoreServerOptions server_options;
    server_options.host = host_;
    server_options.port = port_;
    server_options.secret = options.secret;
    server_ = std::make_unique<TcpStoreServer>(server_options);
    port_ = server_->port();
  }
  connection_ = std::make_unique<Connection>(host_, port_, options.secret);
  {
    MutexLock lock(connection_->mutex);
    connection_->socket.ensure_open(tcpstore::deadline_after(options.timeout));
  }
  if (options.world_size) {
    // PyTorch sends "init/" without the "/" prefix.
    call_i64(Request{QueryType::kAdd, {kInitKey}, {}, 1});
    if (options.is_master && options.wait_for_workers) {
      wait_for_workers(*options.world_size);
    }
  }
}

TcpStore::~TcpStore() {
  connection_.reset();
  if (server_) server_->stop();
}

std::shared_ptr<const StoreMetrics> TcpStore::metrics() const { return metrics_; }

// Each request's deadline: the store's timeout, cut to the calling
// thread's StoreCallBound.
Deadline TcpStore::request_deadline() const {
  return tcpstore::deadline_after(StoreCallBound::bounded(timeout()));
}

int64_t TcpStore::call_i64(const Request& request) {
  MutexLock lock(connection_->mutex);
  Deadline deadline = request_deadline();
  connection_->send(request, deadline);
  return connection_->socket.read_i64(deadline);
}

void TcpStore::wait_for_workers(int world_size) {
  int64_t joined = call_i64(Request{QueryType::kAdd, {kInitKey}, {}, 0});
  Deadline deadline = request_deadline();
  auto backoff = std::chrono::milliseconds(1);
  while (joined < world_size) {
    if (Clock::now() >= deadline) {
      throw TimeoutError(fmt::format(
          "TcpStore master at {}:{}: only {} of {} workers joined within {} ms",
          host_, port_, joined, world_size, timeout().count()));
    }
    // The protocol cannot wait for a counter value; poll it gently.
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(50));
    joined = call_i64(Request{QueryType::kAdd, {kInitKey}, {}, 0});
  }
}

bool TcpStore::server_has_extensions() {
  MutexLock lock(connection_->mutex);
  return connection_->probe_extensions(request_deadline());
}

bool TcpStore::server_speaks_torch2() {
  MutexLock lock(connection_->mutex);
  connection_->socket.ensure_open(request_deadline());
  return connection_->socket.dialect() == tcpstore::Dialect::kTorch2;
}

void TcpStore::set(const std::string& key, const Bytes& value) {
  return counted(StoreOp::kSet, [&] {
    MutexLock lock(connection_->mutex);
    connection_->send(Request{QueryType::kSet, {wire_key(key)}, {value}, 0},
                      request_deadline());
  });
}

// The *_locked methods require connection_->mutex. Their declarations in
// tcp_store.h cannot say so (Connection is incomplete there), so the
// definitions carry SB_REQUIRES and come before their first use.
std::vector<std::string> TcpStore::missing_locked(const std::vector<std::string>& keys)
    SB_REQUIRES(connection_->mutex) {
  // Only used to write a precise error; a failure here keeps the full list.
  std::vector<std::string> missing;
  try {
    for (const auto& key : keys) {
      connection_->send(Request{QueryType::kCheck, {wire_key(key)}, {}, 0},
                        request_deadline());
      if (connection_->socket.read_u8(request_deadline()) != 0) missing.push_back(key);
    }
  } catch (const Error&) {
    return keys;
  }
  return missing;
}

void TcpStore::explain_failed_add_locked(const std::string& key, int64_t delta)
    SB_REQUIRES(connection_->mutex) {
  // The protocol has no error reply: the server closes the connection when
  // the value is not an integer. Look once (no reconnect retries: the server
  // may be gone) and, if that is the reason, say so precisely.
  Bytes value;
  try {
    Deadline deadline = request_deadline();
    connection_->socket.ensure_open(deadline, /*retry=*/false);
    connection_->send(Request{QueryType::kCheck, {wire_key(key)}, {}, 0}, deadline);
    if (connection_->socket.read_u8(deadline) != 0) return;
    connection_->send(Request{QueryType::kGet, {wire_key(key)}, {}, 0}, deadline);
    value = connection_->socket.read_bytes(deadline);
  } catch (const Error&) {
    return;
  }
  int64_t ignored = 0;
  if (parse_store_integer(value, &ignored)) return;
  throw Error(ErrorCode::kFailedPrecondition,
              fmt::format("TcpStore add(\"{}\", {}) at {}:{}: value \"{}\" is not an "
                          "integer (the server closed the connection)",
                          key, delta, host_, port_, to_string(value)));
}

void TcpStore::wait_locked(const std::vector<std::string>& keys, Timeout timeout,
                           const char* op) SB_REQUIRES(connection_->mutex) {
  timeout = StoreCallBound::bounded(timeout);
  Deadline deadline = tcpstore::deadline_after(timeout);
  connection_->send(Request{QueryType::kWait, wire_keys(keys), {}, 0}, deadline);
  // A worker that hangs in a rendezvous shows here, at debug level, which
  // keys (whose ranks) it waits for.
  const bool debug = spdlog::should_log(spdlog::level::debug);
  if (debug) {
    spdlog::debug("TcpStore {} at {}:{}: waiting up to {} ms for keys {}", op, host_,
                  port_, timeout.count(), format_keys(keys));
  }
  const auto began = Clock::now();
  const bool ready = connection_->socket.wait_readable(deadline);
  metrics_->waited(Clock::now() - began, /*timed_out=*/!ready);
  if (ready) {
    connection_->socket.read_u8(deadline);  // STOP_WAITING
    if (debug) {
      spdlog::debug("TcpStore {} at {}:{}: keys {} are set", op, host_, port_,
                    format_keys(keys));
    }
  } else {
    connection_->abandon_wait(request_deadline());
    throw TimeoutError(fmt::format(
        "TcpStore {} at {}:{}: keys {} still missing after {} ms", op, host_, port_,
        format_keys(missing_locked(keys)), timeout.count()));
  }
}

Bytes TcpStore::get(const std::string& key) {
  return counted(StoreOp::kGet, [&] {
    MutexLock lock(connection_->mutex);
    wait_locked({key}, timeout(), "get");
    Deadline deadline = request_deadline();
    connection_->send(Request{QueryType::kGet, {wire_key(key)}, {}, 0}, deadline);
    try {
      return connection_->socket.read_bytes(deadline);
    } catch (const ConnectionError&) {
      if (!connection_->socket.peer_closed()) throw;
      // The server closes the connection on GET of a missing key.
      throw NotFoundError(fmt::format(
          "TcpStore get(\"{}\") at {}:{}: the key was deleted between WAIT and GET",
          key, host_, port_));
    }
  });
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  return counted(StoreOp::kAdd, [&] {
    MutexLock lock(connection_->mutex);
    Deadline deadline = request_deadline();
    connection_->send(Request{QueryType::kAdd, {wire_key(key)}, {}, delta}, deadline);
    try {
      return connection_->socket.read_i64(deadline);
    } catch (const ConnectionError&) {
      if (!connection_->socket.peer_closed()) throw;
      explain_failed_add_locked(key, delta);
      throw;
    }
  });
}

Bytes TcpStore::compare_set(const std::string& key, const Bytes& expected,
                            const Bytes& desired) {
  return counted(StoreOp::kCompareSet, [&] {
    MutexLock lock(connection_->mutex);
    Deadline deadline = request_deadline();
    connection_->send(Request{QueryType::kCompareSet, {wire_key(key)}, {expected, desired}, 0},
                      deadline);
    return connection_->socket.read_bytes(deadline);
  });
}

void TcpStore::wait(const std::vector<std::string>& keys, Timeout timeout) {
  return counted(StoreOp::kWait, [&] {
    MutexLock lock(connection_->mutex);
    wait_locked(keys, timeout, "wait");
  });
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  return counted(StoreOp::kCheck, [&] {
    MutexLock lock(connection_->mutex);
    Deadline deadline = request_deadline();
    connection_->send(Request{QueryType::kCheck, wire_keys(keys), {}, 0}, deadline);
    return connection_->socket.read_u8(deadline) ==
           static_cast<uint8_t>(tcpstore::CheckResponse::kReady);
  });
}

bool TcpStore::delete_key(const std::string& key) {
  return counted(StoreOp::kDeleteKey, [&] {
    return call_i64(Request{QueryType::kDeleteKey, {wire_key(key)}, {}, 0}) == 1;
  });
}

int64_t TcpStore::num_keys() {
  return counted(StoreOp::kNumKeys, [&] {
    return call_i64(Request{QueryType::kGetNumKeys, {}, {}, 0});
  });
}

std::vector<Bytes> TcpStore::multi_get(const std::vector<std::string>& keys) {
  return counted(StoreOp::kMultiGet, [&] {
    MutexLock lock(connection_->mutex);
    wait_locked(keys, timeout(), "multi_get");
    Deadline deadline = request_deadline();
    if (connection_->probe_extensions(deadline)) {
      connection_->send(Request{QueryType::kMultiGet, wire_keys(keys), {}, 0}, deadline);
    } else {
      // PyTorch 1.13: pipeline one GET per key.
      connection_->socket.ensure_open(deadline);
      connection_->out.clear();
      for (const auto& key : keys) {
        tcpstore::encode_request(connection_->out,
                                 Request{QueryType::kGet, {wire_key(key)}, {}, 0},
                                 connection_->socket.dialect());
      }
      connection_->socket.write(connection_->out, deadline);
    }
    std::vector<Bytes> values;
    values.reserve(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      values.push_back(connection_->socket.read_bytes(deadline));
    }
    return values;
  });
}

void TcpStore::multi_set(const std::vector<std::string>& keys,
                         const std::vector<Bytes>& values) {
  return counted(StoreOp::kMultiSet, [&] {
    if (keys.size() != values.size()) {
      throw std::invalid_argument(fmt::format(
          "multi_set: {} keys but {} values", keys.size(), values.size()));
    }
    MutexLock lock(connection_->mutex);
    Deadline deadline = request_deadline();
    if (connection_->probe_extensions(deadline)) {
      connection_->send(Request{QueryType::kMultiSet, wire_keys(keys), values, 0}, deadline);
      return;
    }
    // PyTorch 1.13: one SET per key in a single write (not atomic as a whole).
    connection_->socket.ensure_open(deadline);
    connection_->out.clear();
    for (size_t i = 0; i < keys.size(); ++i) {
      tcpstore::encode_request(connection_->out,
                               Request{QueryType::kSet, {wire_key(keys[i])}, {values[i]}, 0},
                               connection_->socket.dialect());
    }
    connection_->socket.write(connection_->out, deadline);
  });
}

void TcpStore::append(const std::string& key, const Bytes& value) {
  return counted(StoreOp::kAppend, [&] {
    {
      MutexLock lock(connection_->mutex);
      Deadline deadline = request_deadline();
      if (connection_->probe_extensions(deadline)) {
        connection_->send(Request{QueryType::kAppend, {wire_key(key)}, {value}, 0}, deadline);
        return;
      }
    }
    Store::append(key, value);  // compare_set loop against PyTorch 1.13
  });
}

}  // namespace switchboard
