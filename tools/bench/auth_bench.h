// `bench auth`: what the job secret costs. Connection setup with and
// without it (a TcpStore connecting to a server, and a worker joining a
// dynamic PIPE group, each including its handshake), and the round trip of
// a PIPE call on an authenticated connection against an unauthenticated one,
// all measured in this run, in one process, on 127.0.0.1.
//
//   bench auth [--rounds N]
//
// Prints `# ...` header lines and `name=value` result lines on stdout, with
// ratios (with / without).
#pragma once

#include <string>

#include "tools/bench/subcommand.h"

namespace switchboard::bench {

Subcommand add_auth_bench(CLI::App& bench, const std::string& argv0);

}  // namespace switchboard::bench
