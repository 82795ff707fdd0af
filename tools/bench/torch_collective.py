"""PyTorch's ProcessGroupGloo, the baseline of `bench collective`.

Launcher mode (what the bench starts):

    torch_collective.py --world N --case OP:BYTES:WARMUP:ITERS [--case ...]

starts a torch.distributed.TCPStore master on an ephemeral port of
127.0.0.1, prints `port=N`, and runs N rank processes (this script again,
with --rank) that join one Gloo group over loopback. For each case, in
order, every rank runs WARMUP untimed ops, a barrier, then ITERS timed ops
of OP ("allreduce": SUM in place; "alltoall": all_to_all_single) on a
float32 tensor of BYTES bytes. Each timed op is time.perf_counter() around
the call, which returns once the op finished (as the bench's own ranks time
op + wait()).

Results go into the TCPStore, where the bench reads them with its TcpStore
client: rank 0 sets "bench/<OP>_<BYTES>" to "<median ms> <min ms>", then
"bench/done" to "ok"; a rank that fails sets "bench/done" to its error. The
launcher sets "bench/torch_version". It then blocks until stdin closes (the
bench holds the other end) and exits, ending its ranks.
"""
import argparse
import datetime
import os
import signal
import statistics
import subprocess
import sys
import time

HOST = "127.0.0.1"
TIMEOUT = datetime.timedelta(seconds=300)


def parse_case(text):
    op, nbytes, warmup, iters = text.split(":")
    if op not in ("allreduce", "alltoall"):
        raise argparse.ArgumentTypeError(f"unknown op {op!r}")
    return op, int(nbytes), int(warmup), int(iters)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--case", type=parse_case, action="append", required=True)
    parser.add_argument("--rank", type=int, help="internal: run as this rank")
    parser.add_argument("--port", type=int, help="internal: the launcher's store")
    return parser.parse_args()


def rank_env():
    """One thread per rank, loopback for Gloo: the bench's own ranks get the
    same (they bind 127.0.0.1 and run no thread pools)."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    return env


def time_case(dist, torch, world, op, nbytes, warmup, iters):
    """Returns the per-op times in ms of `iters` timed ops."""
    numel = nbytes // 4
    tensor = torch.zeros(numel, dtype=torch.float32)
    output = torch.zeros(numel, dtype=torch.float32)
    if op == "allreduce":
        run = lambda: dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    else:
        assert numel % world == 0, "dim 0 must divide by the world size"
        run = lambda: dist.all_to_all_single(output, tensor)
    for _ in range(warmup):
        run()
    dist.barrier()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def run_rank(args):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.TCPStore(HOST, args.port, is_master=False, timeout=TIMEOUT)
    try:
        dist.init_process_group("gloo", store=store, rank=args.rank,
                                world_size=args.world, timeout=TIMEOUT)
        for op, nbytes, warmup, iters in args.case:
            times = time_case(dist, torch, args.world, op, nbytes, warmup, iters)
            if args.rank == 0:
                store.set(f"bench/{op}_{nbytes}",
                          f"{statistics.median(times):.6f} {min(times):.6f}")
        dist.barrier()
        if args.rank == 0:
            store.set("bench/done", "ok")
    except Exception as error:  # reported to the bench through the store
        store.set("bench/done", f"torch rank {args.rank}: {error!r}")
        raise


def run_launcher(args):
    import torch
    import torch.distributed as dist

    store = dist.TCPStore(HOST, 0, is_master=True, wait_for_workers=False,
                          timeout=TIMEOUT)
    store.set("bench/torch_version", torch.__version__)
    print(f"port={store.port}", flush=True)
    cases = [f"--case={':'.join(map(str, case))}" for case in args.case]
    ranks = [
        subprocess.Popen([sys.executable, __file__, f"--world={args.world}",
                          f"--rank={rank}", f"--port={store.port}", *cases],
                         stdin=subprocess.DEVNULL, env=rank_env())
        for rank in range(args.world)
    ]
    # The bench's stop() closes stdin and sends SIGTERM at once: exit through
    # the finally below either way, so no rank outlives us.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        sys.stdin.read()  # returns when the bench closes our stdin
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.terminate()
            rank.wait()
    del store


def main():
    args = parse_args()
    if args.rank is None:
        run_launcher(args)
    else:
        run_rank(args)


if __name__ == "__main__":
    main()
