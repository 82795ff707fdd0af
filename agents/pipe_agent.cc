#include "agents/pipe_agent.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "agents/host_buffer_cache.h"
#include "agents/pipe_agent_impl.h"
#include "agents/pipe_connection.h"
#include "agents/pipe_info.h"
#include "collective/gloo_process_group.h"
#include "common/check.h"
#include "common/error.h"
#include "rpc/remote_error.h"
#include "store/prefix_store.h"
#include "store/store.h"

namespace switchboard::agents {

namespace {

// A self-send's message with its own copies of the tensors, each on
// devices[i] (the device map's target) or, when `devices` is empty, on the
// CPU.
Message copy_tensors(Message m, const std::vector<Device>& devices) {
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    m.tensors[i] = m.tensors[i].to(devices.empty() ? Device::cpu() : devices[i]);
  }
  return m;
}

// Replaces every CUDA tensor of `m` with a CPU copy, which is what travels
// (the frame's descriptors name the device the receiver puts it on), and
// every non-contiguous CPU tensor with a contiguous copy. A
// tensor that cannot be copied (no CUDA runtime linked, not contiguous)
// throws std::invalid_argument naming the target worker `to`.
void stage_on_cpu(Message& m, const std::string& to) {
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    Tensor& t = m.tensors[i];
    if (t.device().is_cpu()) {
      if (!t.is_contiguous()) t = t.clone();  // contiguous is what travels
      continue;
    }
    try {
      t = t.to(Device::cpu());
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(
          fmt::format("rpc to \"{}\": tensor {} cannot be staged: {}", to, i, e.what()));
    }
  }
}

}  // namespace

// --------------------------------------------------------------- Impl impl

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
      work(asio::make_work_guard(io)),
      timer_strand(asio::make_strand(io)),
      acceptor(timer_strand),
      heartbeat_timer(timer_strand),
      calls(this->name, owner.pool()) {}

PipeAgent::Impl::~Impl() {
  work.reset();
  io.stop();
  for (auto& thread : io_threads) {
    if (thread.joinable()) thread.join();
  }
}

bool PipeAgent::Impl::on_frame(const std::shared_ptr<Connection>& connection,
                               pipe::InboundFrame frame) {
  if (frame.kind == pipe::FrameKind::kHello) return on_hello(connection, frame.message);
  const int from = connection->peer;
  if (from < 0) {
    connection_failed(connection, "protocol error: a frame before the hello");
    return false;
  }
  switch (frame.kind) {
    case pipe::FrameKind::kHeartbeat:
      return true;
    case pipe::FrameKind::kGoodbye: {
      bool was_up = false;
      {
        std::lock_guard lock(mu);
        was_up = peers[from].state == PeerState::kUp;
        if (was_up) {
          peers[from].state = PeerState::kLeft;
          peers[from].reason = "left the group";
        }
      }
      if (was_up) publish_change(rpc::MembershipChange::Kind::kLeft, peers[from].info);
      return true;
    }
    case pipe::FrameKind::kRequest:
      accept_request(from, std::move(frame));
      return true;
    case pipe::FrameKind::kResponse:
    case pipe::FrameKind::kError:
      complete(std::move(frame));
      return true;
    default:
      connection_failed(connection, "protocol error: unexpected frame kind");
      return false;
  }
}

