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
#include "agents/pipe_address.h"
#include "agents/pipe_info.h"
#include "collective/gloo_process_group.h"
#include "common/check.h"
#include "common/error.h"
#include "rpc/remote_error.h"
#include "store/prefix_store.h"
#include "store/store.h"

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

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             Clock::now().time_since_epoch())
      .count();
}

// A deep copy of every tensor (self-sends: the callee must not alias the
// caller's memory, as with a remote worker).
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
// (the frame's descriptors name the device the receiver puts it on). A
// tensor that cannot be copied (no CUDA runtime linked, not contiguous)
// throws std::invalid_argument naming the target worker `to`.
void stage_on_cpu(Message& m, const std::string& to) {
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    Tensor& t = m.tensors[i];
    if (t.device().is_cpu()) continue;
    try {
      t = t.to(Device::cpu());
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(
          fmt::format("rpc to \"{}\": tensor {} cannot be staged: {}", to, i, e.what()));
    }
  }
}

}  // namespace

// ------------------------------------------------------------- Connection

struct Connection;

// What a connection reports to its agent (on the connection's strand).
class ConnectionEvents {
 public:
  virtual ~ConnectionEvents() = default;
  // A complete frame; false stops reading the connection.
  virtual bool on_frame(const std::shared_ptr<Connection>& connection,
                        pipe::InboundFrame frame) = 0;
  virtual void connection_failed(const std::shared_ptr<Connection>& connection,
                                 const std::string& reason) = 0;
};

// One TCP connection to one peer, used in both directions. Reads and
// writes run on the connection's strand; enqueue() may be called from any
// thread.
struct Connection : std::enable_shared_from_this<Connection> {
  Connection(ConnectionEvents& agent, tcp::socket socket, const pipe::FrameLimits& limits,
             pipe::FrameReader::Allocate allocate)
      : agent(agent),
        strand(asio::make_strand(socket.get_executor())),
        socket(std::move(socket)),
        reader(limits, std::move(allocate)) {
    boost::system::error_code ignored;
    this->socket.set_option(tcp::no_delay(true), ignored);
    last_recv_ns = now_ns();
  }

  // Queues one frame (and its tensors' bytes); false when closed. With
  // `send_now` and no write in flight, the calling thread sends what the
  // socket takes at once (lowest latency); otherwise the I/O thread sends
  // it, coalesced with whatever else is queued by then (fewer system calls
  // and packets under load).
  bool enqueue(const Message& m, const std::vector<Device>& devices, bool send_now);
  bool enqueue_control(pipe::FrameKind kind, const uint8_t* payload = nullptr,
                       size_t size = 0);
  void start_reading();
  // Continues after on_frame() returned false: the frames already parsed,
  // then reading.
  void resume_reading();
  // Closes once everything queued went out (or at once on error).
  void close_after_flush();
  // Waits until close_after_flush() finished (or the connection failed);
  // false at `deadline`.
  bool wait_closed(Clock::time_point deadline);
  void close_now();

  ConnectionEvents& agent;
  asio::strand<asio::any_io_executor> strand;
  tcp::socket socket;
  pipe::FrameReader reader;           // strand only
  std::atomic<int> peer{-1};          // set at hello
  std::atomic<bool> failed{false};    // connection_failed() ran
  std::atomic<int64_t> last_recv_ns;  // for the heartbeat check

 private:
  void kick_locked();
  void write_some();
  void read_some();
  // Hands parsed frames to the agent; false when it stopped reading.
  bool drain();

  std::mutex mu_;
  // A tensor whose bytes follow byte `offset` of the queued frame bytes;
  // `sent` of them already went out (a partial inline send).
  struct QueuedTensor {
    size_t offset = 0;
    Tensor tensor;
    size_t sent = 0;
  };
  // Calls emit(data, size) for each piece of `bytes` and `tensors` in wire
  // order, skipping empty pieces and bytes already sent.
  template <typename Emit>
  static void for_each_piece(const std::vector<uint8_t>& bytes,
                             const std::vector<QueuedTensor>& tensors, Emit&& emit);
  // Sends what is queued now, from the calling thread, without blocking
  // (MSG_DONTWAIT); keeps what the socket did not take. Only while no
  // write is in flight.
  void send_inline_locked();
  // Drops the first `n` bytes of the queued stream.
  void consume_locked(size_t n);

