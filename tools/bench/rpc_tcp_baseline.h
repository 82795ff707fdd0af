// The raw TCP baseline of `bench rpc`: blocking sockets with TCP_NODELAY
// between this process and a child (`bench rpc --tcp-server`), on 127.0.0.1
// or, with --hosts, across two network namespaces (Placement).
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
#include <vector>

namespace switchboard::bench {

inline constexpr size_t kPingBytes = 64;
inline constexpr size_t kBulkBytes = size_t{64} << 20;

// Where the two processes of a measurement run: the client (this process,
// its store) on `client`, the server on `server`, started with
// `server_prefix` before its command line (`ip netns exec B` with --hosts;
// empty on one host). Addresses are numeric IPv4.
struct Placement {
  std::string client = "127.0.0.1";
  std::string server = "127.0.0.1";
  std::vector<std::string> server_prefix;
};

struct TcpCounts {
  int warmup = 0;
  int round_trips = 0;
  int bulk_sends = 0;
};

// `bench rpc --tcp-server [--bind HOST]`: listens on HOST, prints "port=N",
// serves one ping-pong connection until the client closes it, then one bulk
// connection, then waits for its stdin to close. Every accept, send and recv
// times out after `socket_timeout`.
int run_tcp_server(std::chrono::seconds socket_timeout, const std::string& host);

// Starts `self_exe rpc --tcp-server` where `where` says and measures.
// Returns rtt_us_p50, rtt_us_p99, oneway_GBps and oneway_GBps_best.
std::map<std::string, double> run_tcp_baseline(const std::string& self_exe,
                                               const TcpCounts& counts,
                                               const Placement& where);

}  // namespace switchboard::bench
