"""PyTorch's RPC, the baseline of `bench rpc`: over its TensorPipe backend, or
over Switchboard's (--backend switchboard: PyTorch's API on both sides, the
package switchboard.torch_rpc found on --pythonpath).

Launcher mode (what the bench starts):

    torch_rpc.py --rtt-warmup N --rtt-calls N --window N --seconds S
                 --echo BYTES:WARMUP:ITERS [--echo ...]
                 [--backend tensorpipe|switchboard] [--pythonpath DIR]

starts a torch.distributed.TCPStore master on an ephemeral port of
127.0.0.1, prints `port=N` (which also tells the bench that torch imports)
and runs two worker processes, this script again with --role server|client
and --port N. The workers rendezvous through the launcher's store the way
torchelastic's workers use their agent's: with TORCHELASTIC_USE_AGENT_STORE
set, init_method "tcp://127.0.0.1:N" makes every rank a client of that store
(otherwise rank 0 would start its own store on that port, and the port would
have to be guessed free). Backend: TensorPipe (TP_SOCKET_IFNAME=lo) or
SWITCHBOARD (listen_address 127.0.0.1, no secret), num_worker_threads=16.

The server serves noop() and echo(tensor); the client measures exactly what
the bench's own client measures, with the same counts and statistics (see
tools/bench/rpc_bench.cc):
  rtt     rpc_sync(noop), p50/p99 (nearest rank) after warm-up, in us;
  async   rpc_async(noop) keeping WINDOW in flight (waiting for the oldest
          once the window is full) for SECONDS, after SECONDS/3 untimed;
  echo    rpc_sync(echo, float32 tensor of BYTES), 2 x BYTES / the median
          round trip, in GB/s (1e9 bytes);
  peak RSS  resource.getrusage(RUSAGE_SELF).ru_maxrss, after the echoes.
Both then call rpc.shutdown() (graceful).

Results go into the launcher's store, where the bench reads them with its
TcpStore client: each role sets "bench/<role>_results" (name=value lines)
and then "bench/<role>_done" ("ok", or its error); the launcher sets
"bench/torch_version", and sets a role's "done" itself when that worker
exits without. It exits when the bench closes its stdin or sends SIGTERM,
ending the workers.
"""
import argparse
import collections
import datetime
import math
import os
import resource
import select
import signal
import statistics
import subprocess
import sys
import time

HOST = "127.0.0.1"
STORE_TIMEOUT = datetime.timedelta(seconds=400)
RPC_TIMEOUT_S = 60
SHUTDOWN_TIMEOUT_S = 300  # the server waits for the client's measurements
WORKER_EXIT_TIMEOUT_S = 10


