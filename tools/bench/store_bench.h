// `bench store`: throughput of our TcpStoreServer against PyTorch's TCPStore
// server, both driven by the same TcpStore client, and how many connections
// our server holds at once.
//
//   bench store [--seconds S]
//
// Starts both servers as child processes (tools/store_server/store_server,
// or $SB_STORE_SERVER; the project venv's Python
// tools/torch_store_server/torch_store_server.py, or $SB_TORCH_STORE_SERVER
// for the script) and stops them before returning.
// Prints `# ...` header lines and `name=value` result lines on stdout.
#pragma once

#include <string>

#include "tools/bench/subcommand.h"

namespace switchboard::bench {

// Adds `bench store` and its flags to `bench`. Its run returns 0 when every
// figure was measured, 1 when something failed. `argv0` locates the
// runfiles.
Subcommand add_store_bench(CLI::App& bench, const std::string& argv0);

}  // namespace switchboard::bench
