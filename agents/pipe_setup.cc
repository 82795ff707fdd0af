// PipeAgent's connections and the static group's rendezvous: listening,
// the all-gather and validation over Gloo, connecting and the hello that
// identifies each connection (a static hello, or a dynamic group's join
// and welcome, handed to pipe_dynamic.cc). See agents/pipe_agent.h.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/post.hpp>

#include "agents/pipe_address.h"
#include "agents/pipe_agent_impl.h"
#include "common/check.h"
#include "common/error.h"

namespace switchboard::agents {

void PipeAgent::Impl::listen() {
  address = resolve_listen_address(options.listen_address);
  boost::system::error_code error;
  const auto ip = asio::ip::make_address(address, error);
  SB_REQUIRE(!error, "PIPE agent \"{}\": cannot parse listen address \"{}\": {}", name,
             address, error.message());
  const tcp::endpoint endpoint(ip, 0);
  acceptor.open(endpoint.protocol());
  acceptor.set_option(tcp::acceptor::reuse_address(true));
  acceptor.bind(endpoint, error);
  if (error) {
    throw ConnectionError(fmt::format("PIPE agent \"{}\": cannot listen on {}: {}", name,
                                      address, error.message()));
  }
  acceptor.listen(asio::socket_base::max_listen_connections);
  port = acceptor.local_endpoint().port();
  start_accept();
  for (size_t i = 0; i < std::max<size_t>(1, options.num_io_threads); ++i) {
    io_threads.emplace_back([this] { io.run(); });
  }
  device_count = options.device_count >= 0 ? options.device_count
                                           : registered_cuda_device_count();
  peers.resize(capacity);
  for (Peer& p : peers) p.state = dynamic ? PeerState::kAbsent : PeerState::kConnecting;
}

WorkerAnnouncement PipeAgent::Impl::my_announcement() {
  WorkerAnnouncement mine;
  mine.name = name;
  mine.address = address;
  mine.port = port;
  mine.device_count = device_count;
  mine.device_maps = options.device_maps;
  mine.devices = options.devices;
  return mine;
}

void PipeAgent::Impl::rendezvous() {
  listen();
  collective::GlooOptions gloo_options;
  gloo_options.group_name = "pipe";
  gloo_options.timeout = options.rpc_timeout.count() > 0 ? options.rpc_timeout
                                                          : collective::ProcessGroup::kDefaultTimeout;
  gloo_options.hostname = address;
  gloo = std::make_unique<collective::GlooProcessGroup>(*store, rank, capacity, gloo_options);
  const std::vector<WorkerAnnouncement> all =
      allgather_announcements(*gloo, my_announcement(), options.rpc_timeout);

  check_unique_names(all);
  std::vector<rpc::WorkerDevices> gathered;
  for (const auto& worker : all) {
    gathered.push_back({worker.name, worker.device_count, worker.device_maps,
                        worker.devices});
  }
  rpc::validate_device_maps(gathered, /*static_group=*/true);
  reverse_maps = rpc::reverse_device_maps(name, gathered);
  devices = rpc::default_devices(options.devices, options.device_maps, reverse_maps);

  for (int r = 0; r < capacity; ++r) {
    peers[r].info = WorkerInfo{all[r].name, r};
    peers[r].announcement = all[r];
    peers[r].address = all[r].address;
    peers[r].port = all[r].port;
  }
  std::vector<std::pair<std::shared_ptr<Connection>, Message>> hellos;
  {
    std::lock_guard lock(mu);
    peers[rank].state = PeerState::kUp;
    peers_ready = true;
    hellos.swap(early_hellos);
  }
  for (auto& early : hellos) {
    asio::post(early.first->strand,
               [self = shared_from_this(), connection = early.first, hello = early.second] {
                 if (self->on_hello(connection, hello)) connection->resume_reading();
               });
  }
  Hello hello;
  hello.rank = rank;
  hello.name = name;
  for (int r = 0; r < rank; ++r) connect_to(r, hello);
  wait_connected();
  start_heartbeat();
}

void PipeAgent::Impl::start_heartbeat() {
  asio::post(timer_strand, [self = shared_from_this()] {
    self->heartbeat_timer.expires_after(self->options.heartbeat_interval);
    self->heartbeat_timer.async_wait([self](const boost::system::error_code& e) {
      if (!e) self->heartbeat();
    });
  });
}

void PipeAgent::Impl::start_accept() {
  acceptor.async_accept([self = shared_from_this()](const boost::system::error_code& error,
                                                     tcp::socket socket) {
    if (error) {
      if (error != asio::error::operation_aborted) {
        spdlog::warn("rpc agent \"{}\": accept failed: {}", self->name, error.message());
      }
      if (!self->acceptor.is_open()) return;
    } else {
      self->on_accept(std::move(socket));
    }
    self->start_accept();
  });
}

void PipeAgent::Impl::on_accept(tcp::socket socket) {
  auto connection = std::make_shared<Connection>(*this, std::move(socket), options.limits,
                                                 receive_allocator());
  {
    std::lock_guard lock(mu);
    if (stopping) return;
    unidentified.push_back(connection);
  }
  connection->start_reading();
}

void PipeAgent::Impl::connect_to(int peer, const Hello& hello) {
  tcp::socket socket(io);
  boost::system::error_code error;
  const tcp::endpoint endpoint(asio::ip::make_address(peers[peer].address, error),
                               static_cast<uint16_t>(peers[peer].port));
  if (!error) socket.connect(endpoint, error);
  if (error) {
    throw ConnectionError(fmt::format(
        "PIPE agent \"{}\": cannot connect to worker \"{}\" at {}:{}: {}", name,
        name_of(peer), peers[peer].address, peers[peer].port, error.message()));
  }
  auto connection = std::make_shared<Connection>(*this, std::move(socket), options.limits,
                                                 receive_allocator());
  connection->peer = peer;
  const std::vector<uint8_t> bytes = encode_hello(hello);
  connection->enqueue_control(pipe::FrameKind::kHello, bytes.data(), bytes.size());
  register_connection(peer, connection);
  connection->start_reading();
}

void PipeAgent::Impl::register_connection(int peer,
                                          const std::shared_ptr<Connection>& connection) {
  std::lock_guard lock(mu);
  peers[peer].connection = connection;
  peers[peer].state = PeerState::kUp;
  cv.notify_all();
}

void PipeAgent::Impl::wait_connected() {
  std::unique_lock lock(mu);
  auto all_up = [&] {
    return std::all_of(peers.begin(), peers.end(),
                       [](const Peer& p) { return p.state == PeerState::kUp; });
  };
  bool done = true;
  if (options.rpc_timeout.count() > 0) {
    done = cv.wait_for(lock, options.rpc_timeout, all_up);
  } else {
    cv.wait(lock, all_up);
  }
  if (!done) {
    std::vector<std::string> missing;
    for (const Peer& p : peers) {
      if (p.state != PeerState::kUp) missing.push_back(fmt::format("\"{}\"", p.info.name));
    }
    throw TimeoutError(fmt::format(
        "PIPE agent \"{}\": no connection from worker(s) {} after {} ms", name,
        fmt::join(missing, ", "), options.rpc_timeout.count()));
  }
}

bool PipeAgent::Impl::on_hello(const std::shared_ptr<Connection>& connection,
                               const Message& frame) {
  {
    std::lock_guard lock(mu);
    if (!peers_ready) {
      early_hellos.emplace_back(connection, frame);
      return false;  // resumed by rendezvous()
    }
  }
  Hello hello;
  try {
    hello = decode_hello(frame.payload);
  } catch (const std::exception& e) {
    connection_failed(connection, fmt::format("protocol error: {}", e.what()));
    return false;
  }
  std::string problem;
  switch (hello.kind) {
    case Hello::Kind::kWelcome:
      if (!dynamic || connection->peer < 0 || hello.rank != connection->peer) {
        problem = fmt::format("an unexpected welcome from rank {}", hello.rank);
        break;
      }
      on_welcome(connection, hello);
      return true;
    case Hello::Kind::kJoin:
      if (!dynamic) {
        problem = fmt::format(
            "worker \"{}\" (rank {}) tried to join as a member of a dynamic group, but "
            "this is a static group (world_size {})",
            hello.name, hello.rank, capacity);
        break;
      }
      if (connection->peer >= 0) {
        problem = "a second hello";
        break;
      }
      return on_join_hello(connection, hello);
    case Hello::Kind::kStatic:
      break;
  }
  const int peer = hello.rank;
  if (!problem.empty()) {
  } else if (dynamic) {
    problem = fmt::format(
        "worker \"{}\" (rank {}) said hello as a member of a static group, but this is a "
        "dynamic group",
        hello.name, peer);
  } else if (connection->peer >= 0) {
    problem = "a second hello";
  } else if (peer <= rank || peer >= capacity) {
    problem = fmt::format("hello from rank {} (only ranks {}..{} connect here)", peer,
                          rank + 1, capacity - 1);
  } else if (hello.name != peers[peer].info.name) {
    problem = fmt::format("hello from rank {} named \"{}\", expected \"{}\"", peer,
                          hello.name, peers[peer].info.name);
  } else {
    std::lock_guard lock(mu);
    if (peers[peer].connection) problem = fmt::format("a second connection from rank {}", peer);
  }
  if (!problem.empty()) {
    connection_failed(connection, "protocol error: " + problem);
    return false;
  }
  connection->peer = peer;
  {
    std::lock_guard lock(mu);
    std::erase(unidentified, connection);
  }
  register_connection(peer, connection);
  return true;
}

}  // namespace switchboard::agents
