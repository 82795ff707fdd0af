// `bench collective`: allreduce and alltoall of our GlooProcessGroup against
// PyTorch's ProcessGroupGloo, float32, 1 MiB and 64 MiB, 2 and 4 ranks.
//
//   bench collective [--rounds N]
//
// Each round launches both sides as fresh rank processes on 127.0.0.1
// (ours: this binary in its `--worker` mode; PyTorch's:
// tools/bench/torch_collective.py under /usr/bin/python3). Prints `# ...`
// header lines and `name=value` result lines on stdout.
#pragma once

#include <string>
#include <vector>

namespace switchboard::bench {

// Same contract as run_store_bench; `--worker WORLD RANK PORT` is the
// internal rank mode.
int run_collective_bench(const std::string& argv0, const std::vector<std::string>& args);

}  // namespace switchboard::bench
