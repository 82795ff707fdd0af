// TcpConnection's same-host lane (see agents/pipe_tcp_connection.h): the
// offer and answers, the ring writer and reader threads.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cstdio>

#include "agents/pipe_tcp_connection.h"

namespace switchboard::agents {

namespace asio = boost::asio;

namespace {

enum LaneOp : uint8_t { kOffer = 1, kAccept = 2, kRefuse = 3, kSwitch = 4 };

// Each wait of a lane thread: stop_lane(), a closing socket and new frames
// wake it at once; the bound is a safety net, not a poll.
constexpr std::chrono::microseconds kWait{500'000};

std::vector<uint8_t> lane_payload(LaneOp op, std::string_view text = {}) {
  std::vector<uint8_t> out{static_cast<uint8_t>(op)};
  out.insert(out.end(), text.begin(), text.end());
  return out;
}

std::string read_link(const char* path) {
  char buffer[256];
  const ssize_t n = ::readlink(path, buffer, sizeof buffer);
  return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : std::string("?");
}

// Which host, and network, IPC and PID namespaces this process runs in:
// two workers share a lane only when theirs are equal (the ring's name is
// a pid of the writer's) (workers in two network
// namespaces of one kernel are two hosts to the group: a link between them
// can be cut, and the lane would hide it).
const std::string& host_key() {
  static const std::string key = [] {
    std::string boot;
    if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
      char line[64] = {};
      if (std::fgets(line, sizeof line, f) != nullptr) boot = line;
      std::fclose(f);
    }
    while (!boot.empty() && (boot.back() == '\n' || boot.back() == ' ')) boot.pop_back();
    return fmt::format("{} {} {} {}", boot, read_link("/proc/self/ns/net"),
                       read_link("/proc/self/ns/ipc"), read_link("/proc/self/ns/pid"));
  }();
  return key;
}

}  // namespace

TcpConnection::~TcpConnection() {
  lane_alive_->store(false);
  stop_lane();
  for (std::thread* t : {&lane_writer_, &lane_reader_}) {
    if (!t->joinable()) continue;
    if (t->get_id() == std::this_thread::get_id()) {
      t->detach();  // its last reference was dropped on it: it returns next
    } else {
      t->join();
    }
  }
}

void TcpConnection::join_lane() {
  stop_lane();
  for (std::thread* t : {&lane_writer_, &lane_reader_}) {
    if (t->joinable() && t->get_id() != std::this_thread::get_id()) t->join();
  }
}

bool TcpConnection::lane_out_active() const {
  MutexLock lock(const_cast<Mutex&>(mu_));
  return lane_out_ != nullptr;
}

void TcpConnection::stop_lane() {
  lane_stop_ = true;
  lane_queued_cv_.notify_all();
  if (ShmRing* ring = lane_out_ring_.load()) ring->wake_all();
  if (ShmRing* ring = lane_in_ring_.load()) ring->wake_all();
}

void TcpConnection::fail_later(std::string reason) {
  asio::post(strand_, [self = shared_from_this(), reason = std::move(reason)] {
    self->events_.connection_failed(self, reason);
  });
}

void TcpConnection::offer_lane_locked() {
  lane_offered_ = true;
  auto lane = std::make_unique<Lane>();
  try {
    lane->segment = ShmSegment::create(lane_capacity_);
    lane->ring = std::make_unique<ShmRing>(lane->segment, ShmRing::kProducer);
  } catch (const std::exception& e) {
    spdlog::info("PIPE connection to rank {} ({}): no shared-memory lane: {}", peer.load(),
                 remote_address(), e.what());
    return;
  }
  // The offer: the segment's name, a newline, this side's host key.
  const std::vector<uint8_t> offer =
      lane_payload(kOffer, lane->segment.name() + "\n" + host_key());
  pipe::append_control_frame(queued_, pipe::FrameKind::kLane, 0, offer.data(), offer.size());
  lane_offer_ = std::move(lane);
}

void TcpConnection::on_lane_frame(const std::vector<uint8_t>& payload) {
  const LaneOp op = payload.empty() ? LaneOp{0} : static_cast<LaneOp>(payload[0]);
  const std::string text(payload.begin() + (payload.empty() ? 0 : 1), payload.end());
  switch (op) {
    case kOffer: {
      std::string refusal;
      if (lane_capacity_ == 0) {
        refusal = tls_context_ ? "this worker runs TLS" : "this worker has it off";
      } else if (const size_t cut = text.find('\n');
                 cut == std::string::npos || text.substr(cut + 1) != host_key()) {
        refusal = "it runs on another host (or in another network, IPC or PID namespace)";
      } else {
        try {
          auto lane = std::make_unique<Lane>();
          lane->segment = ShmSegment::open(text.substr(0, cut));
          lane->ring = std::make_unique<ShmRing>(lane->segment, ShmRing::kConsumer);
          MutexLock lock(lane_in_mu_);
          lane_in_offer_ = std::move(lane);
        } catch (const std::exception& e) {
          refusal = e.what();  // another host, another IPC namespace
        }
      }
      const std::vector<uint8_t> answer =
          refusal.empty() ? lane_payload(kAccept) : lane_payload(kRefuse, refusal);
      enqueue_control(pipe::FrameKind::kLane, answer.data(), answer.size());
      return;
    }
    case kAccept: {
      MutexLock lock(mu_);
      if (!lane_offer_ || lane_out_) break;
      const std::vector<uint8_t> marker = lane_payload(kSwitch);
      pipe::append_control_frame(queued_, pipe::FrameKind::kLane, 0, marker.data(),
                                 marker.size());
      kick_locked();
      lane_out_ = std::move(lane_offer_);
      lane_out_ring_ = lane_out_->ring.get();
      spdlog::info("PIPE connection to rank {} ({}): frames go through shared memory (a {} "
                   "KiB ring)",
                   peer.load(), remote_address(), lane_capacity_ / 1024);
      lane_writer_ = std::thread([this, weak = weak_from_this(), alive = lane_alive_] {
        lane_write_loop(weak, alive);
      });
      return;
    }
    case kRefuse: {
      MutexLock lock(mu_);
      if (!lane_offer_) break;
      lane_offer_.reset();  // its memory goes with it
      spdlog::info("PIPE connection to rank {} ({}): frames stay on TCP: the peer refused "
                   "the shared-memory lane: {}",
                   peer.load(), remote_address(), text);
      return;
    }
    case kSwitch: {
      {
        MutexLock lock(lane_in_mu_);
        if (!lane_in_offer_ || lane_in_) break;
        lane_in_ = std::move(lane_in_offer_);
      }
      lane_in_ring_ = lane_in_->ring.get();
      lane_in_active_ = true;
      lane_reader_ = std::thread([this, weak = weak_from_this(), alive = lane_alive_] {
        lane_read_loop(weak, alive);
      });
      return;
    }
  }
  fail_later(fmt::format("protocol error: an unexpected lane frame (op {}, {} bytes)",
                         static_cast<int>(op), payload.size()));
}

bool TcpConnection::write_lane_locked() {
  ShmRing& ring = *lane_out_->ring;
  size_t written = 0;
  bool full = false;
  for_each_piece(lane_queued_, lane_queued_tensors_, [&](const uint8_t* data, size_t size) {
    if (full) return;
    const size_t n = ring.write_some(data, size);
    written += n;
    full = n < size;
  });
  consume(lane_queued_, lane_queued_tensors_, written);
  return lane_queue_empty_locked();
}

// Takes what did not fit into the ring at once, as room comes.
void TcpConnection::lane_write_loop(const std::weak_ptr<TcpConnection>& weak,
                                    const Alive& alive) {
  ShmRing* ring = lane_out_ring_.load();
  for (;;) {
    {
      std::shared_ptr<TcpConnection> self = weak.lock();
      if (self == nullptr) return;
      MutexLock lock(mu_);
      lane_queued_cv_.wait_for(mu_, std::chrono::duration_cast<std::chrono::milliseconds>(kWait),
                               [&]() SB_REQUIRES(mu_) {
                                 return lane_stop_.load() || !lane_queue_empty_locked() ||
                                        closing_;
                               });
      if (lane_stop_) return;
      if (!lane_queue_empty_locked()) {
        try {
          write_lane_locked();
        } catch (const ShmRingCorrupt& e) {
          fail_later(std::string("protocol error: ") + e.what());
          return;
        }
      }
      if (lane_queue_empty_locked()) {
        // Everything went: a pending close may go on.
        if (closing_ && !writing_) kick_locked();
        if (closing_) return;
        continue;
      }
    }
    if (!alive->load()) return;
    ring->wait_space(lane_stop_, kWait);
  }
}

// Reads the ring into a frame reader of its own and hands the frames on.
void TcpConnection::lane_read_loop(const std::weak_ptr<TcpConnection>& weak,
                                   const Alive& alive) {
  ShmRing& ring = *lane_in_->ring;
  pipe::FrameReader reader(limits_, allocate_);
  pipe::InboundFrame frame;
  for (;;) {
    bool wait = false;
    {
      std::shared_ptr<TcpConnection> self = weak.lock();
      if (self == nullptr || lane_stop_) return;
      // Read before looking at the socket's end, so that nothing the peer
      // wrote before it went is lost.
      const bool ended = socket_ended_.load();
      std::pair<const uint8_t*, size_t> bytes;
      try {
        bytes = ring.readable();
      } catch (const ShmRingCorrupt& e) {
        events_.connection_failed(self, std::string("protocol error: ") + e.what());
        return;
      }
      if (bytes.second == 0) {
        if (ended) {
          std::string why;
          {
            MutexLock lock(lane_in_mu_);
            why = socket_end_;
          }
          events_.connection_failed(self, why);
          return;
        }
        wait = true;
      } else {
        last_recv_ns = now_ns();
        try {
          size_t fed = 0;
          while (fed < bytes.second) {
            auto [buffer, room] = reader.next_buffer();
            const size_t n = std::min(room, bytes.second - fed);
            std::memcpy(buffer, bytes.first + fed, n);
            reader.commit(n);
            fed += n;
            while (reader.pop(frame)) {
              if (!events_.on_frame(self, std::move(frame))) return;
            }
          }
        } catch (const std::exception& e) {
          events_.connection_failed(self, fmt::format("protocol error: {}", e.what()));
          return;
        }
        ring.consume(bytes.second);
      }
    }
    if (!alive->load()) return;
    if (wait) ring.wait_data(lane_stop_, kWait);
  }
}

}  // namespace switchboard::agents
