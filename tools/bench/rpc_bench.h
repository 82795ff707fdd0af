// `bench rpc`: our RPC backends against raw TCP and PyTorch's RPC
// (TensorPipe), every figure between two processes on 127.0.0.1.
//
//   bench rpc [--quick]
//
// Measures, in one run: a raw TCP baseline (ping-pong round trip, one-way
// bandwidth), then for each built-in backend (PIPE, PROCESS_GROUP; skipped
// with the reason when not registered) and for PyTorch 1.13's TensorPipe
// backend (the project venv's Python, PyTorch 2.11: tools/bench/torch_rpc.py, or $SB_TORCH_RPC for
// the script): rpc_sync round trip, rpc_async throughput with a window of
// calls in flight, echo of 1 MiB and 64 MiB float32 tensors, and peak RSS.
// Then prints the ratios and whether each target was met. `--quick` shrinks
// every count, for a smoke run of a few seconds per side.
//
// Every child process has a deadline; a child that misses it is killed.
// Prints `# ...` header lines and `name=value` result lines on stdout.
#pragma once

#include <string>

#include "tools/bench/subcommand.h"

namespace switchboard::bench {

// Adds `bench rpc` and its flags to `bench`. Its run returns 0 when every
// side ran, 1 when one failed. The hidden flags `--tcp-server` and
// `--worker BACKEND server|client PORT` (with `--quick`) are the child
// processes the bench starts.
Subcommand add_rpc_bench(CLI::App& bench, const std::string& argv0);

}  // namespace switchboard::bench
