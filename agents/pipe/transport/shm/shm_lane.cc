#include "agents/pipe/transport/shm/shm_lane.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>

#include "common/host_key.h"

namespace switchboard::agents::pipe::transport {

namespace {

// Each wait of a lane thread: stop(), a closing connection and new frames
// wake it at once; the bound is a safety net, not a poll.
constexpr std::chrono::microseconds kWait{500'000};

}  // namespace

ShmLane::ShmLane(LaneCarrier& carrier, size_t capacity, std::string off_reason,
                 const wire::FrameLimits& limits, wire::FrameReader::Allocate allocate,
                 wire::FrameReader::Progress progress)
    : carrier_(carrier),
      capacity_(capacity),
      off_reason_(std::move(off_reason)),
      limits_(limits),
      allocate_(std::move(allocate)),
      progress_(std::move(progress)) {}

ShmLane::~ShmLane() {
  alive_->store(false);
  stop();
  for (std::thread* t : {&writer_, &reader_}) {
    if (!t->joinable()) continue;
    if (t->get_id() == std::this_thread::get_id()) {
      t->detach();  // its connection's last reference was dropped on it: it returns next
    } else {
      t->join();
    }
  }
}

std::pair<ShmLane::Op, std::string> ShmLane::parse(const std::vector<uint8_t>& payload) {
  if (payload.empty()) return {Op::kNone, ""};
  return {static_cast<Op>(payload[0]), std::string(payload.begin() + 1, payload.end())};
}

std::vector<uint8_t> ShmLane::payload(Op op, std::string_view text) {
  std::vector<uint8_t> out(1 + text.size());
  out[0] = static_cast<uint8_t>(op);
  if (!text.empty()) std::memcpy(out.data() + 1, text.data(), text.size());
  return out;
}

void ShmLane::stop() {
  stop_ = true;
  {
    MutexLock lock(mu_);  // a writer between its check and its wait sees stop_
    queued_cv_.notify_all();
  }
  if (ShmRing* ring = out_ring_.load()) ring->wake_all();
  if (ShmRing* ring = in_ring_.load()) ring->wake_all();
}

void ShmLane::join() {
  stop();
  for (std::thread* t : {&writer_, &reader_}) {
    if (t->joinable() && t->get_id() != std::this_thread::get_id()) t->join();
  }
}

std::optional<std::vector<uint8_t>> ShmLane::offer() {
  MutexLock lock(mu_);
  if (offered_ || capacity_ == 0) return std::nullopt;
  offered_ = true;
  auto ring = std::make_unique<Ring>();
  try {
    ring->segment = ShmSegment::create(capacity_);
    ring->ring = std::make_unique<ShmRing>(ring->segment, ShmRing::kProducer);
  } catch (const std::exception& e) {
    spdlog::info("PIPE connection to {}: no shared-memory lane: {}", carrier_.lane_peer(),
                 e.what());
    return std::nullopt;
  }
  std::vector<uint8_t> out =
      payload(Op::kOffer, ring->segment.name() + "\n" + host_key());
  offer_ = std::move(ring);
  return out;
}

bool ShmLane::switch_out() {
  MutexLock lock(mu_);
  if (!offer_ || out_) return false;
  out_ = std::move(offer_);
  out_ring_ = out_->ring.get();
  spdlog::info("PIPE connection to {}: frames go through shared memory (a {} KiB ring)",
               carrier_.lane_peer(), capacity_ / 1024);
  writer_ = std::thread([this, alive = alive_] { write_loop(alive); });
  return true;
}

bool ShmLane::refused(const std::string& reason) {
  MutexLock lock(mu_);
  if (!offer_) return false;
  offer_.reset();  // its memory goes with it
  spdlog::info(
      "PIPE connection to {}: frames stay on TCP: the peer refused the "
      "shared-memory lane: {}",
      carrier_.lane_peer(), reason);
  return true;
}

void ShmLane::enqueue(const rpc::Message& m, const std::vector<Device>& devices,
                      const std::vector<wire::TensorRoute>& routes) {
  MutexLock lock(mu_);
  queued_.append(m, devices, routes);
  write_or_fail_locked();
}

void ShmLane::enqueue_control(wire::FrameKind kind, uint64_t id, const uint8_t* data,
                              size_t size) {
  MutexLock lock(mu_);
  queued_.append_control(kind, id, data, size);
  write_or_fail_locked();
}

void ShmLane::write_or_fail_locked() {
  try {
    if (!write_locked()) queued_cv_.notify_all();  // the writer thread goes on
  } catch (const ShmRingCorrupt& e) {
    carrier_.lane_failed(std::string("protocol error: ") + e.what());
  }
}

bool ShmLane::write_locked() {
  ShmRing& ring = *out_->ring;
  size_t written = 0;
  bool full = false;
  queued_.for_each_piece([&](const uint8_t* data, size_t size) {
    if (full) return;
    const size_t n = ring.write_some(data, size);
    written += n;
    full = n < size;
  });
  queued_.consume(written);
  return queued_.empty();
}

bool ShmLane::out_flushed() const {
  MutexLock lock(mu_);
  return queued_.empty();
}

void ShmLane::close_after_flush() {
  MutexLock lock(mu_);
  closing_ = true;
  queued_cv_.notify_all();
}

// Takes what did not fit into the ring at once, as room comes.
void ShmLane::write_loop(const Alive& alive) {
  ShmRing* ring = out_ring_.load();
  for (;;) {
    if (!alive->load()) return;
    bool flushed_while_closing = false;
    std::shared_ptr<wire::ChunkedSource> waiting;  // a staged tensor's next chunk
    {
      std::shared_ptr<Connection> self = carrier_.lane_connection();
      if (self == nullptr) return;
      MutexLock lock(mu_);
      queued_cv_.wait_for(
          mu_, std::chrono::duration_cast<std::chrono::milliseconds>(kWait),
          [&]()
              SB_REQUIRES(mu_) { return stop_.load() || !queued_.empty() || closing_; });
      if (stop_) return;
      if (!queued_.empty()) {
        try {
          write_locked();
        } catch (const ShmRingCorrupt& e) {
          carrier_.lane_failed(std::string("protocol error: ") + e.what());
          return;
        }
      }
      flushed_while_closing = queued_.empty() && closing_;
      if (queued_.empty() && !closing_) continue;
      waiting = queued_.blocked();
    }
    if (waiting) {
      try {
        waiting->advance();  // outside the lock: callers may queue meanwhile
      } catch (const std::exception& e) {
        carrier_.lane_failed(fmt::format("staging a tensor failed: {}", e.what()));
        return;
      }
      continue;
    }
    if (flushed_while_closing) {
      // Everything went: the pending close may go on.
      if (std::shared_ptr<Connection> self = carrier_.lane_connection())
        carrier_.lane_flushed();
      return;
    }
    if (!alive->load()) return;
    ring->wait_space(stop_, kWait);
  }
}

std::vector<uint8_t> ShmLane::answer(const std::string& offer) {
  std::string refusal;
  const size_t cut = offer.find('\n');
  if (capacity_ == 0) {
    refusal = off_reason_;
  } else if (cut == std::string::npos || offer.substr(cut + 1) != host_key()) {
    refusal = "it runs on another host (or in another network, IPC or PID namespace)";
  } else {
    try {
      auto ring = std::make_unique<Ring>();
      ring->segment = ShmSegment::open(offer.substr(0, cut));
      ring->ring = std::make_unique<ShmRing>(ring->segment, ShmRing::kConsumer);
      MutexLock lock(in_mu_);
      in_offer_ = std::move(ring);
    } catch (const std::exception& e) {
      refusal = e.what();  // another host, another IPC namespace
    }
  }
  return refusal.empty() ? payload(Op::kAccept) : payload(Op::kRefuse, refusal);
}

bool ShmLane::switch_in() {
  {
    MutexLock lock(in_mu_);
    if (!in_offer_ || in_) return false;
    in_ = std::move(in_offer_);
  }
  in_ring_ = in_->ring.get();
  in_active_ = true;
  reader_ = std::thread([this, alive = alive_] { read_loop(alive); });
  return true;
}

void ShmLane::socket_ended(std::string why) {
  {
    MutexLock lock(in_mu_);
    socket_end_ = std::move(why);
  }
  socket_ended_ = true;
  if (ShmRing* ring = in_ring_.load()) ring->wake_all();
}

// Reads the ring into a frame reader of its own and hands the frames on.
void ShmLane::read_loop(const Alive& alive) {
  ShmRing& ring = *in_->ring;
  wire::FrameReader reader(limits_, allocate_);
  reader.set_progress(progress_);
  wire::InboundFrame frame;
  for (;;) {
    if (!alive->load()) return;
    bool wait = false;
    {
      std::shared_ptr<Connection> self = carrier_.lane_connection();
      if (self == nullptr || stop_) return;
      ConnectionEvents& events = carrier_.lane_events();
      // Read before looking at the socket's end, so that nothing the peer
      // wrote before it went is lost.
      const bool ended = socket_ended_.load();
      std::pair<const uint8_t*, size_t> bytes;
      try {
        bytes = ring.readable();
      } catch (const ShmRingCorrupt& e) {
        events.connection_failed(self, std::string("protocol error: ") + e.what());
        return;
      }
      if (bytes.second == 0) {
        if (ended) {
          std::string why;
          {
            MutexLock lock(in_mu_);
            why = socket_end_;
          }
          events.connection_failed(self, why);
          return;
        }
        wait = true;
      } else {
        self->last_recv_ns = now_ns();
        try {
          size_t fed = 0;
          while (fed < bytes.second) {
            auto [buffer, room] = reader.next_buffer();
            const size_t n = std::min(room, bytes.second - fed);
            std::memcpy(buffer, bytes.first + fed, n);
            reader.commit(n);
            fed += n;
            while (reader.pop(frame)) {
              if (!events.on_frame(self, std::move(frame))) return;
            }
          }
        } catch (const std::exception& e) {
          events.connection_failed(self, fmt::format("protocol error: {}", e.what()));
          return;
        }
        ring.consume(bytes.second);
      }
    }
    if (!alive->load()) return;
    if (wait) ring.wait_data(stop_, kWait);
  }
}

}  // namespace switchboard::agents::pipe::transport
