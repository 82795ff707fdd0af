#include "agents/pipe/peer_table.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/error.h"

namespace switchboard::agents::pipe {

namespace {

rpc::WorkerDevices devices_of(const WorkerAnnouncement& a) {
  return {a.name, a.device_count, a.device_maps, a.devices};
}

}  // namespace

PeerTable::PeerTable(std::string self_name, int capacity, bool dynamic,
                     std::shared_ptr<rpc::AgentMetrics> metrics)
    : self_name_(std::move(self_name)),
      dynamic_(dynamic),
      metrics_(std::move(metrics)),
      infos_(capacity) {
  MutexLock lock(mu_);
  status_.resize(capacity);
  for (Status& s : status_) s.state = dynamic ? State::kAbsent : State::kConnecting;
}

// ------------------------------------------------------------------ filling

void PeerTable::fill_static(const std::vector<WorkerAnnouncement>& all, int self,
                            DeviceRoutes routes) {
  std::vector<EarlyHello> early;
  {
    MutexLock lock(mu_);
    for (size_t r = 0; r < infos_.size(); ++r) {
      infos_[r] = publish_locked(static_cast<int>(r), all[r].name, all[r],
                                 static_cast<int>(r) == self);
    }
    routes_ = std::move(routes);
    self_ = self;
    status_[self].state = State::kUp;
    early = ready_locked();
  }
  replay(std::move(early));
}

void PeerTable::fill_members(const std::vector<Member>& members, int self,
                             const WorkerAnnouncement& mine, DeviceRoutes routes) {
  std::vector<EarlyHello> early;
  {
    MutexLock lock(mu_);
    routes_ = std::move(routes);
    for (const Member& m : members) {
      infos_[m.rank] = publish_locked(m.rank, m.announcement.name, m.announcement, false);
      status_[m.rank].state = State::kConnecting;
    }
    infos_[self] = publish_locked(self, mine.name, mine, true);
    self_ = self;
    status_[self].state = State::kUp;
    early = ready_locked();
  }
  // Hellos that arrived before the table was ready: a faster peer of a
  // static group, or a stray joiner whose token lease ended while this
  // worker held it.
  replay(std::move(early));
}

PeerTable::PeerInfo PeerTable::publish_locked(int rank, const std::string& name,
                                              const WorkerAnnouncement& announcement,
                                              bool self) {
  PeerInfo p{rpc::WorkerInfo{name, rank}, announcement, nullptr};
  if (metrics_ && !self) p.metrics = metrics_->peer(rank, name);
  return p;
}

void PeerTable::set_metrics_state(int peer, rpc::ConnectionState state) const {
  if (const auto& m = infos_[peer].metrics) m->set_state(state);
}

void PeerTable::replay(std::vector<EarlyHello> early) {
  for (auto& [connection, hello] : early) {
    connection->replay(
        wire::InboundFrame{wire::FrameKind::kHello, std::move(hello), {}, {}});
  }
}

std::vector<PeerTable::EarlyHello> PeerTable::ready_locked() {
  ready_ = true;
  std::vector<EarlyHello> early;
  early.swap(early_hellos_);
  return early;
}

bool PeerTable::defer_hello(const std::shared_ptr<transport::Connection>& connection,
                            const rpc::Message& frame) {
  MutexLock lock(mu_);
  if (ready_) return false;
  early_hellos_.emplace_back(connection, frame);
  return true;
}

// -------------------------------------------------------------- connections

bool PeerTable::add_unidentified(
    const std::shared_ptr<transport::Connection>& connection) {
  MutexLock lock(mu_);
  if (stopping_) return false;
  unidentified_.push_back(connection);
  return true;
}

void PeerTable::connect(int peer, transport::PipeTransport& transport,
                        const PipeAuth& auth, const Hello& hello,
                        std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const WorkerAnnouncement& a = infos_[peer].announcement;
  std::shared_ptr<transport::Connection> connection;
  try {
    connection = transport.connect(a.address, a.port, timeout);
  } catch (const ConnectionError& e) {
    throw ConnectionError(
        fmt::format("PIPE agent \"{}\": cannot connect to worker \"{}\" at {}:{}: {}",
                    self_name_, name_of(peer), a.address, a.port, e.what()));
  } catch (const AuthenticationError& e) {  // TLS refused a certificate
    throw AuthenticationError(
        fmt::format("PIPE agent \"{}\": cannot connect to worker \"{}\" at {}:{}: {}",
                    self_name_, name_of(peer), a.address, a.port, e.what()));
  }
  connection->peer = peer;
  // Without a secret, the worker this side chose to call is trusted at once;
  // with one, once it answered the challenge (HelloHandler::on_challenge, hello.h).
  if (!auth.enabled()) connection->trusted = true;
  const std::vector<uint8_t> bytes = auth.claim(*connection, hello);
  connection->enqueue_control(wire::FrameKind::kHello, bytes.data(), bytes.size());
  {
    MutexLock lock(mu_);
    Status& s = status_[peer];
    s.connection = connection;
    s.refused = false;
    // Made again after the last one was lost (a static group's higher rank
    // reconnects): connecting until authenticated, as the first time.
    if (s.state == State::kLost) {
      s.state = State::kConnecting;
      set_metrics_state(peer, rpc::ConnectionState::kConnecting);
    }
    if (!auth.enabled()) {
      s.state = State::kUp;
      set_metrics_state(peer, rpc::ConnectionState::kConnected);
      changed_.notify_all();
    }
  }
  connection->start_reading();
  if (!auth.enabled()) return;
  MutexLock lock(mu_);
  const Status& s = status_[peer];
  changed_.wait_until(mu_, deadline, [&]() SB_REQUIRES(mu_) {
    return stopping_ || s.connection != connection || s.state != State::kConnecting;
  });
  if (s.connection == connection && s.state == State::kUp) return;
  if (s.connection == connection && s.state == State::kConnecting) {
    connection->close_now();
    throw ConnectionError(fmt::format(
        "PIPE agent \"{}\": worker \"{}\" at {}:{} did not answer the authentication "
        "within {} ms",
        self_name_, name_of(peer), a.address, a.port, timeout.count()));
  }
  const std::string why = s.reason.empty() ? std::string("this worker is stopping") : s.reason;
  if (s.refused) {
    throw AuthenticationError(fmt::format("PIPE agent \"{}\": connecting to worker \"{}\" "
                                          "at {}:{}: {}",
                                          self_name_, name_of(peer), a.address, a.port, why));
  }
  throw ConnectionError(fmt::format("PIPE agent \"{}\": connecting to worker \"{}\" at {}:{}: "
                                    "it {}",
                                    self_name_, name_of(peer), a.address, a.port, why));
}

void PeerTable::authenticated(int peer,
                              const std::shared_ptr<transport::Connection>& connection) {
  MutexLock lock(mu_);
  Status& s = status_[peer];
  if (s.connection != connection || s.state != State::kConnecting) return;
  s.state = State::kUp;
  set_metrics_state(peer, rpc::ConnectionState::kConnected);
  changed_.notify_all();
}

void PeerTable::refused(int peer,
                        const std::shared_ptr<transport::Connection>& connection,
                        const std::string& why) {
  MutexLock lock(mu_);
  Status& s = status_[peer];
  if (s.connection != connection) return;
  s.state = State::kLost;
  s.reason = why;
  s.refused = true;
  set_metrics_state(peer, rpc::ConnectionState::kFailed);
  changed_.notify_all();
}

bool PeerTable::identify(int peer,
                         const std::shared_ptr<transport::Connection>& connection) {
  MutexLock lock(mu_);
  Status& s = status_[peer];
  // A connection made again after the last one was lost replaces it (a
  // static group's higher rank reconnects); a peer that is up, or left, is
  // not connected twice.
  if (s.connection && s.state != State::kLost) return false;
  s.reason.clear();
  connection->peer = peer;
  connection->trusted = true;  // identified (after its proof, with a secret)
  std::erase(unidentified_, connection);
  s.connection = connection;
  s.state = State::kUp;
  set_metrics_state(peer, rpc::ConnectionState::kConnected);
  changed_.notify_all();
  return true;
}

std::string PeerTable::admit(int r, const std::string& hello_name,
                             const WorkerAnnouncement& joiner,
                             const std::shared_ptr<transport::Connection>& connection,
                             const RouteRule& routes_with) {
  MutexLock lock(mu_);
  std::erase(unidentified_, connection);
  if (stopping_ || closed_to_newcomers_) {
    return fmt::format("\"{}\" is leaving the group", self_name_);
  }
  if (r < 0 || r >= capacity()) return fmt::format("rank {} is outside [0, {})", r, capacity());
  if (status_[r].state != State::kAbsent) {
    return fmt::format("rank {} was taken by \"{}\"", r, infos_[r].info.name);
  }
  if (joiner.name != hello_name) {
    return fmt::format("the hello names \"{}\" but the announcement \"{}\"", hello_name,
                       joiner.name);
  }
  std::vector<rpc::WorkerDevices> gathered;
  for (size_t p = 0; p < infos_.size(); ++p) {
    if (status_[p].state != State::kUp) continue;
    if (infos_[p].info.name == joiner.name) {
      return fmt::format("the name \"{}\" is used by rank {}", joiner.name, p);
    }
    gathered.push_back(devices_of(infos_[p].announcement));
  }
  gathered.push_back(devices_of(joiner));
  try {
    routes_ = routes_with(gathered);
  } catch (const std::exception& e) {
    return e.what();
  }
  infos_[r] = publish_locked(r, joiner.name, joiner, false);
  status_[r].connection = connection;
  status_[r].state = State::kUp;
  set_metrics_state(r, rpc::ConnectionState::kConnected);
  connection->peer = r;
  connection->trusted = true;  // admitted (after its proof, with a secret)
  return std::string();
}

PeerTable::Loss PeerTable::lose(const std::shared_ptr<transport::Connection>& connection,
                                const std::string& reason) {
  MutexLock lock(mu_);
  Loss loss;
  std::erase(unidentified_, connection);
  loss.quiet = stopping_;
  const int peer = connection->peer;
  if (peer < 0 || status_[peer].connection != connection) return loss;
  Status& s = status_[peer];
  loss.current = true;
  loss.was_up = s.state == State::kUp;
  if (s.state == State::kLeft) {
    loss.quiet = true;
  } else if (s.state != State::kLost) {
    s.state = State::kLost;
    s.reason = fmt::format("lost its connection ({})", reason);
    changed_.notify_all();
    // Losses while stopping are this worker closing its connections.
    set_metrics_state(
        peer, stopping_ ? rpc::ConnectionState::kClosed : rpc::ConnectionState::kFailed);
  }
  loss.why = s.reason;
  return loss;
}

bool PeerTable::mark_left(int peer) {
  MutexLock lock(mu_);
  Status& s = status_[peer];
  if (s.state != State::kUp) return false;
  s.state = State::kLeft;
  s.reason = "left the group";
  set_metrics_state(peer, rpc::ConnectionState::kClosed);
  return true;
}

void PeerTable::mark_lost(int peer, const std::string& reason) {
  MutexLock lock(mu_);
  status_[peer].state = State::kLost;
  status_[peer].reason = reason;
  set_metrics_state(peer, rpc::ConnectionState::kFailed);
}

PeerTable::Dropped PeerTable::drop(int peer, const std::string& why) {
  MutexLock lock(mu_);
  Dropped dropped;
  if (peer == self_ || peer < 0 || peer >= static_cast<int>(status_.size())) return dropped;
  Status& s = status_[peer];
  if (s.state == State::kAbsent || s.state == State::kLeft) return dropped;
  if (s.state == State::kLost && s.reason == why) return dropped;
  dropped.changed = true;
  dropped.was_up = s.state == State::kUp;
  dropped.connection = std::move(s.connection);
  s.state = State::kLost;
  s.reason = why;
  set_metrics_state(peer, rpc::ConnectionState::kFailed);
  return dropped;
}

std::vector<std::shared_ptr<transport::Connection>> PeerTable::close_to_newcomers() {
  MutexLock lock(mu_);
  closed_to_newcomers_ = true;
  std::vector<std::shared_ptr<transport::Connection>> up;
  for (const Status& s : status_) {
    if (s.connection && s.state == State::kUp) up.push_back(s.connection);
  }
  return up;
}

std::vector<std::shared_ptr<transport::Connection>> PeerTable::stop() {
  MutexLock lock(mu_);
  stopping_ = true;
  std::vector<std::shared_ptr<transport::Connection>> all;
  for (size_t r = 0; r < status_.size(); ++r) {
    const Status& s = status_[r];
    if (s.connection) all.push_back(s.connection);
    // A peer lost stays kFailed, one that left kClosed.
    if (s.state == State::kUp || s.state == State::kConnecting) {
      set_metrics_state(static_cast<int>(r), rpc::ConnectionState::kClosed);
    }
  }
  all.insert(all.end(), unidentified_.begin(), unidentified_.end());
  changed_.notify_all();
  return all;
}

std::vector<std::shared_ptr<transport::Connection>> PeerTable::release_connections() {
  MutexLock lock(mu_);
  std::vector<std::shared_ptr<transport::Connection>> all;
  for (Status& s : status_) {
    if (s.connection) all.push_back(std::move(s.connection));
    s.connection = nullptr;
  }
  for (auto& connection : unidentified_) all.push_back(std::move(connection));
  unidentified_.clear();
  for (auto& early : early_hellos_) all.push_back(std::move(early.first));
  early_hellos_.clear();
  return all;
}

std::optional<PeerTable::Watched> PeerTable::watched() const {
  MutexLock lock(mu_);
  if (stopping_) return std::nullopt;
  Watched w;
  for (const Status& s : status_) {
    if (s.connection && s.state == State::kUp) w.up.push_back(s.connection);
  }
  w.unidentified = unidentified_;
  return w;
}

std::vector<std::string> PeerTable::wait_all_up(std::chrono::milliseconds timeout) {
  MutexLock lock(mu_);
  auto all_up = [&]() SB_REQUIRES(mu_) {
    return std::all_of(status_.begin(), status_.end(),
                       [](const Status& s) { return s.state == State::kUp; });
  };
  if (timeout.count() > 0) {
    changed_.wait_for(mu_, timeout, all_up);
  } else {
    changed_.wait(mu_, all_up);
  }
  std::vector<std::string> missing;
  for (size_t r = 0; r < status_.size(); ++r) {
    if (status_[r].state != State::kUp) missing.push_back(infos_[r].info.name);
  }
  return missing;
}

// ------------------------------------------------------------------- lookup

PeerTable::Route PeerTable::route(int peer) const {
  MutexLock lock(mu_);
  const Status& s = status_[peer];
  if (s.state != State::kUp) return Route{false, nullptr, s.reason};
  return Route{true, s.connection, std::string()};
}

std::shared_ptr<transport::Connection> PeerTable::connection(int peer) const {
  MutexLock lock(mu_);
  return status_[peer].connection;
}

bool PeerTable::is_up(int peer) const {
  MutexLock lock(mu_);
  return status_[peer].state == State::kUp;
}

std::string PeerTable::reason(int peer) const {
  MutexLock lock(mu_);
  return status_[peer].reason;
}

std::optional<std::string> PeerTable::gone(int peer) const {
  MutexLock lock(mu_);
  const Status& s = status_[peer];
  if (s.state == State::kLeft) return std::string("shut down");
  if (s.state == State::kLost) return fmt::format("was lost ({})", s.reason);
  return std::nullopt;
}

rpc::WorkerInfo PeerTable::find(const std::string& name) const {
  MutexLock lock(mu_);
  const PeerInfo* found = nullptr;
  for (size_t r = 0; r < infos_.size(); ++r) {
    const State state = status_[r].state;
    if (state == State::kAbsent || infos_[r].info.name != name) continue;
    if (found == nullptr || state == State::kUp) found = &infos_[r];
  }
  if (found == nullptr) {
    throw NotFoundError(fmt::format("rpc agent \"{}\": no worker named \"{}\"{}", self_name_,
                                    name, dynamic_ ? " in this dynamic group" : ""));
  }
  return found->info;
}

rpc::WorkerInfo PeerTable::find(int id) const {
  MutexLock lock(mu_);
  if (id < 0 || id >= capacity() || status_[id].state == State::kAbsent) {
    throw NotFoundError(
        fmt::format("rpc agent \"{}\": no worker with id {}", self_name_, id));
  }
  return infos_[id].info;
}

std::vector<rpc::WorkerInfo> PeerTable::workers() const {
  MutexLock lock(mu_);
  std::vector<rpc::WorkerInfo> out;
  for (size_t r = 0; r < infos_.size(); ++r) {
    if (!dynamic_ || status_[r].state == State::kUp) out.push_back(infos_[r].info);
  }
  return out;
}

std::vector<int> PeerTable::peers_up() const {
  MutexLock lock(mu_);
  std::vector<int> out;
  for (size_t r = 0; r < status_.size(); ++r) {
    if (status_[r].state == State::kUp && static_cast<int>(r) != self_) {
      out.push_back(static_cast<int>(r));
    }
  }
  return out;
}

rpc::DeviceMaps PeerTable::reverse_maps() const {
  MutexLock lock(mu_);
  return routes_.reverse_maps;
}

std::vector<Device> PeerTable::devices() const {
  MutexLock lock(mu_);
  return routes_.devices;
}

}  // namespace switchboard::agents::pipe