  std::vector<uint8_t> queued_;                         // GUARDED_BY(mu_)
  std::vector<QueuedTensor> queued_tensors_;            // GUARDED_BY(mu_)
  bool writing_ = false;                                // GUARDED_BY(mu_)
  bool closing_ = false;                                // GUARDED_BY(mu_)
  bool closed_ = false;                                 // GUARDED_BY(mu_)
  std::condition_variable closed_cv_;
  // The write in progress (strand only).
  std::vector<uint8_t> sending_;
  std::vector<QueuedTensor> sending_tensors_;
  std::vector<asio::const_buffer> buffers_;
};

// ------------------------------------------------------------------ Impl

struct PipeAgent::Impl : ConnectionEvents, std::enable_shared_from_this<PipeAgent::Impl> {
  enum class PeerState { kConnecting, kUp, kLost, kLeft };

  struct Pending {
    Promise<Message> promise;
    int dst = -1;
    std::string function;
    Timeout timeout{0};
    std::multimap<Clock::time_point, uint64_t>::iterator deadline;
    bool has_deadline = false;
  };

  struct Peer {
    WorkerInfo info;
    std::string address;
    int port = 0;
    std::shared_ptr<Connection> connection;  // GUARDED_BY(mu)
    PeerState state = PeerState::kConnecting;  // GUARDED_BY(mu)
    std::string reason;                        // GUARDED_BY(mu): why it is down
  };

  Impl(PipeAgent& owner, std::shared_ptr<Store> store, std::string name, int rank,
       int world_size, const PipeAgentOptions& options);
  ~Impl();

  void rendezvous();
  void start_accept();
  void on_accept(tcp::socket socket);
  void connect_to(int peer);
  void register_connection(int peer, const std::shared_ptr<Connection>& connection);
  void wait_connected();

  bool on_frame(const std::shared_ptr<Connection>& connection,
                pipe::InboundFrame frame) override;
  bool on_hello(const std::shared_ptr<Connection>& connection, const Message& hello);
  void connection_failed(const std::shared_ptr<Connection>& connection,
                         const std::string& reason) override;
  void accept_request(int from, pipe::InboundFrame request);
  void fail_one(uint64_t id, std::exception_ptr error);

  void serve(int from, pipe::InboundFrame request);
  void deliver_reply(int to, Message reply);
  void complete(pipe::InboundFrame response);
  void complete_now(Message response);
  void place_tensors(Message& m, const std::vector<Device>& wire, int from) const;
  void fail_pending_if(const std::function<bool(const Pending&)>& which,
                       const std::function<std::exception_ptr(const Pending&)>& error);

  void add_deadline_locked(uint64_t id, Pending& pending);
  void rearm_deadline_timer();
  void expire_deadlines();
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
  const int world_size;
  const PipeAgentOptions options;

  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work;
  std::vector<std::thread> io_threads;
  // Timers and the acceptor run on this strand.
  asio::strand<asio::io_context::executor_type> timer_strand;
  tcp::acceptor acceptor;
  std::string address;
  int port = 0;
  asio::steady_timer deadline_timer;
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
  std::unordered_map<uint64_t, Pending> pending;                // GUARDED_BY(mu)
  std::multimap<Clock::time_point, uint64_t> deadlines;          // GUARDED_BY(mu)
  Clock::time_point armed = Clock::time_point::max();            // GUARDED_BY(mu)
  std::vector<std::shared_ptr<Connection>> unidentified;         // GUARDED_BY(mu)
  int handlers_running = 0;                                      // GUARDED_BY(mu)
  bool stopping = false;                                         // GUARDED_BY(mu)

  std::vector<std::pair<int, pipe::InboundFrame>> early;         // GUARDED_BY(mu)
  // Hellos that came before `peers` was filled in (a faster peer finished
  // the all-gather first); handled once it is.
  bool peers_ready = false;                                      // GUARDED_BY(mu)
  std::vector<std::pair<std::shared_ptr<Connection>, Message>> early_hellos;  // GUARDED_BY(mu)
  std::atomic<uint64_t> next_id{1};
  RequestHandler handler;
  std::atomic<bool> started{false};  // written under mu
  std::atomic<bool> shut_down{false};
};

