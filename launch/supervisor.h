// The launcher's supervisor: one store server and N local workers,
// supervised until the workers are done, with torchrun's restart policy
// (--max-restarts). tools/launch is its main().
//
//  1. SIGCHLD, SIGINT, SIGTERM and SIGHUP are blocked and read from a
//     signalfd; SIGPIPE is ignored. Children get the original mask back.
//  2. The store server starts (`--host ADDR --port PORT --quiet`) and must
//     print "port=N" within 30 s.
//  3. Workers rank 0..N-1 start, each in its own process group, with RANK,
//     LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
//     SWITCHBOARD_STORE=tcp://ADDR:PORT, and torchrun's elastic variables
//     TORCHELASTIC_RESTART_COUNT (the attempt, see below),
//     TORCHELASTIC_MAX_RESTARTS (--max-restarts) and TORCHELASTIC_RUN_ID
//     (--job-id); stdin from /dev/null, in $BUILD_WORKING_DIRECTORY when
//     `bazel run` set it. Their stdout and stderr go through LineRelays
//     ("[rank N] ") unless prefixing is off.
//  4. One poll() loop over the signalfd and the output pipes; nothing sleeps.
//     - The first worker to exit non-zero or by a signal is logged ("launch:
//       rank 1 (pid 123) exited with status 3"); every other worker's process
//       group gets SIGTERM, then SIGKILL after the stop timeout. Then the
//       restart policy below decides: the next attempt, or exit 1.
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
//  All workers of one attempt exiting 0 gives exit 0.
//
// Restart policy (torchrun's --max_restarts). The workers run in attempts
// numbered 0, 1, ...; each worker of attempt n has
// TORCHELASTIC_RESTART_COUNT=n (init_method then puts the group of attempt n
// in a round of its own in the job's store). A worker failing in attempt n
// (exiting non-zero or by a signal) while n < --max-restarts is restartable:
// every worker of the attempt, on every node, is stopped as in step 4 (the
// store server stays), "launch: attempt 0 failed: rank 1 (pid 77) exited
// with status 3; restarting (1 of 2)" is logged, and once every node has
// reaped its workers, all of them start attempt n + 1, ranks and store
// unchanged. A failure in attempt --max-restarts ends the job as in step 4,
// naming the attempt ("... no restarts left (--max-restarts 2)"). Nothing
// else is restartable: a signal to a launcher, a node that did not arrive
// or stopped responding, a store server that died or cannot be reached,
// a program that cannot be executed end the job at once, restarts left or
// not. Workers stopped for a restart are not failures.
//
// Several nodes (--nnodes > 1): one launcher per node. Node 0 runs the store
// server (step 2) unless --store names one; the others skip step 2. Then
// every launcher connects to the store (retrying until --join-timeout),
// announces its node under "launch/<job id>/node/<R>" and waits, watching
// its signals, until every node has; one missing at --join-timeout records
// the job's failure ("node(s) 2 did not arrive within 30 s") and stops. The
// workers get global ranks (node_rank * nproc + local rank), WORLD_SIZE =
// nnodes * nproc, GROUP_RANK and NODE_RANK. While they run, every
// launcher looks at the store every 100 ms:
//   - the job's first failure that is not restartable (a signal to a
//     launcher, a missing node, a lost node, or a worker failing in the
//     last attempt) is recorded in "launch/<id>/failed" with compare_set,
//     so one wins; every other node sees it and stops its workers as in
//     step 4, and each launcher ends by naming it ("first failure: node 1
//     rank 3 (pid 77) exited with status 3", "first failure: attempt 2:
//     node 1 ..." when restarts were allowed), exit 1 (128 + S for the
//     launcher signalled);
//   - each attempt has keys of its own, under "launch/<id>/attempt/<n>/"
//     (rendezvous::launch_attempt_prefix): a worker failing records the
//     attempt's first failure in "failed" (compare_set); every node that
//     sees it stops its workers of the attempt and, once they are reaped,
//     sets "stopped/<R>"; a node starts attempt n + 1 once every node's
//     "stopped/<R>" is there. A node whose workers all exited 0 sets
//     "done/<R>" and stays: the job has succeeded once every node's
//     "done/<R>" is there; the attempt's "failed" appearing instead makes
//     it restart with the others (its workers are already reaped);
//   - a launcher whose job is over (succeeded or failed) and whose workers
//     are all reaped says so ("launch/<id>/done"); node 0 stops its store
//     server only once every node has (after a failure: every node that
//     arrived, or the stop timeout plus 2 s);
//   - a store that cannot be reached any more stops this node's workers;
//   - every launcher adds 1 to "launch/<id>/alive/<R>" each second, across
//     attempts; node 0 fails the job when a node that is not done has not
//     moved its counter for --node-timeout (30 s) by node 0's own clock
//     ("node 2 stopped responding"), so a launcher killed with SIGKILL or a
//     lost host does not leave node 0 waiting for ever.
//
// Thread safety: run_launcher() forks, so the process must have one thread.
#pragma once

#include "launch/options.h"

namespace switchboard::launch {

// Runs the job described by `options` (whose store_server is set when this
// launcher runs the store server), with its restarts, and returns the
// launcher's exit status: 0 every worker of one attempt exited 0, 1 a
// worker (of the last attempt), a node or the store server failed, 2 a
// refused secret file, 128 + S stopped by signal S. Logs to stderr,
// prefixed "launch: ". Throws std::system_error when a system call the
// launcher relies on fails (after killing and reaping the children it
// started).
int run_launcher(const LaunchOptions& options);

}  // namespace switchboard::launch
