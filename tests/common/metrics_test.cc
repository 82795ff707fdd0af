// The metrics core: counters, the latency histogram's buckets (a sample
// equal to a bound belongs to that bound's bucket), quantiles as
// Prometheus' histogram_quantile() estimates them, and merging.
#include "common/metrics.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>
#include <vector>

using switchboard::Counter;
using switchboard::HistogramSnapshot;
using switchboard::kLatencyBucketBounds;
using switchboard::kLatencyBuckets;
using switchboard::LatencyHistogram;
using namespace std::chrono_literals;

TEST_CASE("a counter adds from several threads without losing counts", "[metrics]") {
  Counter c;
  CHECK(c.value() == 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) c.add();
    });
  }
  for (auto& t : threads) t.join();
  c.add(5);
  CHECK(c.value() == 40005);
}

TEST_CASE("histogram samples land in the bucket of the first bound at or above them",
          "[metrics]") {
  LatencyHistogram h;
  h.record(0ns);       // bucket 0 (<= 50 us)
  h.record(50us);      // bucket 0: equal to its bound
  h.record(51us);      // bucket 1 (<= 100 us)
  h.record(1ms);       // bucket 4 (<= 1 ms)
  h.record(-5ms);      // negative: 0, bucket 0
  h.record(61s);       // above every bound: the last bucket
  const HistogramSnapshot s = h.snapshot();
  CHECK(s.count == 6);
  CHECK(s.counts[0] == 3);
  CHECK(s.counts[1] == 1);
  CHECK(s.counts[4] == 1);
  CHECK(s.counts[kLatencyBuckets - 1] == 1);
  CHECK(s.sum_seconds == Approx(0.00005 + 0.000051 + 0.001 + 61.0));
}

TEST_CASE("a histogram kept under a lock (HistogramSnapshot::record) buckets as the atomic one",
          "[metrics]") {
  LatencyHistogram atomic;
  HistogramSnapshot plain;
  for (std::chrono::nanoseconds sample : {0ns, 50000ns, 51000ns, 1000000ns, -5000000ns,
                                          61000000000ns, 2500000ns}) {
    atomic.record(sample);
    plain.record(sample);
  }
  const HistogramSnapshot s = atomic.snapshot();
  CHECK(plain.count == 7);
  CHECK(plain.counts == s.counts);
  CHECK(plain.sum_seconds == Approx(s.sum_seconds));
  CHECK(plain.counts[5] == 1);  // 2.5 ms: equal to the bound of (1 ms, 2.5 ms]
}

TEST_CASE("quantiles interpolate within the bucket that holds the rank", "[metrics]") {
  LatencyHistogram h;
  HistogramSnapshot empty = h.snapshot();
  CHECK(empty.quantile(0.5) == 0.0);
  // 100 samples in (1 ms, 2.5 ms]: the rank q * 100 lies q of the way in.
  for (int i = 0; i < 100; ++i) h.record(2ms);
  HistogramSnapshot s = h.snapshot();
  CHECK(s.quantile(0.5) == Approx(0.001 + 0.0015 * 0.5));
  CHECK(s.quantile(0.99) == Approx(0.001 + 0.0015 * 0.99));
  CHECK(s.quantile(0.0) == Approx(0.001));
  // 98 fast samples and 2 slow ones: p50 among the fast, p99 among the slow.
  LatencyHistogram mixed;
  for (int i = 0; i < 98; ++i) mixed.record(40us);  // (0, 50 us]
  for (int i = 0; i < 2; ++i) mixed.record(400ms);  // (250 ms, 500 ms]
  HistogramSnapshot m = mixed.snapshot();
  CHECK(m.quantile(0.5) == Approx(0.00005 * 50.0 / 98.0));
  CHECK(m.quantile(0.99) == Approx(0.25 + 0.25 * 0.5));
  // A rank in the +Inf bucket reports the largest finite bound.
  LatencyHistogram slow;
  slow.record(100s);
  CHECK(slow.snapshot().quantile(0.5) == kLatencyBucketBounds.back());
}

TEST_CASE("snapshots merge bucket by bucket", "[metrics]") {
  LatencyHistogram a;
  LatencyHistogram b;
  a.record(40us);
  b.record(40us);
  b.record(3ms);
  HistogramSnapshot s = a.snapshot();
  s.merge(b.snapshot());
  CHECK(s.count == 3);
  CHECK(s.counts[0] == 2);
  CHECK(s.counts[6] == 1);  // (2.5 ms, 5 ms]
  CHECK(s.sum_seconds == Approx(0.00008 + 0.003));
}
