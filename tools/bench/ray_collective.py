"""`bench ray`'s measuring side: Ray's collective API (ray.util.collective) on
SWITCHBOARD and on Ray's own GLOO, in one run, on a local Ray.

For each group size (actors on this host, num_cpus=0 so that any number fit)
and each backend, it makes the actors, creates the group with Ray's
init_collective_group, and times, inside every actor, `iterations` calls of
one op on float32 arrays (after warm-up calls, with a barrier before the
clock starts). An op's time is the slowest actor's, the best of `repeats`
runs. Printed:

  ray_<backend>_<op>_<size>_<n>actors_us=<time of one call, µs>
  ray_<backend>_<op>_<size>_<n>actors_gbps=<array bytes / time, GB/s>
  ray_switchboard_vs_gloo_<op>_<size>_<n>actors=<GLOO's time / SWITCHBOARD's>

A ratio above 1 means SWITCHBOARD is faster. Ops: allreduce of 4 KiB, 1 MiB
and 64 MiB, allgather and broadcast of 1 MiB (each rank's array).

  ray_collective.py [--quick] [--actors 2,4] [--backends GLOO,SWITCHBOARD]
"""

import argparse
import os
import sys
import time

import numpy as np
import ray
import ray.util.collective as col

SIZES = {"4KiB": 4 << 10, "1MiB": 1 << 20, "64MiB": 64 << 20}
CASES = [("allreduce", "4KiB"), ("allreduce", "1MiB"), ("allreduce", "64MiB"),
         ("allgather", "1MiB"), ("broadcast", "1MiB")]


def iterations(size, quick):
    n = {"4KiB": 500, "1MiB": 40, "64MiB": 4}[size]
    return max(2, n // 10) if quick else n


@ray.remote(num_cpus=0)
class Member:
    def __init__(self):
        import switchboard.ray  # noqa: F401  (registers SWITCHBOARD here)

    def join(self, world, rank, backend, group):
        col.init_collective_group(world, rank, backend, group)

    def leave(self, group):
        col.destroy_collective_group(group)

    def time_op(self, group, op, nbytes, iters, warmup):
        world = col.get_collective_group_size(group)
        x = np.ones(nbytes // 4, dtype=np.float32)
        outs = [np.empty_like(x) for _ in range(world)]

        def call():
            if op == "allreduce":
                col.allreduce(x, group)
            elif op == "allgather":
                col.allgather(outs, x, group)
            else:
                col.broadcast(x, 0, group)

        for _ in range(warmup):
            call()
        col.barrier(group)
        start = time.perf_counter()
        for _ in range(iters):
            call()
        return (time.perf_counter() - start) / iters


def measure(backend, world, quick, repeats):
    members = [Member.remote() for _ in range(world)]
    group = f"bench_{backend.lower()}_{world}"
    ray.get([m.join.remote(world, r, backend, group) for r, m in enumerate(members)])
    seconds = {}
    for op, size in CASES:
        nbytes = SIZES[size]
        iters = iterations(size, quick)
        best = None
        for _ in range(repeats):
            t = max(ray.get([m.time_op.remote(group, op, nbytes, iters, max(1, iters // 10))
                             for m in members]))
            best = t if best is None else min(best, t)
        seconds[(op, size)] = best
        print(f"ray_{backend.lower()}_{op}_{size}_{world}actors_us={best * 1e6:.1f}")
        print(f"ray_{backend.lower()}_{op}_{size}_{world}actors_gbps={nbytes / best / 1e9:.3f}",
              flush=True)
    ray.get([m.leave.remote(group) for m in members])
    for m in members:
        ray.kill(m)
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls: a smoke run")
    parser.add_argument("--actors", default="2,4", help="group sizes, comma-separated")
    parser.add_argument("--backends", default="GLOO,SWITCHBOARD")
    args = parser.parse_args()
    import switchboard.ray  # noqa: F401  (the driver's registry)
    worlds = [int(w) for w in args.actors.split(",")]
    backends = args.backends.upper().split(",")
    print(f"# ray {ray.__version__}, numpy {np.__version__}, {os.cpu_count()} cores; "
          f"actors on one host (127.0.0.1), num_cpus=0")
    ray.init(num_cpus=max(worlds), include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", ""),
                                       "GLOO_SOCKET_IFNAME": "lo",
                                       "SWITCHBOARD_IFNAME": "127.0.0.1"}})
    repeats = 1 if args.quick else 3
    ok = True
    for world in worlds:
        results = {}
        for backend in backends:
            try:
                results[backend] = measure(backend, world, args.quick, repeats)
            except Exception as e:  # noqa: BLE001  (one side failing still reports the other)
                print(f"ray_{backend.lower()}_{world}actors: failed ({type(e).__name__}: {e})")
                ok = False
        if "GLOO" in results and "SWITCHBOARD" in results:
            for op, size in CASES:
                ratio = results["GLOO"][(op, size)] / results["SWITCHBOARD"][(op, size)]
                print(f"ray_switchboard_vs_gloo_{op}_{size}_{world}actors={ratio:.2f}", flush=True)
    ray.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
