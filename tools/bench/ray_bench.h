// `bench ray`: Ray's collective API (ray.util.collective) on the SWITCHBOARD
// backend (switchboard.ray) against Ray's own GLOO, in one run: allreduce of
// 4 KiB, 1 MiB and 64 MiB float32 and allgather and broadcast of 1 MiB,
// among 2 and 4 actors on this host.
//
//   bench ray [--quick] [--actors 2,4]
//
// The measuring runs in Python (tools/bench/ray_collective.py, under the
// project venv's Python with Ray 2.60 and PyTorch 2.11, the package from
// `bazel build -c opt //python:package`). Prints `# ...` header lines and
// `name=value` result lines on stdout, among them
// `ray_switchboard_vs_gloo_<op>_<size>_<n>actors=<ratio>` (above 1:
// SWITCHBOARD is faster).
#pragma once

#include <string>

#include "tools/bench/subcommand.h"

namespace switchboard::bench {

// Adds `bench ray` and its flags to `bench`. Its run returns the script's
// exit status: 0 when every figure was measured, 1 when a side failed, 2
// when the package or the venv is missing.
Subcommand add_ray_bench(CLI::App& bench, const std::string& argv0);

}  // namespace switchboard::bench