def parse_echo(text):
    nbytes, warmup, iters = (int(part) for part in text.split(":"))
    return nbytes, warmup, iters


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rtt-warmup", type=int, required=True)
    parser.add_argument("--rtt-calls", type=int, required=True)
    parser.add_argument("--window", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--echo", type=parse_echo, action="append", required=True)
    parser.add_argument("--backend", choices=("tensorpipe", "switchboard"), default="tensorpipe")
    parser.add_argument("--pythonpath", default="",
                        help="where switchboard.torch_rpc is (bazel-bin/python/pkg)")
    parser.add_argument("--role", choices=("server", "client"),
                        help="internal: run as this worker")
    parser.add_argument("--port", type=int, help="internal: the launcher's store")
    return parser.parse_args()


# ---- statistics, as rpc_bench.cc computes them ----

def percentile(samples, q):
    ordered = sorted(samples)
    rank = math.ceil(q * len(ordered))
    return ordered[max(rank, 1) - 1]


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


# ---- the served functions (pickled by reference: __main__ on both sides) ----

def noop():
    return None


def echo(tensor):
    return tensor


# ---- the client's measurements ----

def time_calls_us(warmup, iters, call):
    times = []
    for i in range(warmup + iters):
        start = time.perf_counter()
        call()
        if i >= warmup:
            times.append((time.perf_counter() - start) * 1e6)
    return times


def run_async_window(rpc, window, seconds):
    """Returns how many noop calls completed; see the docstring above."""
    in_flight = collections.deque()
    completed = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        if len(in_flight) >= window:
            in_flight.popleft().wait()
            completed += 1
        in_flight.append(rpc.rpc_async("server", noop))
    while in_flight:
        in_flight.popleft().wait()
        completed += 1
    return completed


def async_calls_per_s(rpc, window, seconds):
    run_async_window(rpc, window, seconds / 3)
    start = time.perf_counter()
    completed = run_async_window(rpc, window, seconds)
    return completed / (time.perf_counter() - start)


def echo_gbps(rpc, torch, nbytes, warmup, iters):
    numel = nbytes // 4
    tensor = torch.arange(numel, dtype=torch.float32)
    times = []
    for i in range(warmup + iters):
        start = time.perf_counter()
        reply = rpc.rpc_sync("server", echo, args=(tensor,))
        elapsed = time.perf_counter() - start
        if reply.numel() != numel or reply[-1].item() != tensor[-1].item():
            raise RuntimeError(f"echo of {numel} floats returned {reply.shape}")
        del reply  # freed outside the next timed call, as in the bench
        if i >= warmup:
            times.append(elapsed)
    return 2 * nbytes / statistics.median(times) / 1e9


def measure_client(args, rpc, torch):
    lines = []

    def add(name, value):
        lines.append(f"{name}={value:.6f}\n")

    rtt = time_calls_us(args.rtt_warmup, args.rtt_calls, lambda: rpc.rpc_sync("server", noop))
    add("rtt_us_p50", percentile(rtt, 0.50))
    add("rtt_us_p99", percentile(rtt, 0.99))
    add("async_calls_per_s", async_calls_per_s(rpc, args.window, args.seconds))
    for nbytes, warmup, iters in args.echo:
        add(f"echo_{nbytes >> 20}MiB_GBps", echo_gbps(rpc, torch, nbytes, warmup, iters))
    add("client_peak_rss_MiB", peak_rss_mib())
    return "".join(lines)


# ---- the two modes ----

def run_worker(args):
    import torch
    import torch.distributed as dist
    import torch.distributed.rpc as rpc

    store = dist.TCPStore(HOST, args.port, is_master=False, wait_for_workers=False,
                          timeout=STORE_TIMEOUT)
    role = args.role
    try:
        if args.backend == "switchboard":
            if args.pythonpath:
                sys.path.insert(0, args.pythonpath)
            import switchboard.torch_rpc as sbt
            options = sbt.SwitchboardRpcBackendOptions(
                num_worker_threads=16, rpc_timeout=RPC_TIMEOUT_S,
                init_method=f"tcp://{HOST}:{args.port}", listen_address=HOST)
            backend = rpc.BackendType.SWITCHBOARD
        else:
            options = rpc.TensorPipeRpcBackendOptions(
                num_worker_threads=16, rpc_timeout=RPC_TIMEOUT_S,
                init_method=f"tcp://{HOST}:{args.port}")
            backend = rpc.BackendType.TENSORPIPE
        rpc.init_rpc(role, backend=backend,
                     rank=0 if role == "server" else 1, world_size=2,
                     rpc_backend_options=options)
        results = measure_client(args, rpc, torch) if role == "client" else ""
        rpc.shutdown(graceful=True, timeout=SHUTDOWN_TIMEOUT_S)
        if role == "server":
            results = f"server_peak_rss_MiB={peak_rss_mib():.6f}\n"
        store.set(f"bench/{role}_results", results)
        store.set(f"bench/{role}_done", "ok")
    except Exception as error:  # reported to the bench through the store
        store.set(f"bench/{role}_done", f"torch {role}: {error!r}")
        raise


def worker_env():
    env = dict(os.environ)
    env.update(TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT="0",
               TP_SOCKET_IFNAME="lo")
    env.setdefault("GLOG_minloglevel", "1")  # no "agent is shutting down" INFO lines
    return env


def stdin_closed(timeout_s):
    """Waits up to timeout_s for stdin; True once it reached EOF."""
    ready, _, _ = select.select([sys.stdin], [], [], timeout_s)
    return bool(ready) and not os.read(sys.stdin.fileno(), 64)


def run_launcher(args):
    try:
        import torch
        import torch.distributed as dist
    except ImportError as error:
        sys.exit(f"torch_rpc.py: {error}")

    store = dist.TCPStore(HOST, 0, is_master=True, wait_for_workers=False,
                          timeout=STORE_TIMEOUT)
    store.set("bench/torch_version", torch.__version__)
    print(f"port={store.port}", flush=True)
    workers = {
        role: subprocess.Popen([sys.executable, __file__, *sys.argv[1:], f"--role={role}",
                                f"--port={store.port}"],
                               stdin=subprocess.DEVNULL, stdout=sys.stderr, env=worker_env())
        for role in ("server", "client")
    }
    # The bench's stop() closes stdin and sends SIGTERM at once: leave
    # through the finally below either way, so no worker outlives us.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while not stdin_closed(0.2):
            for role, worker in workers.items():
                done = f"bench/{role}_done"
                if worker.poll() is not None and not store.check([done]):
                    store.set(done, f"torch {role} exited with status {worker.returncode}")
    finally:
        for worker in workers.values():
            if worker.poll() is None:
                worker.terminate()
            try:
                worker.wait(timeout=WORKER_EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
    del store


def main():
    args = parse_args()
    if args.role is None:
        run_launcher(args)
    else:
        run_worker(args)


if __name__ == "__main__":
    main()
