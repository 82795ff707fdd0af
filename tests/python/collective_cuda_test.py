"""CUDA tensors through switchboard.collective over Switchboard's NCCL
backend, on one GPU: a group of one rank (NCCL refuses two ranks of one
group on one device), every op written in place on the device, and a CPU
tensor refused by the NCCL group naming both devices. tools/gpu_check runs
it on the GPU machine (torch, no numpy); without a CUDA device every case
prints "skipped: ...".
"""

import os
import sys
import unittest

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from collective_ranks import run_ranks  # noqa: E402
from summary import run_and_summarize  # noqa: E402


def ops_on_cuda(col, rank, world):
    """Runs in the rank's process: each op on tensors that kernels on torch's
    current stream wrote just before it."""
    import torch
    out = {}
    t = torch.arange(4, dtype=torch.float32, device="cuda") * 2
    col.allreduce(t, group_name="g")
    out["allreduce"] = (t.device.type, t.tolist())
    gathered = [torch.zeros(3, dtype=torch.int64, device="cuda") for _ in range(world)]
    col.allgather(gathered, torch.arange(3, device="cuda") + 7, group_name="g")
    out["allgather"] = [g.tolist() for g in gathered]
    part = torch.zeros(2, device="cuda")
    col.reducescatter(part, [torch.full((2,), 5.0, device="cuda")], group_name="g")
    out["reducescatter"] = part.tolist()
    received = [torch.zeros(2, dtype=torch.int32, device="cuda")]
    col.alltoall(received, [torch.tensor([3, 4], dtype=torch.int32, device="cuda")],
                 group_name="g")
    out["alltoall"] = [r.tolist() for r in received]
    b = torch.full((2, 2), 9.0, dtype=torch.float64, device="cuda")
    col.broadcast(b, src_rank=0, group_name="g")
    out["broadcast"] = b.tolist()
    big = torch.ones(16 << 20, device="cuda")  # 64 MiB
    col.allreduce(big, group_name="g")
    out["64 MiB"] = (big.sum().item(), big.numel())
    try:
        col.allreduce(torch.ones(2), group_name="g")
        out["cpu"] = "no error"
    except ValueError as e:
        out["cpu"] = str(e)
    return out


class CollectiveCudaTest(unittest.TestCase):
    def setUp(self):
        if torch.cuda.device_count() == 0:
            self.skipTest("no CUDA device")

    def test_every_op_on_cuda_tensors_over_nccl_in_place(self):
        status, out = run_ranks(ops_on_cuda, world=1, backend="NCCL")[0]
        self.assertEqual(status, "ok", out)
        self.assertEqual(out["allreduce"], ("cuda", [0.0, 2.0, 4.0, 6.0]))
        self.assertEqual(out["allgather"], [[7, 8, 9]])
        self.assertEqual(out["reducescatter"], [5.0, 5.0])
        self.assertEqual(out["alltoall"], [[3, 4]])
        self.assertEqual(out["broadcast"], [[9.0, 9.0], [9.0, 9.0]])
        self.assertEqual(out["64 MiB"], (float(16 << 20), 16 << 20))
        self.assertIn("cpu", out["cpu"])
        self.assertIn("cuda", out["cpu"])


if __name__ == "__main__":
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(CollectiveCudaTest)
    sys.exit(run_and_summarize(suite))
