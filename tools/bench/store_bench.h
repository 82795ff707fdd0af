// `bench store`: throughput of our TcpStoreServer against PyTorch's TCPStore
// server, both driven by the same TcpStore client, and how many connections
// our server holds at once.
//
//   bench store [--seconds S]
//
// Starts both servers as child processes (tools/store_server/store_server,
// or $SB_STORE_SERVER; /usr/bin/python3 tools/bench/torch_store_server.py,
// or $SB_TORCH_STORE_SERVER for the script) and stops them before returning.
// Prints `# ...` header lines and `name=value` result lines on stdout.
#pragma once

#include <string>
#include <vector>

namespace switchboard::bench {

// Returns the process exit status: 0 when every figure was measured, 1 when
// something failed, 2 for bad arguments. `argv0` locates the runfiles.
int run_store_bench(const std::string& argv0, const std::vector<std::string>& args);

}  // namespace switchboard::bench
