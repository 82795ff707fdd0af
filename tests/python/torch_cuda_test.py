"""CUDA tensors through torch.distributed.rpc on SWITCHBOARD, on one GPU: two
workers with the device map cuda:0 -> cuda:0 (as a GPU machine with one GPU
allows), run by tools/gpu_check on the GPU machine. Without a CUDA device
every case prints "skipped: ..." (tools/test runs it here too).

- echo of 4 KiB, 1 MiB, 64 MiB and 256 MiB CUDA tensors: the reply is on
  cuda:0 and equal to what was sent;
- streams, the promise TensorPipe keeps: a tensor written on the caller's
  current stream (a side stream, behind a long kernel) is read only once
  written; a UDF's result written on its current stream likewise; and a
  reply's tensor is ready on the caller's current stream when the future
  completes. Each fails, with the wrong values, if the backend reads or
  hands over a tensor before the stream's work is done.
"""
import os
import sys
import tempfile
import unittest

import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp

import switchboard.torch_rpc as sbt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from summary import run_and_summarize  # noqa: E402

# A kernel long enough that a read racing it sees the old values: about
# 100 ms of GPU time (torch.cuda._sleep counts cycles).
SLEEP_CYCLES = 200_000_000
SIZES = [4 << 10, 1 << 20, 64 << 20, 256 << 20]


def echo(t):
    return t


def plus_one_after_a_long_kernel(t):
    # Written on this function's current stream, behind a long kernel.
    torch.cuda._sleep(SLEEP_CYCLES)
    return t + 1


def _options(init, peer):
    options = sbt.SwitchboardRpcBackendOptions(init_method=init, listen_address="127.0.0.1",
                                               rpc_timeout=120)
    options.set_device_map(peer, {"cuda:0": "cuda:0"})
    return options


def _worker(rank, init):
    peer = f"w{1 - rank}"
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=2, backend=rpc.BackendType.SWITCHBOARD,
                 rpc_backend_options=_options(init, peer))
    if rank == 0:
        for nbytes in SIZES:
            t = torch.arange(nbytes // 4, dtype=torch.int32, device="cuda:0")
            back = rpc.rpc_sync(peer, echo, args=(t,))
            assert back.device == torch.device("cuda:0"), back.device
            assert torch.equal(back, t), f"echo of {nbytes} bytes came back different"
        # The caller's side stream: the tensor is written there behind a long
        # kernel; the call must read what the stream writes.
        side = torch.cuda.Stream()
        x = torch.zeros(1 << 20, dtype=torch.float32, device="cuda:0")
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            torch.cuda._sleep(SLEEP_CYCLES)
            x.fill_(7)
            back = rpc.rpc_sync(peer, echo, args=(x,))
            assert torch.equal(back, torch.full_like(x, 7)), "read before the side stream wrote"
        # The callee's result, written behind a long kernel on its stream.
        y = torch.full((1 << 20,), 3.0, device="cuda:0")
        back = rpc.rpc_sync(peer, plus_one_after_a_long_kernel, args=(y,))
        assert torch.equal(back, torch.full_like(y, 4.0)), "the reply was read before it was written"
        # The reply is ready on the caller's current stream (a side stream).
        with torch.cuda.stream(side):
            fut = rpc.rpc_async(peer, plus_one_after_a_long_kernel, args=(y,))
            z = fut.wait() * 2
            assert torch.equal(z, torch.full_like(y, 8.0)), "the reply was not ready on the stream"
    rpc.shutdown()


class CudaTensorsOnSwitchboard(unittest.TestCase):
    def setUp(self):
        if not torch.cuda.is_available():
            self.skipTest("torch sees no CUDA device")

    def test_echo_and_streams_on_one_gpu(self):
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(_worker, args=("file://" + os.path.join(tmp, "rendezvous"),), nprocs=2,
                     join=True)


if __name__ == "__main__":
    sys.exit(run_and_summarize(
        unittest.defaultTestLoader.loadTestsFromTestCase(CudaTensorsOnSwitchboard)))
