// The same-host lane's ring (agents/pipe/transport/shm/shm_ring.h): bytes across threads
// through a shared segment, the segment's name handling, a hostile peer's
// values refused, close() waking a waiting side, and a brief fuzz run of
// tests/agents/pipe/fuzz/shm_ring_fuzzer.cc (tests/agents/pipe/fuzz/fuzz_shm_ring runs it
// long, with sanitizers).
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "agents/pipe/transport/shm/shm_ring.h"
#include "tests/agents/pipe/fuzz/shm_ring_fuzzer.h"

using namespace switchboard::agents;
using namespace switchboard::agents::pipe;
using namespace std::chrono_literals;

namespace {

}  // namespace

TEST_CASE("a ring carries 64 MiB between threads through a 64 KiB segment, in order",
          "[shm]") {
  ShmSegment mine = ShmSegment::create(64 * 1024);
  ShmSegment theirs = ShmSegment::open(mine.name());
  CHECK(theirs.size() == mine.size());
  CHECK(theirs.data() != mine.data());  // two mappings of one file
  ShmRing out(mine, ShmRing::kProducer);
  ShmRing in(theirs, ShmRing::kConsumer);
  CHECK(in.capacity() == 64 * 1024);
  constexpr size_t kTotal = 64 << 20;
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    std::vector<uint8_t> chunk(10007);
    size_t sent = 0;
    while (sent < kTotal) {
      const size_t n = std::min(chunk.size(), kTotal - sent);
      for (size_t i = 0; i < n; ++i) chunk[i] = static_cast<uint8_t>((sent + i) * 7);
      size_t done = 0;
      while (done < n) {
        const size_t k = out.write_some(chunk.data() + done, n - done);
        done += k;
        if (k == 0) out.wait_space(stop, 100ms);
      }
      sent += n;
    }
  });
  size_t received = 0;
  size_t wrong = 0;
  while (received < kTotal) {
    auto [p, n] = in.readable();
    if (n == 0) {
      in.wait_data(stop, 100ms);
      continue;
    }
    for (size_t i = 0; i < n; ++i) {
      if (p[i] != static_cast<uint8_t>((received + i) * 7)) ++wrong;
    }
    in.consume(n);
    received += n;
  }
  writer.join();
  CHECK(wrong == 0);
  CHECK(received == kTotal);
}

TEST_CASE("a segment name of another form, and a file that is not sealed, are refused",
          "[shm]") {
  CHECK_THROWS_AS(ShmSegment::open("/etc/passwd"), std::invalid_argument);
  CHECK_THROWS_AS(ShmSegment::open("1/../../x"), std::invalid_argument);
  CHECK_THROWS_AS(ShmSegment::open("12"), std::invalid_argument);
  CHECK_THROWS_AS(ShmSegment::create(5000), std::invalid_argument);
  // A closed file of this process: cannot be opened.
  std::string name;
  { name = ShmSegment::create(4096).name(); }
  CHECK_THROWS_AS(ShmSegment::open(name), std::system_error);
  // An open file of the right size but without seals: a peer could shrink
  // it under the mapping, so it is refused.
  const int fd = ::memfd_create("unsealed", MFD_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, ShmRing::kHeaderBytes + 4096) == 0);
  CHECK_THROWS_AS(ShmSegment::open(std::to_string(::getpid()) + "/" + std::to_string(fd)),
                  ShmRingCorrupt);
  ::close(fd);
}

