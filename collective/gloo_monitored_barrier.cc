#include "collective/gloo_monitored_barrier.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <array>
#include <set>
#include <thread>

#include "common/error.h"
#include "common/mutex.h"

namespace switchboard::collective {

namespace {

using Clock = std::chrono::steady_clock;

// Rank 0's answer to each rank that arrived: how many did not, then up to
// kListed of them.
constexpr size_t kListed = 63;
using Verdict = std::array<int64_t, kListed + 1>;

uint64_t slot(uint64_t kind, uint32_t tag) { return (kind << 48) | tag; }
constexpr uint64_t kArrive = 0x5345;
constexpr uint64_t kRelease = 0x5346;

std::string ranks_text(const std::vector<int64_t>& ranks, int64_t total) {
  std::string text = fmt::format("[{}]", fmt::join(ranks, ", "));
  if (total > static_cast<int64_t>(ranks.size())) {
    text += fmt::format(" and {} more", total - static_cast<int64_t>(ranks.size()));
  }
  return text;
}

}  // namespace

void run_monitored_barrier(const std::shared_ptr<gloo::rendezvous::Context>& context,
                           uint32_t tag, std::chrono::milliseconds timeout,
                           bool wait_all_ranks, const std::string& where,
                           std::vector<PostedRecv>& kept) {
  const int n = context->size;
  if (context->rank != 0) {
    uint8_t here = 1;
    auto arrive = context->createUnboundBuffer(&here, 1);
    arrive->send(0, slot(kArrive, tag));
    Verdict verdict{};
    auto release = context->createUnboundBuffer(verdict.data(), sizeof(verdict));
    release->recv(0, slot(kRelease, tag));
    // Rank 0 answers within `timeout` (plus the time it takes to send); a
    // rank 0 that is gone fails the wait with Gloo's error.
    release->waitRecv(nullptr, 2 * timeout + std::chrono::seconds(5));
    arrive->waitSend(nullptr, timeout);
    if (verdict[0] > 0) {
      std::vector<int64_t> missing(verdict.begin() + 1,
                                   verdict.begin() + 1 + std::min<int64_t>(verdict[0], kListed));
      throw TimeoutError(fmt::format(
          "{}: rank 0 reports that ranks {} did not arrive within {} ms", where,
          ranks_text(missing, verdict[0]), timeout.count()));
    }
    return;
  }

  // Rank 0: one receive from any rank not heard from yet, posted again
  // after each arrival, so that an arrival counts the moment it comes; at
  // the deadline the receive waited on is aborted (which leaves the
  // connections alone, unlike Gloo's timeout), and the ranks not heard
  // from are those missing.
  std::set<int> waiting;
  for (int r = 1; r < n; ++r) waiting.insert(r);
  Mutex mu;
  CondVar done_cv;
  bool done = false;                                  // guarded by mu
  bool expired = false;                               // guarded by mu
  gloo::transport::UnboundBuffer* current = nullptr;  // guarded by mu
  const auto deadline = Clock::now() + timeout;
  std::thread aborter([&] {
    MutexLock lock(mu);
    if (done_cv.wait_until(mu, deadline, [&]() SB_REQUIRES(mu) { return done; })) {
      return;
    }
    expired = true;
    if (current != nullptr) current->abortWaitRecv();
  });
  auto stop_aborter = [&] {
    {
      MutexLock lock(mu);
      done = true;
    }
    done_cv.notify_all();
    aborter.join();
  };
  while (!waiting.empty()) {
    PostedRecv arrival{std::make_unique<uint8_t[]>(1), nullptr};
    arrival.buffer = context->createUnboundBuffer(arrival.bytes.get(), 1);
    arrival.buffer->recv(std::vector<int>(waiting.begin(), waiting.end()), slot(kArrive, tag));
    {
      MutexLock lock(mu);
      if (expired) {
        kept.push_back(std::move(arrival));  // still posted: a late rank sends into it
        break;
      }
      current = arrival.buffer.get();
    }
    int from = -1;
    bool came = false;
    try {
      came = arrival.buffer->waitRecv(&from, timeout + std::chrono::seconds(5));
    } catch (...) {
      kept.push_back(std::move(arrival));
      stop_aborter();
      throw;
    }
    {
      MutexLock lock(mu);
      current = nullptr;
    }
    if (!came) {
      kept.push_back(std::move(arrival));
      break;
    }
    waiting.erase(from);
  }
  stop_aborter();
  const std::vector<int64_t> missing(waiting.begin(), waiting.end());
  // A receive for each rank that did not come, so that every late one's
  // message lands somewhere.
  for (int r : waiting) {
    PostedRecv late{std::make_unique<uint8_t[]>(1), nullptr};
    late.buffer = context->createUnboundBuffer(late.bytes.get(), 1);
    late.buffer->recv(r, slot(kArrive, tag));
    kept.push_back(std::move(late));
  }

  Verdict verdict{};
  verdict[0] = static_cast<int64_t>(missing.size());
  for (size_t i = 0; i < std::min(missing.size(), kListed); ++i) verdict[i + 1] = missing[i];
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> releases;
  for (int r = 1; r < n; ++r) {
    if (waiting.contains(r)) continue;
    releases.push_back(context->createUnboundBuffer(verdict.data(), sizeof(verdict)));
    releases.back()->send(r, slot(kRelease, tag));
  }
  for (auto& release : releases) release->waitSend(nullptr, timeout + std::chrono::seconds(5));
  if (!missing.empty()) {
    std::vector<int64_t> named = missing;
    if (!wait_all_ranks) named.resize(1);
    throw TimeoutError(fmt::format("{}: ranks {} did not arrive within {} ms", where,
                                   ranks_text(named, wait_all_ranks
                                                         ? static_cast<int64_t>(missing.size())
                                                         : 1),
                                   timeout.count()));
  }
}

}  // namespace switchboard::collective
