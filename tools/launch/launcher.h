// The launcher's job: one store server and N local workers, supervised until
// the workers are done.
//
//  1. SIGCHLD, SIGINT, SIGTERM and SIGHUP are blocked and read from a
//     signalfd; SIGPIPE is ignored. Children get the original mask back.
//  2. The store server starts (`--host ADDR --port PORT --quiet`) and must
//     print "port=N" within 30 s.
//  3. Workers rank 0..N-1 start, each in its own process group, with RANK,
//     LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
//     SWITCHBOARD_STORE=tcp://ADDR:PORT, stdin from /dev/null, in
//     $BUILD_WORKING_DIRECTORY when `bazel run` set it. Their stdout and
//     stderr go through LineRelays ("[rank N] ") unless prefixing is off.
//  4. One poll() loop over the signalfd and the output pipes; nothing sleeps.
//     - The first worker to exit non-zero or by a signal is logged ("launch:
//       rank 1 (pid 123) exited with status 3"); every other worker's process
//       group gets SIGTERM, then SIGKILL after the stop timeout. Exit 1.
//     - SIGINT/SIGTERM/SIGHUP is forwarded to every worker's process group,
//       SIGKILL follows after the stop timeout. Exit 128 + the signal.
//     - A signal while stopping (a second Ctrl-C) SIGKILLs everything now.
//     - The store server dying before the workers are done stops them too.
//       Exit 1.
//  5. Once every worker has been reaped, the store server gets SIGTERM (it
//     is stopped last so workers can use the store while they shut down),
//     SIGKILL after the stop timeout. Output still in the pipes is passed on
//     until EOF, waiting at most the stop timeout once every child is gone
//     (a grandchild may hold a pipe open).
//  All workers exiting 0 gives exit 0.
//
// Thread safety: run_launcher() forks, so the process must have one thread.
#pragma once

#include "tools/launch/options.h"

namespace switchboard::launch {

// Runs the job described by `options` (whose store_server is set) and
// returns the launcher's exit status. Logs to stderr, prefixed "launch: ".
// Throws std::system_error when a system call the launcher relies on fails
// (after killing and reaping the children it started).
int run_launcher(const LaunchOptions& options);

}  // namespace switchboard::launch