// --------------------------------------------------------- Connection impl

bool Connection::enqueue(const Message& m, const std::vector<Device>& devices,
                         bool send_now) {
  std::lock_guard lock(mu_);
  if (closed_ || closing_) return false;
  pipe::append_frame(queued_, m, devices);
  for (const Tensor& t : m.tensors) {
    if (t.nbytes() > 0) queued_tensors_.push_back({queued_.size(), t, 0});
  }
  if (send_now && !writing_) send_inline_locked();
  if (!queued_.empty() || !queued_tensors_.empty()) kick_locked();
  return true;
}

template <typename Emit>
void Connection::for_each_piece(const std::vector<uint8_t>& bytes,
                                const std::vector<QueuedTensor>& tensors, Emit&& emit) {
  size_t at = 0;
  for (const QueuedTensor& t : tensors) {
    if (t.offset > at) emit(bytes.data() + at, t.offset - at);
    at = t.offset;
    if (t.sent < t.tensor.nbytes()) {
      emit(static_cast<const uint8_t*>(t.tensor.data()) + t.sent, t.tensor.nbytes() - t.sent);
    }
  }
  if (at < bytes.size()) emit(bytes.data() + at, bytes.size() - at);
}

void Connection::send_inline_locked() {
  if (closed_ || (queued_.empty() && queued_tensors_.empty())) return;
  // A few pieces cover the common case (a frame or a handful of small
  // ones); more go to the asynchronous path whole.
  constexpr size_t kMaxPieces = 64;
  iovec pieces[kMaxPieces];
  size_t count = 0;
  bool all = true;
  for_each_piece(queued_, queued_tensors_, [&](const uint8_t* data, size_t size) {
    if (count == kMaxPieces) {
      all = false;
      return;
    }
    pieces[count++] = iovec{const_cast<uint8_t*>(data), size};
  });
  if (!all) return;
  msghdr header{};
  header.msg_iov = pieces;
  header.msg_iovlen = count;
  const ssize_t n = ::sendmsg(socket.native_handle(), &header, MSG_DONTWAIT | MSG_NOSIGNAL);
  // Errors (EAGAIN, a reset) are left to the asynchronous path, which
  // retries or reports them.
  if (n > 0) consume_locked(static_cast<size_t>(n));
}

void Connection::consume_locked(size_t n) {
  size_t at = 0;        // frame bytes fully sent
  size_t finished = 0;  // tensors fully sent
  while (n > 0) {
    const size_t end =
        finished < queued_tensors_.size() ? queued_tensors_[finished].offset : queued_.size();
    const size_t bytes = std::min(n, end - at);
    at += bytes;
    n -= bytes;
    if (n == 0 || finished == queued_tensors_.size()) break;
    QueuedTensor& t = queued_tensors_[finished];
    const size_t take = std::min(n, t.tensor.nbytes() - t.sent);
    t.sent += take;
    n -= take;
    if (t.sent < t.tensor.nbytes()) break;
    ++finished;
  }
  queued_.erase(queued_.begin(), queued_.begin() + static_cast<std::ptrdiff_t>(at));
  queued_tensors_.erase(queued_tensors_.begin(),
                        queued_tensors_.begin() + static_cast<std::ptrdiff_t>(finished));
  for (QueuedTensor& t : queued_tensors_) t.offset -= at;
}

bool Connection::enqueue_control(pipe::FrameKind kind, const uint8_t* payload,
                                 size_t size) {
  std::lock_guard lock(mu_);
  if (closed_ || closing_) return false;
  pipe::append_control_frame(queued_, kind, 0, payload, size);
  kick_locked();
  return true;
}

void Connection::kick_locked() {
  if (writing_) return;
  writing_ = true;
  asio::post(strand, [self = shared_from_this()] { self->write_some(); });
}

