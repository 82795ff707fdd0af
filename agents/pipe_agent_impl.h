// PipeAgent's private state, shared by pipe_agent.cc (static groups, calls,
// failures) and pipe_dynamic.cc (dynamic membership). Internal to
// //agents:pipe_agent; see agents/pipe_agent.h for the behaviour.
#pragma once

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "agents/host_buffer_cache.h"
#include "agents/pipe_agent.h"
#include "agents/pipe_connection.h"
#include "agents/pipe_info.h"
#include "collective/gloo_process_group.h"
#include "rpc/call_table.h"

namespace switchboard::agents {

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using rpc::Future;
using rpc::Message;
using rpc::MessageType;
using rpc::Promise;
using rpc::WorkerInfo;
using Timeout = std::chrono::milliseconds;

struct PipeAgent::Impl : ConnectionEvents, std::enable_shared_from_this<PipeAgent::Impl> {
  // kAbsent: a dynamic group's rank no worker has taken (yet).
  enum class PeerState { kAbsent, kConnecting, kUp, kLost, kLeft };

  // info and announcement are written once, before the peer is first
  // published under `mu` (at init, or when it joins a dynamic group); ranks
  // of a dynamic group are never reused, so they never change afterwards.
  struct Peer {
    WorkerInfo info;
    WorkerAnnouncement announcement;
    std::string address;
    int port = 0;
    std::shared_ptr<Connection> connection;  // GUARDED_BY(mu)
    PeerState state = PeerState::kConnecting;  // GUARDED_BY(mu)
    std::string reason;                        // GUARDED_BY(mu): why it is down
  };

  Impl(PipeAgent& owner, std::shared_ptr<Store> store, std::string name, int rank,
       std::optional<int> world_size, const PipeAgentOptions& options);
  ~Impl();

  void listen();
  WorkerAnnouncement my_announcement();
  void rendezvous();
  // Dynamic groups (pipe_dynamic.cc).
  void join_group();
  void leave_group(Timeout timeout);
  bool on_join_hello(const std::shared_ptr<Connection>& connection, const Hello& hello);
  void on_welcome(const std::shared_ptr<Connection>& connection, const Hello& hello);
  void publish_change(rpc::MembershipChange::Kind kind, const WorkerInfo& worker);
  void start_heartbeat();
  void start_accept();
  void on_accept(tcp::socket socket);
  void connect_to(int peer, const Hello& hello);
  void register_connection(int peer, const std::shared_ptr<Connection>& connection);
  void wait_connected();

  bool on_frame(const std::shared_ptr<Connection>& connection,
                pipe::InboundFrame frame) override;
  bool on_hello(const std::shared_ptr<Connection>& connection, const Message& frame);
  void connection_failed(const std::shared_ptr<Connection>& connection,
                         const std::string& reason) override;
  void accept_request(int from, pipe::InboundFrame request);

  void deliver_reply(int to, Message reply);
  void complete(pipe::InboundFrame response);
  void complete_now(Message response);
  void place_tensors(Message& m, const std::vector<Device>& wire, int from) const;

  void heartbeat();

  std::vector<Device> wire_devices(const Message& m, int to, bool reply) const;
  // Received tensors: large ones from `buffers`.
  pipe::FrameReader::Allocate receive_allocator() const {
    return [buffers = buffers](DType dtype, const Tensor::Shape& shape, Device) {
      return buffers->empty(shape, dtype);
    };
  }
  std::string name_of(int rank) const { return peers[rank].info.name; }

  PipeAgent& owner;
  std::shared_ptr<Store> store;
  const std::string name;
  const int rank;
  const bool dynamic;
  // Static: the world size. Dynamic: the ranks a worker may take, [0, capacity).
  const int capacity;
  const PipeAgentOptions options;

  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work;
  std::vector<std::thread> io_threads;
  // Timers and the acceptor run on this strand.
  asio::strand<asio::io_context::executor_type> timer_strand;
  tcp::acceptor acceptor;
  std::string address;
  int port = 0;
  asio::steady_timer heartbeat_timer;

  std::unique_ptr<collective::GlooProcessGroup> gloo;
  std::vector<Peer> peers;
  rpc::DeviceMaps reverse_maps;
  std::vector<Device> devices;
  const std::shared_ptr<HostBufferCache> buffers = HostBufferCache::create();
  // CUDA devices the maps were validated against (the option, or what the
  // registered CUDA runtime sees).
  int device_count = 0;

  mutable std::mutex mu;
  std::condition_variable cv;
  std::vector<std::shared_ptr<Connection>> unidentified;         // GUARDED_BY(mu)
  bool stopping = false;                                         // GUARDED_BY(mu)

  // Hellos that came before `peers` was filled in (a faster peer finished
  // the all-gather first); handled once it is.
  bool peers_ready = false;                                      // GUARDED_BY(mu)
  std::vector<std::pair<std::shared_ptr<Connection>, Message>> early_hellos;  // GUARDED_BY(mu)
  // Dynamic groups: the joiner's answers from the members (rank → empty
  // when accepted, the reason when refused), and the membership listener.
  std::map<int, std::string> welcomes;                           // GUARDED_BY(mu)
  rpc::MembershipListener listener;                              // GUARDED_BY(mu)
  bool left = false;                                             // GUARDED_BY(mu)
  std::atomic<bool> shut_down{false};
  // Calls made and requests served: ids, deadlines, handlers, draining.
  // Declared last: destroyed first, before the state its callbacks use.
  rpc::CallTable calls;
};


}  // namespace switchboard::agents
