#!/usr/bin/env python3
"""PyTorch's TensorPipe RPC, measured as tools/bench/cuda_echo measures PIPE.

Two processes on one host, one GPU (device map cuda:0 -> cuda:0): "w0" calls
"echo" (which returns its tensor) on "w1" in a loop after a warm-up, for
int32 tensors of 4 KiB, 1 MiB, 64 MiB and 256 MiB on cuda:0 (and on the CPU),
and prints name=value lines:
  torch_cuda_echo_<size>_p50_us, torch_cuda_echo_<size>_GBps
  torch_cpu_echo_<size>_p50_us,  torch_cpu_echo_<size>_GBps
GBps counts the bytes there and back (2 x size x calls / seconds of the
loop), as cuda_echo does.

Usage: python3 tools/bench/torch_cuda_echo.py [--quick] [--cpu-only]
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


def worker(rank, port, device, quick, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=120)
    if device != "cpu":
        options.set_device_map("w1" if rank == 0 else "w0", {0: 0})
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=2, rpc_backend_options=options)
    if rank == 0:
        prefix = "torch_cpu_echo" if device == "cpu" else "torch_cuda_echo"
        lines = []
        for name, nbytes, calls in SIZES:
            calls = max(3, calls // 10) if quick else calls
            t = torch.zeros(nbytes // 4, dtype=torch.int32, device=device)
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
            lines.append(f"{prefix}_{name}_GBps={2.0 * nbytes * calls / seconds / 1e9:.2f}")
        out.put(lines)
    rpc.shutdown()


def run(device, quick):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, port, device, quick, out)) for r in range(2)]
    for p in procs:
        p.start()
    lines = out.get(timeout=600)
    for p in procs:
        p.join(timeout=120)
    for line in lines:
        print(line, flush=True)


def main():
    quick = "--quick" in sys.argv
    print(f"# torch_cuda_echo: PyTorch {torch.__version__}, TensorPipe RPC", flush=True)
    run("cpu", quick)
    if "--cpu-only" in sys.argv:
        return
    if not torch.cuda.is_available():
        print("skipped: torch sees no CUDA device", flush=True)
        return
    run("cuda:0", quick)


if __name__ == "__main__":
    main()