void Connection::write_some() {
  {
    std::lock_guard lock(mu_);
    if (closed_) return;
    if (queued_.empty() && queued_tensors_.empty()) {
      writing_ = false;
      if (closing_) {
        closed_ = true;
        closed_cv_.notify_all();
        boost::system::error_code ignored;
        socket.shutdown(tcp::socket::shutdown_send, ignored);
        socket.close(ignored);
      }
      return;
    }
    sending_.swap(queued_);
    sending_tensors_.swap(queued_tensors_);
  }
  buffers_.clear();
  for_each_piece(sending_, sending_tensors_,
                 [&](const uint8_t* data, size_t size) { buffers_.emplace_back(data, size); });
  asio::async_write(
      socket, buffers_,
      asio::bind_executor(strand, [self = shared_from_this()](
                                      const boost::system::error_code& error, size_t) {
        self->sending_.clear();
        self->sending_tensors_.clear();
        if (error) {
          self->agent.connection_failed(self, "write failed: " + error.message());
          return;
        }
        self->write_some();
      }));
}

void Connection::start_reading() {
  asio::post(strand, [self = shared_from_this()] { self->read_some(); });
}

void Connection::read_some() {
  std::pair<uint8_t*, size_t> next;
  try {
    next = reader.next_buffer();  // may fail to allocate a large body
  } catch (const std::exception& e) {
    agent.connection_failed(shared_from_this(), fmt::format("protocol error: {}", e.what()));
    return;
  }
  auto [data, size] = next;
  socket.async_read_some(
      asio::buffer(data, size),
      asio::bind_executor(strand, [self = shared_from_this()](
                                      const boost::system::error_code& error, size_t n) {
        if (error) {
          self->agent.connection_failed(
              self, error == asio::error::eof ? "the peer closed the connection"
                                              : "read failed: " + error.message());
          return;
        }
        self->last_recv_ns = now_ns();
        try {
          self->reader.commit(n);
        } catch (const std::exception& e) {
          self->agent.connection_failed(self, fmt::format("protocol error: {}", e.what()));
          return;
        }
        if (self->drain()) self->read_some();
      }));
}

bool Connection::drain() {
  pipe::InboundFrame frame;
  while (reader.pop(frame)) {
    if (!agent.on_frame(shared_from_this(), std::move(frame))) return false;
  }
  return true;
}

void Connection::resume_reading() {
  asio::post(strand, [self = shared_from_this()] {
    if (self->drain()) self->read_some();
  });
}

void Connection::close_after_flush() {
  std::lock_guard lock(mu_);
  if (closed_ || closing_) return;
  closing_ = true;
  kick_locked();
}

bool Connection::wait_closed(Clock::time_point deadline) {
  std::unique_lock lock(mu_);
  return closed_cv_.wait_until(lock, deadline, [&] { return closed_; });
}

void Connection::close_now() {
  {
    std::lock_guard lock(mu_);
    if (closed_) return;
    closed_ = true;
    closed_cv_.notify_all();
  }
  asio::post(strand, [self = shared_from_this()] {
    boost::system::error_code ignored;
    self->socket.shutdown(tcp::socket::shutdown_both, ignored);
    self->socket.close(ignored);
  });
}

// --------------------------------------------------------------- Impl impl

PipeAgent::Impl::Impl(PipeAgent& owner, std::shared_ptr<Store> store, std::string name,
                      int rank, int world_size, const PipeAgentOptions& options)
    : owner(owner),
      store(std::move(store)),
      name(std::move(name)),
      rank(rank),
      world_size(world_size),
      options(options),
      work(asio::make_work_guard(io)),
      timer_strand(asio::make_strand(io)),
      acceptor(timer_strand),
      deadline_timer(timer_strand),
      heartbeat_timer(timer_strand) {}

PipeAgent::Impl::~Impl() {
  work.reset();
  io.stop();
  for (auto& thread : io_threads) {
    if (thread.joinable()) thread.join();
  }
}

