#!/usr/bin/env python3
"""PyTorch's RPC API over TensorPipe, and over SWITCHBOARD, measured as
tools/bench/cuda_echo measures PIPE.

Two processes on one host, one GPU (device map cuda:0 -> cuda:0): "w0" calls
"echo" (which returns its tensor) on "w1" in a loop after a warm-up, for
int32 tensors of 4 KiB, 1 MiB, 64 MiB and 256 MiB on cuda:0 (and on the CPU),
and prints name=value lines, per backend (torch_ = TensorPipe,
torch_switchboard_ = SWITCHBOARD):
  <backend>_cuda_echo_<size>_p50_us, <backend>_cuda_echo_<size>_GBps
  <backend>_cpu_echo_<size>_p50_us,  <backend>_cpu_echo_<size>_GBps
and, with both, switchboard_vs_tensorpipe_<cuda|cpu>_echo_<size>_GBps=<ratio>
(above 1: SWITCHBOARD is faster) and ..._p50_us=<ratio> (below 1: faster). GBps counts the bytes there and back
(2 x size x calls / seconds of the loop), as cuda_echo does. Each size's
reply is checked equal to what was sent once, outside the timed loop.

Usage: python3 tools/bench/torch_cuda_echo.py [--quick] [--cpu-only]
           [--backend tensorpipe|switchboard|both]     (default: tensorpipe)
SWITCHBOARD needs the package on the path (PYTHONPATH: the directory that
holds switchboard/, e.g. bazel-bin/python/pkg, or the unpacked wheel).
"""
import os
import socket
import sys
import time

import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp

SIZES = [("4KiB", 4 << 10, 2000), ("1MiB", 1 << 20, 300), ("64MiB", 64 << 20, 30),
         ("256MiB", 256 << 20, 10)]


def echo(t):
    return t


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, port, device, quick, backend, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    peer = "w1" if rank == 0 else "w0"
    if backend == "switchboard":
        import switchboard.torch_rpc as sbt
        options = sbt.SwitchboardRpcBackendOptions(
            num_worker_threads=8, rpc_timeout=120, init_method=f"tcp://127.0.0.1:{port}",
            listen_address="127.0.0.1")
        if device != "cpu":
            options.set_device_map(peer, {"cuda:0": "cuda:0"})
        kind, prefix = rpc.BackendType.SWITCHBOARD, "torch_switchboard"
    else:
        options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=120)
        if device != "cpu":
            options.set_device_map(peer, {0: 0})
        kind, prefix = rpc.BackendType.TENSORPIPE, "torch"
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=2, backend=kind, rpc_backend_options=options)
    if rank == 0:
        prefix += "_cpu_echo" if device == "cpu" else "_cuda_echo"
        lines = []
        for name, nbytes, calls in SIZES:
            calls = max(3, calls // 10) if quick else calls
            t = torch.arange(nbytes // 4, dtype=torch.int32, device=device)
            back = rpc.rpc_sync("w1", echo, args=(t,))
            assert torch.equal(back, t), f"{prefix}: the {name} echo came back different"
            for _ in range(min(calls, 5)):
                rpc.rpc_sync("w1", echo, args=(t,))
            times = []
            start = time.perf_counter()
            for _ in range(calls):
                before = time.perf_counter()
                back = rpc.rpc_sync("w1", echo, args=(t,))
                if device != "cpu":
                    torch.cuda.current_stream().synchronize()
                times.append((time.perf_counter() - before) * 1e6)
                assert back.numel() == t.numel() and str(back.device) == str(t.device)
            seconds = time.perf_counter() - start
            times.sort()
            lines.append(f"{prefix}_{name}_p50_us={times[len(times) // 2]:.1f}")
            lines.append(f"{prefix}_{name}_GBps={2.0 * nbytes * calls / seconds / 1e9:.4f}")
        out.put(lines)
    rpc.shutdown()


def run(device, quick, backend):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, port, device, quick, backend, out))
             for r in range(2)]
    for p in procs:
        p.start()
    lines = out.get(timeout=600)
    for p in procs:
        p.join(timeout=120)
    for line in lines:
        print(line, flush=True)
    return dict(line.split("=") for line in lines)


def main():
    quick = "--quick" in sys.argv
    backend = "tensorpipe"
    if "--backend" in sys.argv:
        backend = sys.argv[sys.argv.index("--backend") + 1]
    backends = ["tensorpipe", "switchboard"] if backend == "both" else [backend]
    print(f"# torch_cuda_echo: PyTorch {torch.__version__}, {' and '.join(backends)}", flush=True)
    devices = ["cpu"]
    if "--cpu-only" not in sys.argv:
        if torch.cuda.is_available():
            devices.append("cuda:0")
        else:
            print("skipped: torch sees no CUDA device", flush=True)
    figures = {}
    for device in devices:
        for b in backends:
            figures.update(run(device, quick, b))
    if len(backends) == 2:
        for name, value in sorted(figures.items()):
            if name.startswith("torch_switchboard_") and name.endswith(("_GBps", "_p50_us")):
                theirs = figures.get("torch_" + name[len("torch_switchboard_"):])
                if theirs and float(theirs) > 0:
                    ratio = float(value) / float(theirs)
                    print(f"switchboard_vs_tensorpipe_{name[len('torch_switchboard_'):]}="
                          f"{ratio:.2f}", flush=True)


if __name__ == "__main__":
    main()
