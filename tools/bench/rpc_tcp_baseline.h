// The raw TCP baseline of `bench rpc`: blocking sockets with TCP_NODELAY on
// 127.0.0.1 between this process and a child (`bench rpc --tcp-server`).
//   rtt:    kPingBytes ping-pong; p50 and p99 in µs after a warm-up;
//   oneway: kBulkBytes sends, each acknowledged with one byte; GB/s, the
//           median and the best (after one untimed send).
//
// Errors: std::runtime_error naming the socket call that failed or timed
// out. Thread safety: none needed; one caller.
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <string>

namespace switchboard::bench {

inline constexpr size_t kPingBytes = 64;
inline constexpr size_t kBulkBytes = size_t{64} << 20;

struct TcpCounts {
  int warmup = 0;
  int round_trips = 0;
  int bulk_sends = 0;
};

// `bench rpc --tcp-server`: prints "port=N", serves one ping-pong connection
// until the client closes it, then one bulk connection, then waits for its
// stdin to close. Every accept, send and recv times out after
// `socket_timeout`.
int run_tcp_server(std::chrono::seconds socket_timeout);

// Starts `self_exe rpc --tcp-server` and measures. Returns rtt_us_p50,
// rtt_us_p99, oneway_GBps and oneway_GBps_best.
std::map<std::string, double> run_tcp_baseline(const std::string& self_exe,
                                               const TcpCounts& counts);

}  // namespace switchboard::bench