// Hands `request` to the call table, which runs the handler on the pool
// (after start(): peers may call as soon as their own constructor
// returned); the reply goes back to `from`.
void PipeAgent::Impl::accept_request(int from, pipe::InboundFrame request) {
  rpc::CallTable::Request r;
  r.message = std::move(request.message);
  r.from = peers[from].info;
  std::weak_ptr<Impl> weak = weak_from_this();
  const bool placed = std::any_of(request.devices.begin(), request.devices.end(),
                                  [](const Device& d) { return !d.is_cpu(); });
  if (placed) {
    r.prepare = [weak, from, devices = std::move(request.devices)](Message& m) {
      if (auto self = weak.lock()) self->place_tensors(m, devices, from);
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
  try {
    wire = wire_devices(reply, to, /*reply=*/true);
    if (to == rank) {
      reply = copy_tensors(std::move(reply), wire);
    } else {
      stage_on_cpu(reply, name_of(to));
    }
  } catch (...) {
    replace_with_error();
    wire.clear();
  }
  if (to == rank) {
    complete_now(std::move(reply));
    return;
  }
  std::shared_ptr<Connection> connection;
  {
    std::lock_guard lock(mu);
    connection = peers[to].connection;
  }
  const bool alone = calls.load().handling <= 1;  // the only handler: send from here
  if (!connection || !connection->enqueue(reply, wire, alone)) {
    spdlog::debug("rpc agent \"{}\": reply {} to \"{}\" dropped: no connection", name,
                  reply.id, name_of(to));
  }
}

// A response whose tensors go to CUDA devices is placed there on the pool
// (the copies must not hold up this connection's reads); any other
// completes here.
void PipeAgent::Impl::complete(pipe::InboundFrame response) {
  const bool placed = std::any_of(response.devices.begin(), response.devices.end(),
                                  [](const Device& d) { return !d.is_cpu(); });
  if (!placed) {
    complete_now(std::move(response.message));
    return;
  }
  auto place = [self = shared_from_this(), response = std::move(response)]() mutable {
    const uint64_t id = response.message.id;
    const std::optional<int> from = self->calls.destination(id);
    if (!from) return;  // timed out or cancelled
    try {
      self->place_tensors(response.message, response.devices, *from);
    } catch (...) {
      self->calls.fail(id, std::current_exception());
      return;
    }
    self->complete_now(std::move(response.message));
  };
  try {
    owner.pool()->post(std::move(place));
  } catch (const std::exception& e) {  // the pool is shutting down
    spdlog::debug("rpc agent \"{}\": response dropped: {}", name, e.what());
  }
}

// Moves each tensor of `m` (received on the CPU) to the device its
// descriptor named. Throws std::invalid_argument naming the sender, the
// tensor and the device when this worker cannot hold it there.
void PipeAgent::Impl::place_tensors(Message& m, const std::vector<Device>& wire,
                                    int from) const {
  int count = -1;
  for (size_t i = 0; i < wire.size() && i < m.tensors.size(); ++i) {
    if (wire[i].is_cpu()) continue;
    if (count < 0) count = device_count;
    SB_REQUIRE(wire[i].index < count,
               "rpc agent \"{}\": tensor {} from \"{}\" is for {}, but this worker has {} "
               "CUDA device(s){}",
               name, i, name_of(from), wire[i].str(), count,
               count == 0 ? " (a build without //collective:cuda_allocator, or no GPU)" : "");
    m.tensors[i] = m.tensors[i].to(wire[i]);
  }
}

void PipeAgent::Impl::complete_now(Message response) {
  const uint64_t id = response.id;
  calls.complete(id, std::move(response));  // false: timed out or cancelled
}

void PipeAgent::Impl::connection_failed(const std::shared_ptr<Connection>& connection,
                                        const std::string& reason) {
  if (connection->failed.exchange(true)) return;  // already reported
  connection->close_now();
  const int peer = connection->peer;
  bool was_current = false;
  bool quiet = false;
  bool was_up = false;
  std::string why;
  {
    std::lock_guard lock(mu);
    std::erase(unidentified, connection);
    quiet = stopping;
    if (peer >= 0 && peers[peer].connection == connection) {
      was_current = true;
      was_up = peers[peer].state == PeerState::kUp;
      if (peers[peer].state == PeerState::kLeft) {
        quiet = true;
      } else if (peers[peer].state != PeerState::kLost) {
        peers[peer].state = PeerState::kLost;
        peers[peer].reason = fmt::format("lost its connection ({})", reason);
      }
      why = peers[peer].reason;
    }
  }
  if (!was_current) {
    if (!quiet) spdlog::warn("rpc agent \"{}\": closed a connection: {}", name, reason);
    return;
  }
  if (was_up && !quiet) publish_change(rpc::MembershipChange::Kind::kLeft, peers[peer].info);
  if (quiet) {
    spdlog::debug("rpc agent \"{}\": worker \"{}\" {}", name, name_of(peer), why);
  } else {
    spdlog::warn("rpc agent \"{}\": worker \"{}\" {}", name, name_of(peer), why);
  }
  const std::string peer_name = name_of(peer);
  calls.fail_if([peer](const rpc::CallTable::Call& c) { return c.dst == peer; },
                [&](const rpc::CallTable::Call& c) {
                  return std::make_exception_ptr(ConnectionError(
                      fmt::format("{}: worker \"{}\" {}", rpc::call_prefix(peer_name, c.function),
                                  peer_name, why)));
                });
}

std::vector<Device> PipeAgent::Impl::wire_devices(const Message& m, int to,
                                                  bool reply) const {
  std::vector<Device> wire;
  bool any_cuda = false;
  for (const Tensor& t : m.tensors) any_cuda = any_cuda || t.device().is_cuda();
  if (!any_cuda) return wire;
  rpc::DeviceMaps reverse;
  if (reply) {
    std::lock_guard lock(mu);  // a dynamic group changes it as workers join
    reverse = reverse_maps;
  }
  const rpc::DeviceMaps& maps = reply ? reverse : options.device_maps;
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    wire.push_back(rpc::target_device(maps, name_of(to), m.tensors[i].device(), i));
  }
  return wire;
}

void PipeAgent::Impl::heartbeat() {
  const int64_t now = now_ns();
  const int64_t limit =
      std::chrono::duration_cast<std::chrono::nanoseconds>(options.heartbeat_timeout)
          .count();
  std::vector<std::shared_ptr<Connection>> up;
  std::vector<std::shared_ptr<Connection>> anonymous;
  {
    std::lock_guard lock(mu);
    if (stopping) return;
    for (const Peer& p : peers) {
      if (p.connection && p.state == PeerState::kUp) up.push_back(p.connection);
    }
    anonymous = unidentified;
  }
  // A connection that never said hello gets no heartbeats, only the limit.
  for (const auto& connection : anonymous) {
    if (limit > 0 && now - connection->last_recv_ns.load() > limit) {
      connection_failed(connection,
                        fmt::format("no hello within {} ms", options.heartbeat_timeout.count()));
    }
  }
  for (const auto& connection : up) {
    if (limit > 0 && now - connection->last_recv_ns.load() > limit) {
      connection_failed(connection,
                        fmt::format("silent for over {} ms (heartbeat timeout)",
                                    options.heartbeat_timeout.count()));
    } else {
      connection->enqueue_control(pipe::FrameKind::kHeartbeat);
    }
  }
  heartbeat_timer.expires_after(options.heartbeat_interval);
  heartbeat_timer.async_wait([self = shared_from_this()](const boost::system::error_code& e) {
    if (!e) self->heartbeat();
  });
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
  auto prefixed = std::make_shared<PrefixStore>("pipe", std::move(store));
  impl_ = std::make_shared<Impl>(*this, prefixed, std::move(name), rank, world_size,
                                 options);
  try {
    if (impl_->dynamic) {
      impl_->join_group();
    } else {
      impl_->rendezvous();
    }
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
  impl_->calls.start(std::move(handler));
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
    if (dst != s.rank) stage_on_cpu(request, to.name);
    rpc::CallTable::Added call = s.calls.add({dst, to.name, request.function, timeout});
    id = call.id;
    future = std::move(call.future);
    request.id = id;
    // The call is in the table before the peer's state is read:
    // connection_failed() marks the peer down first and then fails its
    // calls, so this call is failed by one or the other.
    std::shared_ptr<Connection> connection;
    {
      std::lock_guard lock(s.mu);
      const auto& peer = s.peers[dst];
      if (peer.state != Impl::PeerState::kUp) {
        throw ConnectionError(fmt::format("{}: worker \"{}\" {}",
                                          rpc::call_prefix(to.name, request.function),
                                          to.name, peer.reason));
      }
      connection = peer.connection;
    }
    const bool alone = call.in_flight <= 1;  // the only call in flight: send from here
    if (dst == s.rank) {
      pipe::InboundFrame self_request;
      self_request.message = copy_tensors(std::move(request), wire);
      s.accept_request(s.rank, std::move(self_request));
    } else if (!connection->enqueue(request, wire, alone)) {
      s.calls.fail(id, std::make_exception_ptr(ConnectionError(fmt::format(
                           "{}: the connection to worker \"{}\" is closed",
                           rpc::call_prefix(to.name, request.function), to.name))));
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
WorkerInfo PipeAgent::worker(const std::string& name) const {
  const Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  const Impl::Peer* found = nullptr;
  for (const auto& peer : s.peers) {
    if (peer.state == Impl::PeerState::kAbsent || peer.info.name != name) continue;
    if (found == nullptr || peer.state == Impl::PeerState::kUp) found = &peer;
  }
  if (found == nullptr) {
    throw NotFoundError(fmt::format("rpc agent \"{}\": no worker named \"{}\"{}", s.name,
                                    name, s.dynamic ? " in this dynamic group" : ""));
  }
  return found->info;
}

WorkerInfo PipeAgent::worker(int id) const {
  const Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  if (id < 0 || id >= s.capacity || s.peers[id].state == Impl::PeerState::kAbsent) {
    throw NotFoundError(fmt::format("rpc agent \"{}\": no worker with id {}", s.name, id));
  }
  return s.peers[id].info;
}

// Static: every worker of the group. Dynamic: the members now.
std::vector<WorkerInfo> PipeAgent::workers() const {
  const Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  std::vector<WorkerInfo> out;
  for (const auto& peer : s.peers) {
    if (!s.dynamic || peer.state == Impl::PeerState::kUp) out.push_back(peer.info);
  }
  return out;
}

void PipeAgent::set_membership_listener(rpc::MembershipListener listener) {
  std::lock_guard lock(impl_->mu);
  impl_->listener = std::move(listener);
}

void PipeAgent::join(Timeout timeout) {
  Impl& s = *impl_;
  if (s.dynamic) {
    s.leave_group(timeout);
    return;
  }
  const auto deadline = Clock::now() + timeout;
  switch (s.calls.wait_idle(timeout.count() > 0 ? std::optional(deadline) : std::nullopt)) {
    case rpc::CallTable::Idle::kIdle:
      break;
    case rpc::CallTable::Idle::kClosed:
      throw Error(ErrorCode::kCancelled,
                  fmt::format("join: rpc agent \"{}\" shut down", s.name));
    case rpc::CallTable::Idle::kTimedOut: {
      const auto load = s.calls.load();
      throw TimeoutError(fmt::format(
          "join on rpc agent \"{}\": {} call(s) still in flight and {} request(s) being "
          "handled after {} ms",
          s.name, load.calls_in_flight, load.handling, timeout.count()));
    }
  }
  collective::Work barrier = s.gloo->barrier();
  if (timeout.count() > 0) {
    const auto left = std::max(Timeout(1), std::chrono::duration_cast<Timeout>(
                                               deadline - Clock::now()));
    barrier.wait(left);
  } else {
    barrier.wait();
  }
}

void PipeAgent::shutdown() {
  if (!impl_ || impl_->shut_down.exchange(true)) return;
  Impl& s = *impl_;
  std::vector<std::shared_ptr<Connection>> connections;
  {
    std::lock_guard lock(s.mu);
    s.stopping = true;
    for (auto& peer : s.peers) {
      if (peer.connection) connections.push_back(peer.connection);
    }
    for (auto& c : s.unidentified) connections.push_back(c);
    s.cv.notify_all();
  }
  s.calls.close();
  for (auto& connection : connections) {
    connection->enqueue_control(pipe::FrameKind::kGoodbye);
    connection->close_after_flush();
  }
  // Give the goodbyes a moment to go out (a peer that stopped reading
  // cannot hold shutdown up for longer).
  const auto flush_deadline = Clock::now() + std::chrono::seconds(1);
  for (auto& connection : connections) connection->wait_closed(flush_deadline);
  asio::post(s.timer_strand, [impl = impl_] {
    boost::system::error_code ignored;
    impl->acceptor.close(ignored);
    impl->heartbeat_timer.cancel();
  });
  pool()->shutdown();
  s.work.reset();
  for (auto& connection : connections) connection->close_now();
  for (auto& thread : s.io_threads) {
    if (thread.joinable()) thread.join();
  }
  if (s.gloo) s.gloo.reset();
}

std::string PipeAgent::listen_address() const { return impl_->address; }
int PipeAgent::listen_port() const { return impl_->port; }
rpc::DeviceMaps PipeAgent::reverse_device_maps() const {
  std::lock_guard lock(impl_->mu);
  return impl_->reverse_maps;
}

std::vector<Device> PipeAgent::devices() const {
  std::lock_guard lock(impl_->mu);
  return impl_->devices;
}

}  // namespace switchboard::agents