TEST_CASE("the reader refuses a header that is no ring, and positions a peer made up",
          "[shm]") {
  ShmSegment seg = ShmSegment::create(4096);
  ShmSegment view = ShmSegment::open(seg.name());
  {
    ShmRing out(seg, ShmRing::kProducer);
    std::memset(seg.data(), 0xff, 4);  // the magic
    CHECK_THROWS_AS(ShmRing(view, ShmRing::kConsumer), ShmRingCorrupt);
  }
  ShmRing out(seg, ShmRing::kProducer);
  ShmRing in(view, ShmRing::kConsumer);
  const uint8_t hello[5] = {'h', 'e', 'l', 'l', 'o'};
  REQUIRE(out.write_some(hello, 5) == 5);
  auto [p, n] = in.readable();
  REQUIRE(n == 5);
  CHECK(std::memcmp(p, hello, 5) == 0);
  in.consume(5);
  // The peer claims 1 MiB more than the ring holds.
  auto* head = reinterpret_cast<std::atomic<uint64_t>*>(static_cast<uint8_t*>(seg.data()) + 64);
  head->store(5 + (1 << 20));
  CHECK_THROWS_AS(in.readable(), ShmRingCorrupt);
  // And a reader position ahead of what was written.
  auto* tail = reinterpret_cast<std::atomic<uint64_t>*>(static_cast<uint8_t*>(seg.data()) + 128);
  tail->store(1000);
  CHECK_THROWS_AS(out.write_some(hello, 5), ShmRingCorrupt);
}

TEST_CASE("close() wakes a side waiting for data or room", "[shm]") {
  ShmSegment seg = ShmSegment::create(4096);
  ShmSegment view = ShmSegment::open(seg.name());
  ShmRing out(seg, ShmRing::kProducer);
  ShmRing in(view, ShmRing::kConsumer);
  std::atomic<bool> stop{false};
  std::atomic<bool> woke{false};
  std::thread waiter([&] {
    // Waits in bounded steps until the ring is closed.
    while (!in.wait_data(stop, 10s) && !in.closed()) {
    }
    woke = true;
  });
  out.close();
  waiter.join();
  CHECK(woke);
  CHECK(in.closed());
  // A full ring: wait_space returns at once once closed.
  std::vector<uint8_t> fill(4096, 1);
  CHECK(out.write_some(fill.data(), fill.size()) == 4096);
  CHECK_FALSE(out.wait_space(stop, 10s));
}

TEST_CASE("a side's spin shrinks to about a microsecond while the other side answers late, "
          "and grows back to catch quick answers",
          "[shm]") {
  SpinBudget spin;
  CHECK(spin.budget_ns() == SpinBudget::kMaxNs);
  // A peer that runs Python between messages: every wait ended 150 us in,
  // long after any spin would.
  for (int i = 0; i < 6; ++i) spin.slept(150'000);
  CHECK(spin.budget_ns() == SpinBudget::kMinNs);
  // Quick answers again (a ping-pong of 10 us): a spin of about twice that
  // would have caught them.
  for (int i = 0; i < 8; ++i) spin.slept(10'000);
  CHECK(spin.budget_ns() >= 19'000);
  CHECK(spin.budget_ns() <= 20'000);
  // Never beyond the longest spin, never below the shortest.
  for (int i = 0; i < 8; ++i) spin.slept(SpinBudget::kMaxNs);
  CHECK(spin.budget_ns() == SpinBudget::kMaxNs);
  for (int i = 0; i < 8; ++i) spin.slept(0);
  CHECK(spin.budget_ns() == SpinBudget::kMinNs);
}

TEST_CASE("the ring fuzz target survives 20,000 hostile writers", "[shm][fuzz]") {
  std::mt19937_64 random(20261125);
  std::vector<uint8_t> input;
  for (int i = 0; i < 20000; ++i) {
    input.resize(2 + 9 * (1 + random() % 40));
    for (auto& b : input) b = static_cast<uint8_t>(random());
    input[1] = (i % 8 == 0) ? input[1] : 0;  // mostly a valid header
    // Mostly plausible heads (op 1), reads (op 3) and writes (op 2).
    for (size_t at = 2; at + 9 <= input.size(); at += 9) {
      const uint8_t pick = static_cast<uint8_t>(random() % 10);
      input[at] = pick < 3 ? 1 : pick < 6 ? 3 : pick < 8 ? 2 : static_cast<uint8_t>(pick);
    }
    INFO("input " << i);
    REQUIRE(LLVMFuzzerTestOneInput(input.data(), input.size()) == 0);
  }
}
