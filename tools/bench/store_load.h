// The two store workloads of `bench store`, run against any TCPStore server
// (ours or PyTorch's) through the same TcpStore client code.
//
// Thread safety: each function starts and joins its own threads; call them
// from one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace switchboard::bench {

using Seconds = std::chrono::duration<double>;

struct LoadOptions {
  int clients = 1;                   // threads, one TcpStore connection each
  Seconds warmup{0.25};              // load that is run but not counted
  Seconds measure{2.0};              // the counted part
  std::chrono::milliseconds timeout{30'000};  // every TcpStore's timeout
};

struct LoadResult {
  uint64_t ops = 0;      // completed set/get/add calls, all clients together
  uint64_t all_ops = 0;  // the same, warm-up included
  double seconds = 0;    // from the end of warm-up until the last client stopped
  double ops_per_s() const { return seconds > 0 ? ops / seconds : 0; }
};

// Throughput: `clients` threads, each looping set(key, 16 bytes), get(key),
// add(counter, 1) on keys of its own. A set counts when it is written (the
// protocol has no reply); the get behind it on the same connection waits for
// the server to have applied it. Throws what the first failing client threw.
LoadResult run_store_load(const std::string& host, uint16_t port,
                          const LoadOptions& options);

struct HeldOptions {
  int threads = 8;
  int per_thread = 125;                       // connections each thread holds
  // Each thread's budget for opening its connections, and again for using
  // them; what is not done in time counts as failed.
  std::chrono::milliseconds timeout{30'000};
};

struct HeldResult {
  int opened = 0;          // connections open at once (none closes earlier)
  int completed = 0;       // connections whose set, get and add all succeeded
  double seconds = 0;      // wall time: open all, use all, close all
  std::string first_error; // empty when nothing failed
};

// Held connections: every thread opens its connections and keeps them; once
// all threads have opened theirs, each connection does one set, get and add;
// once all are done, everything closes. Failures are counted, not thrown.
HeldResult run_held_connections(const std::string& host, uint16_t port,
                                const HeldOptions& options);

}  // namespace switchboard::bench
