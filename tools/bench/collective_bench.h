// `bench collective`: allreduce and alltoall of our GlooProcessGroup against
// PyTorch's ProcessGroupGloo, float32, 1 MiB and 64 MiB, 2 and 4 ranks.
//
//   bench collective [--rounds N]
//
// Each round launches both sides as fresh rank processes on 127.0.0.1
// (ours: this binary in its `--worker` mode; PyTorch's:
// tools/bench/torch_collective.py under the project venv's Python, PyTorch 2.11). Prints `# ...`
// header lines and `name=value` result lines on stdout.
#pragma once

#include <string>

#include "tools/bench/subcommand.h"

namespace switchboard::bench {

// Adds `bench collective` and its flags to `bench`. Its run returns 0 when
// the figures were measured, 1 when something failed. The hidden flag
// `--worker WORLD RANK PORT` is the rank mode the bench starts.
Subcommand add_collective_bench(CLI::App& bench, const std::string& argv0);

}  // namespace switchboard::bench
