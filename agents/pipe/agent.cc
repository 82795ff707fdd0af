#include "agents/pipe/agent.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string_view>

#include "agents/pipe/address.h"
#include "agents/pipe/agent_impl.h"
#include "agents/pipe/transport/registry.h"
#include "common/check.h"
#include "common/error.h"
#include "common/listen_address.h"
#include "core/remote_error.h"
#include "rendezvous/quiet_group.h"
#include "rendezvous/rounds.h"
#include "store/prefix_store.h"
#include "store/store.h"

namespace switchboard::agents::pipe {

namespace {

using Clock = std::chrono::steady_clock;
using rpc::Future;
using rpc::Message;
using rpc::MessageType;
using rpc::Promise;
using rpc::WorkerInfo;
using Timeout = std::chrono::milliseconds;

}  // namespace

// --------------------------------------------------------------- Impl

PipeAgent::Impl::Impl(PipeAgent& owner, std::shared_ptr<Store> store, std::string name,
                      int rank, std::optional<int> world_size,
                      const PipeAgentOptions& options)
    : owner(owner),
      store(std::move(store)),
      name(std::move(name)),
      rank(rank),
      dynamic(!world_size.has_value()),
      capacity(world_size.value_or(options.max_dynamic_ranks)),
      options(options),
      device_count(options.device_count >= 0 ? options.device_count
                                             : registered_cuda_device_count()),
      channels(make_channels(this->name, options, device_count, buffers)),
      auth(options.secret ? options.secret : Secret::from_environment(), this->name,
           rank),
      peers(this->name, capacity, dynamic, owner.metrics()),
      calls(this->name, owner.pool()) {
  transport::TransportOptions settings;
  settings.agent_name = this->name;
  settings.num_io_threads = options.num_io_threads;
  settings.limits = options.limits;
  settings.ports = port_range(options.port_range);
  settings.tls = options.tls.enabled() ? options.tls : PipeTlsOptions::from_environment();
  // A peer gets as long for its TLS handshake as for its hello.
  if (options.heartbeat_timeout.count() > 0)
    settings.handshake_timeout = options.heartbeat_timeout;
  const char* shm_variable = std::getenv("SWITCHBOARD_PIPE_SHM");
  const bool shm = options.shm.value_or(shm_variable == nullptr ||
                                        std::string_view(shm_variable) != "0");
  // The registry turns the lane off where it cannot go (inside TLS).
  if (shm) settings.lane_capacity = options.shm_ring_bytes;
  if (!shm) {
    spdlog::info("rpc agent \"{}\": the same-host shared-memory lane is off: frames to "
                 "workers of this host go over TCP",
                 this->name);
  }
  // Received tensors land where their channels want them.
  settings.allocate = channels.allocator();
  settings.progress = channels.progress();
  transport = transport::builtin_transports().make(*this, std::move(settings));
  tls = transport->name() == "tls";
  calls.set_max_requests_per_peer(options.max_requests_per_peer);
  // A call cancelled by its future: the callee is told with a cancel frame.
  calls.set_cancel_notifier([this](int dst, uint64_t id) {
    if (dst == this->rank) {
      calls.cancel_request(dst, id);
    } else if (const std::shared_ptr<transport::Connection> c = peers.connection(dst)) {
      c->enqueue_control(wire::FrameKind::kCancel, nullptr, 0, id);
    }
  });
  if (dynamic) {
    membership = std::make_unique<Membership>(
        this->store, this->name, rank, capacity, this->options, peers, *transport, auth,
        calls, owner.pool(), [this](int peer, const std::string& why) { drop_peer(peer, why); });
  } else {
    rendezvous = std::make_unique<StaticRendezvous>(this->name, rank, capacity,
                                                    this->options, peers, *transport, auth);
  }
  auto fail = [this](const std::shared_ptr<transport::Connection>& c,
                     const std::string& why) { connection_failed(c, why); };
  hello = std::make_unique<HelloHandler>(this->name, capacity, auth, peers,
                                         rendezvous.get(), membership.get(), fail);
  Liveness::Hooks hooks;
  hooks.fail = fail;
  hooks.post_reconnect = [this](int peer) {
    this->owner.pool()->post(
        [self = shared_from_this(), peer] { self->liveness->reconnect(peer); });
  };
  hooks.connect_again = [this](int peer, std::chrono::milliseconds limit) {
    rendezvous->reconnect(peer, limit);
  };
  liveness =
      std::make_unique<Liveness>(Liveness::Options{this->name, options.heartbeat_timeout,
                                                   hello_deadline(), !dynamic},
                                 peers, std::move(hooks));
}

// The membership watcher and the I/O threads report to this object and its
// parts: they stop first.
PipeAgent::Impl::~Impl() {
  if (membership) membership->stop();
  // Every connection holds objects of the transport's I/O context (its
  // socket, its strand), so the peer table lets go of them before the
  // transport goes: one destroyed after the context would write to freed
  // memory. Those still held by handlers queued in the context go with it.
  peers.release_connections();
  transport.reset();
}

void PipeAgent::Impl::start_up() {
  if (auth.enabled()) {
    spdlog::info("rpc agent \"{}\": every PIPE connection proves the job secret", name);
  }
  if (tls) spdlog::info("rpc agent \"{}\": every PIPE connection is inside mutual TLS", name);
  transport->listen(
      resolve_listen_address(options.listen_address),
      [this](std::shared_ptr<transport::Connection> c) { on_accept(std::move(c)); });
  WorkerAnnouncement mine;
  mine.name = name;
  mine.address = transport->address();
  mine.port = transport->port();
  mine.device_count = device_count;
  mine.device_maps = options.device_maps;
  mine.devices = options.devices;
  mine.tls = tls;
  mine.channels = channels.descriptor();
  // Heartbeats start first: connections made while joining (or during the
  // static rendezvous) must stay alive while the rest is still being set up.
  transport->every(options.heartbeat_interval, [this] { return liveness->tick(); });
  if (dynamic) {
    membership->join(mine);
  } else {
    rendezvous->run(*store, mine);
  }
}

void PipeAgent::Impl::on_accept(std::shared_ptr<transport::Connection> connection) {
  if (peers.add_unidentified(connection)) connection->start_reading();
}

bool PipeAgent::Impl::on_frame(const std::shared_ptr<transport::Connection>& connection,
                               wire::InboundFrame frame) {
  if (frame.kind == wire::FrameKind::kHello)
    return hello->on_hello(connection, frame.message);
  const int from = connection->peer;
  if (from < 0) {
    connection_failed(connection, "protocol error: a frame before the hello");
    return false;
  }
  // The connecting side knows its peer's rank from the start: nothing but
  // hellos is read until the peer proved the secret (then it is trusted).
  if (!connection->trusted) {
    connection_failed(connection, "protocol error: a frame before the authentication");
    return false;
  }
  switch (frame.kind) {
    case wire::FrameKind::kHeartbeat:
      return true;
    case wire::FrameKind::kLane:
      connection->on_lane_frame(frame.message.payload);
      return true;
    case wire::FrameKind::kChannel:
      try {
        channels.on_message(*connection, frame.message.payload);
      } catch (const ProtocolError& e) {
        connection_failed(connection, fmt::format("protocol error: {}", e.what()));
        return false;
      }
      return true;
    case wire::FrameKind::kCancel:
      calls.cancel_request(from, frame.message.id);
      return true;
    case wire::FrameKind::kGoodbye:
      if (peers.mark_left(from)) {
        publish_change(rpc::MembershipChange::Kind::kLeft, peers.info(from).info);
        if (membership) membership->on_peer_lost(from, Membership::Gone::kLeft, "left");
      }
      return true;
    case wire::FrameKind::kRequest:
    case wire::FrameKind::kResponse:
    case wire::FrameKind::kError:
      if (!frame.channel_tensors.empty()) {
        try {
          channels.check(*connection, frame);
        } catch (const ProtocolError& e) {
          connection_failed(connection, fmt::format("protocol error: {}", e.what()));
          return false;
        }
      }
      count_received(from, frame.message);
      if (frame.kind == wire::FrameKind::kRequest) {
        accept_request(from, std::move(frame), connection);
      } else {
        complete(std::move(frame), connection);
      }
      return true;
    default:
      connection_failed(connection, "protocol error: unexpected frame kind");
      return false;
  }
}

// Hands `request` to the call table, which runs the handler on the pool
// (after start(): peers may call as soon as their own constructor
// returned); the reply goes back to `from`.
void PipeAgent::Impl::accept_request(int from, wire::InboundFrame request,
                                     std::shared_ptr<transport::Connection> connection) {
  rpc::CallTable::Request r;
  r.message = std::move(request.message);
  r.from = peers.info(from).info;
  std::weak_ptr<Impl> weak = weak_from_this();
  const bool placed = std::any_of(request.devices.begin(), request.devices.end(),
                                  [](const Device& d) { return !d.is_cpu(); });
  if (placed) {
    // Destroyed with the request, run or not: what it still holds goes back.
    auto unfetched = std::make_shared<Unfetched>(weak, std::move(connection),
                                                 std::move(request.channel_tensors));
    r.prepare = [weak, from, devices = std::move(request.devices),
                 unfetched = std::move(unfetched)](Message& m) {
      if (auto self = weak.lock()) self->receive_tensors(m, devices, *unfetched, from);
    };
  }
  r.reply = rpc::CallTable::reply_via(weak, &Impl::deliver_reply, from);
  calls.accept(std::move(r));
}

void PipeAgent::Impl::deliver_reply(int to, Message reply) {
  const uint64_t id = reply.id;
  // A reply that cannot travel (its tensors) becomes an error reply.
  auto replace_with_error = [&] {
    reply = Message{};
    reply.type = MessageType::kError;
    reply.id = id;
    rpc::encode_remote_error(reply, name, std::current_exception());
  };
  std::vector<Device> wire;
  std::vector<wire::TensorRoute> routes;
  const std::shared_ptr<transport::Connection> connection =
      to == rank ? nullptr : peers.connection(to);
  try {
    wire = wire_devices(reply, to, /*reply=*/true);
    if (to == rank) {
      reply = copy_tensors(std::move(reply), wire);
    } else if (connection) {
      routes = route_tensors(reply, wire, to, *connection);
    }
  } catch (...) {
    replace_with_error();
    wire.clear();
    routes.clear();
  }
  if (to == rank) {
    complete_now(std::move(reply));
    return;
  }
  const bool alone = calls.load().handling <= 1;  // the only handler: send from here
  if (!connection || !connection->enqueue(reply, wire, routes, alone)) {
    spdlog::debug("rpc agent \"{}\": reply {} to \"{}\" dropped: no connection", name,
                  reply.id, peers.name_of(to));
    return;
  }
  count_sent(to, reply);
}

// Per-peer metrics: the peer's counters were looked up when it was
// published (PeerTable), so this is two relaxed atomic adds. Calls and
// replies only (not hellos, heartbeats or goodbyes).
void PipeAgent::Impl::count_sent(int to, const Message& m) const {
  if (const auto& metrics = peers.info(to).metrics) metrics->sent(wire::frame_size(m));
}

void PipeAgent::Impl::count_received(int from, const Message& m) const {
  if (const auto& metrics = peers.info(from).metrics)
    metrics->received(wire::frame_size(m));
}

void PipeAgent::Impl::complete_now(Message response) {
  const uint64_t id = response.id;
  calls.complete(id, std::move(response));  // false: timed out or cancelled
}

void PipeAgent::Impl::connection_failed(
    const std::shared_ptr<transport::Connection>& connection, const std::string& reason) {
  if (connection->failed.exchange(true)) return;  // already reported
  connection->close_now();
  channels.forget(*connection);
  auth.forget(*connection);
  // Before the peer is seen down: whoever sees it down (a call failing)
  // sees its requests here cancelled too.
  if (connection->peer >= 0) calls.cancel_requests_from(connection->peer);
  const PeerTable::Loss loss = peers.lose(connection, reason);
  if (!loss.current) {
    if (!loss.quiet) spdlog::warn("rpc agent \"{}\": closed a connection: {}", name, reason);
    return;
  }
  const int peer = connection->peer;
  const std::string& peer_name = peers.name_of(peer);
  if (membership) {
    membership->on_peer_lost(
        peer, loss.quiet ? Membership::Gone::kQuiet : Membership::Gone::kLost, loss.why);
  }
  if (loss.was_up && !loss.quiet) {
    publish_change(rpc::MembershipChange::Kind::kLeft, peers.info(peer).info);
  }
  if (loss.quiet) {
    spdlog::debug("rpc agent \"{}\": worker \"{}\" {}", name, peer_name, loss.why);
  } else {
    spdlog::warn("rpc agent \"{}\": worker \"{}\" {}", name, peer_name, loss.why);
  }
  fail_calls_to(peer, loss.why);
  // A static group's lower rank: made again by this worker.
  if (loss.was_up && !loss.quiet) liveness->lost(peer, rank);
}

void PipeAgent::Impl::drop_peer(int peer, const std::string& why) {
  const PeerTable::Dropped dropped = peers.drop(peer, why);
  if (!dropped.changed) return;
  // Closed here, not reported: the peer is down already, for `why`.
  if (dropped.connection && !dropped.connection->failed.exchange(true)) {
    dropped.connection->close_now();
  }
  if (dropped.was_up) publish_change(rpc::MembershipChange::Kind::kLeft, peers.info(peer).info);
  spdlog::warn("rpc agent \"{}\": worker \"{}\" {}", name, peers.name_of(peer), why);
  fail_calls_to(peer, why);
}

void PipeAgent::Impl::fail_calls_to(int peer, const std::string& why) {
  // Its requests being served here: their answers cannot reach it.
  calls.cancel_requests_from(peer);
  const std::string& peer_name = peers.name_of(peer);
  calls.fail_if([peer](const rpc::CallTable::Call& c) { return c.dst == peer; },
                [&](const rpc::CallTable::Call& c) {
                  return std::make_exception_ptr(ConnectionError(
                      fmt::format("{}: worker \"{}\" {}", rpc::call_prefix(peer_name, c.function),
                                  peer_name, why)));
                });
}

void PipeAgent::Impl::publish_change(rpc::MembershipChange::Kind kind,
                                     const WorkerInfo& worker) {
  if (membership) membership->publish(kind, worker);
}

// --------------------------------------------------------------- PipeAgent

PipeAgent::PipeAgent(std::shared_ptr<Store> store, std::string name, int rank,
                     std::optional<int> world_size, const PipeAgentOptions& options)
    : RpcAgent(WorkerInfo{name, rank}, options.num_worker_threads) {
  rpc::validate_worker_name(name);
  SB_REQUIRE(store != nullptr, "PIPE agent \"{}\": the store is null", name);
  const int capacity = world_size.value_or(options.max_dynamic_ranks);
  SB_REQUIRE(capacity >= 1 && rank >= 0 && rank < capacity,
             "PIPE agent \"{}\": rank {} is outside [0, {}){}", name, rank, capacity,
             world_size ? "" : " (a dynamic group's ranks; see max_dynamic_ranks)");
  SB_REQUIRE(options.membership_lease.count() > 0,
             "PIPE agent \"{}\": membership_lease must be positive", name);
  SB_REQUIRE(options.heartbeat_interval.count() > 0,
             "PIPE agent \"{}\": heartbeat_interval must be positive", name);
  auto prefixed = rendezvous::agent_store("pipe", std::move(store));
  impl_ = std::make_shared<Impl>(*this, prefixed, std::move(name), rank, world_size,
                                 options);
  try {
    impl_->start_up();
  } catch (...) {
    shutdown();
    throw;
  }
}

PipeAgent::~PipeAgent() { shutdown(); }

void PipeAgent::start(RequestHandler handler) {
  SB_REQUIRE(handler != nullptr, "PIPE agent \"{}\": start() with an empty handler",
             self().name);
  SB_REQUIRE(!impl_->shut_down, "PIPE agent \"{}\": start() after shutdown()",
             self().name);
  SB_REQUIRE(!impl_->calls.started(), "PIPE agent \"{}\": start() called twice",
             self().name);
  impl_->calls.start(std::move(handler), inline_functions());
}

Future<Message> PipeAgent::send(const WorkerInfo& to, Message request, Timeout timeout) {
  Impl& s = *impl_;
  uint64_t id = 0;  // nonzero once the call is in the table
  Future<Message> future;
  try {
    SB_REQUIRE(s.calls.started(), "PIPE agent \"{}\": send() before start()", s.name);
    SB_REQUIRE(request.type == MessageType::kRequest,
               "PIPE agent \"{}\": send() takes a request", s.name);
    SB_REQUIRE(timeout.count() >= 0, "rpc to \"{}\": negative timeout", to.name);
    for (size_t i = 0; i < request.tensors.size(); ++i) {
      SB_REQUIRE(request.tensors[i].defined(), "rpc to \"{}\": tensor {} is undefined",
                 to.name, i);
    }
    const int dst = worker(to.name).id;
    const std::vector<Device> wire = s.wire_devices(request, dst, false);
    rpc::CallTable::Added call = s.calls.add({dst, to.name, request.function, timeout});
    id = call.id;
    future = std::move(call.future);
    request.id = id;
    // The call is in the table before the peer's state is read:
    // connection_failed() marks the peer down first and then fails its
    // calls, so this call is failed by one or the other.
    const PeerTable::Route route = s.peers.route(dst);
    if (!route.up) {
      throw ConnectionError(fmt::format("{}: worker \"{}\" {}",
                                        rpc::call_prefix(to.name, request.function), to.name,
                                        route.reason));
    }
    const bool alone = call.in_flight <= 1;  // the only call in flight: send from here
    std::vector<wire::TensorRoute> routes;
    if (dst != s.rank) routes = s.route_tensors(request, wire, dst, *route.connection);
    if (dst == s.rank) {
      wire::InboundFrame self_request;
      self_request.message = copy_tensors(std::move(request), wire);
      s.accept_request(s.rank, std::move(self_request));
    } else if (!route.connection->enqueue(request, wire, routes, alone)) {
      s.calls.fail(id, std::make_exception_ptr(ConnectionError(fmt::format(
                           "{}: the connection to worker \"{}\" is closed",
                           rpc::call_prefix(to.name, request.function), to.name))));
    } else {
      s.count_sent(dst, request);
    }
    return future;
  } catch (...) {
    // What threw after the call was registered (a self-send's tensor copy,
    // encoding the frame) must not leave it pending: join() waits for it.
    if (id != 0) {
      s.calls.fail(id, std::current_exception());
      return future;
    }
    Promise<Message> failed(pool());
    failed.set_error(std::current_exception());
    return failed.get_future();
  }
}

// A dynamic group may have had several workers of one name over time (one
// left, another joined): the one up now wins, else the latest.
// A worker evicted from its dynamic group says so for names it never knew
// too (one that founded a group the store's older group took back knew
// none).
WorkerInfo PipeAgent::worker(const std::string& name) const {
  try {
    return impl_->peers.find(name);
  } catch (const NotFoundError&) {
    if (!impl_->membership || !impl_->membership->was_evicted()) throw;
    throw ConnectionError(fmt::format(
        "rpc agent \"{}\": worker \"{}\" cannot be called: this worker \"{}\" was evicted "
        "from the dynamic group ({})",
        impl_->name, name, impl_->name, impl_->membership->evicted()));
  }
}

WorkerInfo PipeAgent::worker(int id) const { return impl_->peers.find(id); }

// Static: every worker of the group. Dynamic: the members now.
std::vector<WorkerInfo> PipeAgent::workers() const { return impl_->peers.workers(); }

// A static group never reports changes: the listener is not kept.
void PipeAgent::set_membership_listener(rpc::MembershipListener listener) {
  if (impl_->membership) impl_->membership->set_listener(std::move(listener));
}

void PipeAgent::join(Timeout timeout) {
  Impl& s = *impl_;
  if (s.dynamic) {
    s.membership->leave(timeout);
    return;
  }
  // Every join of the group gets its own keys: all workers join as often.
  rpc::QuietCalls local(s.calls);
  rendezvous::QuietGroup group;
  group.calls = &local;
  group.store = s.store.get();
  group.prefix = rendezvous::quiet_rounds("", s.join_generation++);
  group.rank = s.rank;
  for (int r = 0; r < s.capacity; ++r) group.names.push_back(s.peers.name_of(r));
  group.gone = [&s](int r) { return s.peers.gone(r); };
  group.timeout = timeout;
  group.who = fmt::format("join on rpc worker \"{}\"", s.name);
  rendezvous::wait_for_quiet_group(group);
}

void PipeAgent::shutdown() {
  if (!impl_ || impl_->shut_down.exchange(true)) return;
  Impl& s = *impl_;
  // The watcher first: it drops peers and fails calls.
  if (s.membership) s.membership->stop();
  const std::vector<std::shared_ptr<transport::Connection>> connections = s.peers.stop();
  s.calls.close();
  for (auto& connection : connections) {
    connection->enqueue_control(wire::FrameKind::kGoodbye);
    connection->close_after_flush();
  }
  // Give the goodbyes a moment to go out (a peer that stopped reading
  // cannot hold shutdown up for longer).
  const auto flush_deadline = Clock::now() + std::chrono::seconds(1);
  for (auto& connection : connections) connection->wait_closed(flush_deadline);
  s.transport->close();
  pool()->shutdown();
  for (auto& connection : connections) connection->close_now();
  s.transport->join();
}

std::string PipeAgent::listen_address() const { return impl_->transport->address(); }
int PipeAgent::listen_port() const { return impl_->transport->port(); }
rpc::DeviceMaps PipeAgent::reverse_device_maps() const { return impl_->peers.reverse_maps(); }
std::vector<Device> PipeAgent::devices() const { return impl_->peers.devices(); }

}  // namespace switchboard::agents::pipe