void PipeAgent::Impl::rendezvous() {
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

  collective::GlooOptions gloo_options;
  gloo_options.group_name = "pipe";
  gloo_options.timeout = options.rpc_timeout.count() > 0 ? options.rpc_timeout
                                                          : collective::ProcessGroup::kDefaultTimeout;
  gloo_options.hostname = address;
  gloo = std::make_unique<collective::GlooProcessGroup>(*store, rank, world_size, gloo_options);

  WorkerAnnouncement mine;
  mine.name = name;
  mine.address = address;
  mine.port = port;
  device_count = options.device_count >= 0 ? options.device_count
                                           : registered_cuda_device_count();
  mine.device_count = device_count;
  mine.device_maps = options.device_maps;
  mine.devices = options.devices;
  const std::vector<WorkerAnnouncement> all =
      allgather_announcements(*gloo, mine, options.rpc_timeout);

  check_unique_names(all);
  std::vector<rpc::WorkerDevices> gathered;
  for (const auto& worker : all) {
    gathered.push_back({worker.name, worker.device_count, worker.device_maps,
                        worker.devices});
  }
  rpc::validate_device_maps(gathered, /*static_group=*/true);
  reverse_maps = rpc::reverse_device_maps(name, gathered);
  devices = rpc::default_devices(options.devices, options.device_maps, reverse_maps);

  peers.resize(world_size);
  for (int r = 0; r < world_size; ++r) {
    peers[r].info = WorkerInfo{all[r].name, r};
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
  for (auto& [connection, hello] : hellos) {
    asio::post(connection->strand, [self = shared_from_this(), connection, hello] {
      if (self->on_hello(connection, hello)) connection->resume_reading();
    });
  }
  for (int r = 0; r < rank; ++r) connect_to(r);
  wait_connected();
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

void PipeAgent::Impl::connect_to(int peer) {
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
  const std::vector<uint8_t> hello = encode_hello(rank, name);
  connection->enqueue_control(pipe::FrameKind::kHello, hello.data(), hello.size());
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
                               const Message& hello) {
  {
    std::lock_guard lock(mu);
    if (!peers_ready) {
      early_hellos.emplace_back(connection, hello);
      return false;  // resumed by rendezvous()
    }
  }
  auto [peer, peer_name] = decode_hello(hello.payload);
  std::string problem;
  if (connection->peer >= 0) {
    problem = "a second hello";
  } else if (peer <= rank || peer >= world_size) {
    problem = fmt::format("hello from rank {} (only ranks {}..{} connect here)", peer,
                          rank + 1, world_size - 1);
  } else if (peer_name != peers[peer].info.name) {
    problem = fmt::format("hello from rank {} named \"{}\", expected \"{}\"", peer,
                          peer_name, peers[peer].info.name);
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
      std::lock_guard lock(mu);
      if (peers[from].state == PeerState::kUp) {
        peers[from].state = PeerState::kLeft;
        peers[from].reason = "left the group (shut down)";
      }
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

// Runs `request` on the pool (held back until start() when it comes
// earlier: peers may call as soon as their own constructor returned).
void PipeAgent::Impl::accept_request(int from, pipe::InboundFrame request) {
  {
    std::lock_guard lock(mu);
    if (stopping) return;
    if (!started) {
      early.emplace_back(from, std::move(request));
      return;
    }
    ++handlers_running;
  }
  try {
    owner.pool()->post([self = shared_from_this(), from, request = std::move(request)]() mutable {
      self->serve(from, std::move(request));
    });
  } catch (const std::exception&) {
    std::lock_guard lock(mu);
    --handlers_running;
    cv.notify_all();
  }
}

void PipeAgent::Impl::fail_one(uint64_t id, std::exception_ptr error) {
  Promise<Message> promise;
  {
    std::lock_guard lock(mu);
    auto it = pending.find(id);
    if (it == pending.end()) return;
    if (it->second.has_deadline) deadlines.erase(it->second.deadline);
    promise = std::move(it->second.promise);
    pending.erase(it);
    if (pending.empty()) cv.notify_all();
  }
  promise.set_error(std::move(error));
}

void PipeAgent::Impl::serve(int from, pipe::InboundFrame request) {
  const uint64_t id = request.message.id;
  Future<Message> response;
  try {
    place_tensors(request.message, request.devices, from);
    response = handler(std::move(request.message), peers[from].info);
    SB_REQUIRE(response.valid(), "the request handler returned an invalid future");
  } catch (...) {
    Message error;
    error.type = MessageType::kError;
    rpc::encode_remote_error(error, name, std::current_exception());
    response = Future<Message>::ready(std::move(error));
  }
  std::weak_ptr<Impl> weak = shared_from_this();
  response.add_callback([weak, from, id](const Future<Message>& done) {
    auto self = weak.lock();
    if (!self) return;
    Message reply;
    try {
      reply = done.value();
      SB_REQUIRE(reply.type != MessageType::kRequest,
                 "the request handler answered with a request");
    } catch (...) {
      reply = Message{};
      reply.type = MessageType::kError;
      rpc::encode_remote_error(reply, self->name, std::current_exception());
    }
    reply.id = id;
    self->deliver_reply(from, std::move(reply));
    std::lock_guard lock(self->mu);
    --self->handlers_running;
    self->cv.notify_all();
  });
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
  bool alone = false;  // the only handler running: send from here
  {
    std::lock_guard lock(mu);
    connection = peers[to].connection;
    alone = handlers_running <= 1;
  }
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
    int from = -1;
    {
      std::lock_guard lock(self->mu);
      auto it = self->pending.find(id);
      if (it == self->pending.end()) return;  // timed out or cancelled
      from = it->second.dst;
    }
    try {
      self->place_tensors(response.message, response.devices, from);
    } catch (...) {
      self->fail_one(id, std::current_exception());
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
  Promise<Message> promise;
  {
    std::lock_guard lock(mu);
    auto it = pending.find(response.id);
    if (it == pending.end()) return;  // timed out or cancelled: dropped
    if (it->second.has_deadline) deadlines.erase(it->second.deadline);
    promise = std::move(it->second.promise);
    pending.erase(it);
    if (pending.empty()) cv.notify_all();
  }
  promise.set_value(std::move(response));
}

void PipeAgent::Impl::fail_pending_if(
    const std::function<bool(const Pending&)>& which,
    const std::function<std::exception_ptr(const Pending&)>& error) {
  std::vector<std::pair<Promise<Message>, std::exception_ptr>> failed;
  {
    std::lock_guard lock(mu);
    for (auto it = pending.begin(); it != pending.end();) {
      if (which(it->second)) {
        failed.emplace_back(std::move(it->second.promise), error(it->second));
        if (it->second.has_deadline) deadlines.erase(it->second.deadline);
        it = pending.erase(it);
      } else {
        ++it;
      }
    }
    if (pending.empty()) cv.notify_all();
  }
  for (auto& [promise, e] : failed) promise.set_error(e);
}

void PipeAgent::Impl::connection_failed(const std::shared_ptr<Connection>& connection,
                                        const std::string& reason) {
  if (connection->failed.exchange(true)) return;  // already reported
  connection->close_now();
  const int peer = connection->peer;
  bool was_current = false;
  bool quiet = false;
  std::string why;
  {
    std::lock_guard lock(mu);
    std::erase(unidentified, connection);
    quiet = stopping;
    if (peer >= 0 && peers[peer].connection == connection) {
      was_current = true;
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
  if (quiet) {
    spdlog::debug("rpc agent \"{}\": worker \"{}\" {}", name, name_of(peer), why);
  } else {
    spdlog::warn("rpc agent \"{}\": worker \"{}\" {}", name, name_of(peer), why);
  }
  const std::string peer_name = name_of(peer);
  fail_pending_if([peer](const Pending& p) { return p.dst == peer; },
                  [&](const Pending& p) {
                    return std::make_exception_ptr(ConnectionError(fmt::format(
                        "rpc to \"{}\" function \"{}\": worker \"{}\" {}", peer_name,
                        p.function, peer_name, why)));
                  });
}

std::vector<Device> PipeAgent::Impl::wire_devices(const Message& m, int to,
                                                  bool reply) const {
  std::vector<Device> wire;
  bool any_cuda = false;
  for (const Tensor& t : m.tensors) any_cuda = any_cuda || t.device().is_cuda();
  if (!any_cuda) return wire;
  const rpc::DeviceMaps& maps = reply ? reverse_maps : options.device_maps;
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    wire.push_back(rpc::target_device(maps, name_of(to), m.tensors[i].device(), i));
  }
  return wire;
}

void PipeAgent::Impl::add_deadline_locked(uint64_t id, Pending& p) {
  const auto when = Clock::now() + p.timeout;
  p.deadline = deadlines.emplace(when, id);
  p.has_deadline = true;
  if (when < armed) {
    armed = when;
    asio::post(timer_strand, [self = shared_from_this()] { self->rearm_deadline_timer(); });
  }
}

void PipeAgent::Impl::rearm_deadline_timer() {
  Clock::time_point next;
  {
    std::lock_guard lock(mu);
    next = deadlines.empty() ? Clock::time_point::max() : deadlines.begin()->first;
    armed = next;
  }
  deadline_timer.expires_at(next);
  deadline_timer.async_wait([self = shared_from_this()](const boost::system::error_code& e) {
    if (!e) self->expire_deadlines();
  });
}

void PipeAgent::Impl::expire_deadlines() {
  const auto now = Clock::now();
  std::vector<std::pair<Promise<Message>, std::string>> expired;
  {
    std::lock_guard lock(mu);
    while (!deadlines.empty() && deadlines.begin()->first <= now) {
      auto it = pending.find(deadlines.begin()->second);
      deadlines.erase(deadlines.begin());
      if (it == pending.end()) continue;
      expired.emplace_back(std::move(it->second.promise),
                           fmt::format("rpc to \"{}\" function \"{}\": timed out after {} ms",
                                       name_of(it->second.dst), it->second.function,
                                       it->second.timeout.count()));
      pending.erase(it);
    }
    if (pending.empty()) cv.notify_all();
  }
  for (auto& [promise, message] : expired) {
    promise.set_error(std::make_exception_ptr(TimeoutError(message)));
  }
  rearm_deadline_timer();
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
  SB_REQUIRE(world_size.has_value(),
             "PIPE agent \"{}\": dynamic groups (no world_size) are not supported yet",
             name);
  SB_REQUIRE(*world_size >= 1 && rank >= 0 && rank < *world_size,
             "PIPE agent \"{}\": rank {} is outside [0, {})", name, rank, *world_size);
  SB_REQUIRE(options.heartbeat_interval.count() > 0,
             "PIPE agent \"{}\": heartbeat_interval must be positive", name);
  auto prefixed = std::make_shared<PrefixStore>("pipe", std::move(store));
  impl_ = std::make_shared<Impl>(*this, prefixed, std::move(name), rank, *world_size,
                                 options);
  try {
    impl_->rendezvous();
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
  SB_REQUIRE(!impl_->started, "PIPE agent \"{}\": start() called twice", self().name);
  std::vector<std::pair<int, pipe::InboundFrame>> early;
  {
    std::lock_guard lock(impl_->mu);
    impl_->handler = std::move(handler);
    impl_->started = true;
    early.swap(impl_->early);
  }
  for (auto& [from, request] : early) impl_->accept_request(from, std::move(request));
}

Future<Message> PipeAgent::send(const WorkerInfo& to, Message request, Timeout timeout) {
  Impl& s = *impl_;
  Promise<Message> promise(pool());
  Future<Message> result = promise.get_future();
  uint64_t id = 0;  // nonzero once the call may be registered as pending
  try {
    SB_REQUIRE(s.started, "PIPE agent \"{}\": send() before start()", s.name);
    SB_REQUIRE(request.type == MessageType::kRequest,
               "PIPE agent \"{}\": send() takes a request", s.name);
    SB_REQUIRE(timeout.count() >= 0, "rpc to \"{}\": negative timeout", to.name);
    const int dst = worker(to.name).id;
    const std::vector<Device> wire = s.wire_devices(request, dst, false);
    if (dst != s.rank) stage_on_cpu(request, to.name);
    id = s.next_id++;
    request.id = id;
    std::shared_ptr<Connection> connection;
    bool alone = false;  // the only call in flight: send from this thread
    {
      std::lock_guard lock(s.mu);
      if (s.stopping) {
        throw Error(ErrorCode::kCancelled,
                    fmt::format("rpc to \"{}\" function \"{}\": rpc agent \"{}\" shut down",
                                to.name, request.function, s.name));
      }
      const auto& peer = s.peers[dst];
      if (peer.state != Impl::PeerState::kUp) {
        throw ConnectionError(fmt::format("rpc to \"{}\" function \"{}\": worker \"{}\" {}",
                                          to.name, request.function, to.name, peer.reason));
      }
      connection = peer.connection;
      auto [it, inserted] = s.pending.try_emplace(id);
      it->second.promise = promise;
      it->second.dst = dst;
      it->second.function = request.function;
      it->second.timeout = timeout;
      if (timeout.count() > 0) s.add_deadline_locked(id, it->second);
      alone = s.pending.size() <= 1;
    }
    if (dst == s.rank) {
      pipe::InboundFrame self_request;
      self_request.message = copy_tensors(std::move(request), wire);
      s.accept_request(s.rank, std::move(self_request));
    } else if (!connection->enqueue(request, wire, alone)) {
      s.fail_one(id, std::make_exception_ptr(ConnectionError(fmt::format(
                         "rpc to \"{}\" function \"{}\": the connection to worker \"{}\" "
                         "is closed",
                         to.name, request.function, to.name))));
    }
  } catch (...) {
    // What threw after the call was registered (a self-send's tensor copy,
    // encoding the frame) must not leave it pending: join() waits for it.
    if (id != 0) s.fail_one(id, std::current_exception());
    promise.set_error(std::current_exception());
  }
  return result;
}

WorkerInfo PipeAgent::worker(const std::string& name) const {
  for (const auto& peer : impl_->peers) {
    if (peer.info.name == name) return peer.info;
  }
  throw NotFoundError(fmt::format("rpc agent \"{}\": no worker named \"{}\"",
                                  impl_->name, name));
}

WorkerInfo PipeAgent::worker(int id) const {
  if (id < 0 || id >= impl_->world_size) {
    throw NotFoundError(
        fmt::format("rpc agent \"{}\": no worker with id {}", impl_->name, id));
  }
  return impl_->peers[id].info;
}

std::vector<WorkerInfo> PipeAgent::workers() const {
  std::vector<WorkerInfo> out;
  for (const auto& peer : impl_->peers) out.push_back(peer.info);
  return out;
}

void PipeAgent::join(Timeout timeout) {
  Impl& s = *impl_;
  const auto deadline = Clock::now() + timeout;
  {
    std::unique_lock lock(s.mu);
    auto drained = [&] { return s.stopping || (s.pending.empty() && s.handlers_running == 0); };
    const bool done = timeout.count() > 0 ? s.cv.wait_until(lock, deadline, drained)
                                          : (s.cv.wait(lock, drained), true);
    if (s.stopping) {
      throw Error(ErrorCode::kCancelled,
                  fmt::format("join: rpc agent \"{}\" shut down", s.name));
    }
    if (!done) {
      throw TimeoutError(fmt::format(
          "join on rpc agent \"{}\": {} call(s) still in flight and {} request(s) being "
          "handled after {} ms",
          s.name, s.pending.size(), s.handlers_running, timeout.count()));
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
  s.fail_pending_if([](const Impl::Pending&) { return true; },
                    [&](const Impl::Pending& p) {
                      return std::make_exception_ptr(Error(
                          ErrorCode::kCancelled,
                          fmt::format("rpc to \"{}\" function \"{}\": rpc agent \"{}\" shut "
                                      "down",
                                      s.name_of(p.dst), p.function, s.name)));
                    });
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
    impl->deadline_timer.cancel();
    impl->heartbeat_timer.cancel();
  });
  pool()->shutdown();
  s.work.reset();
  for (auto& connection : connections) connection->close_now();
  for (auto& thread : s.io_threads) {
    if (thread.joinable()) thread.join();
  }
  s.gloo.reset();
}

std::string PipeAgent::listen_address() const { return impl_->address; }
int PipeAgent::listen_port() const { return impl_->port; }
const rpc::DeviceMaps& PipeAgent::reverse_device_maps() const { return impl_->reverse_maps; }
const std::vector<Device>& PipeAgent::devices() const { return impl_->devices; }

}  // namespace switchboard::agents
