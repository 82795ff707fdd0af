"""switchboard.collective (python/switchboard/collective.py) as a Python user
runs it: ranks as processes on 127.0.0.1, rank 0's StoreServer as the store,
numpy arrays (read-only ones included) and torch tensors written in place,
and the failures named: arrays that disagree across ranks, a rank that dies
mid-group, a rank without the job's secret.
"""

import multiprocessing
import os
import sys
import tempfile
import traceback
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from summary import run_and_summarize  # noqa: E402

TIMEOUT_MS = 30_000

# The ranks' Gloo listeners on loopback, as every test here talks over
# 127.0.0.1 only (inherited by the spawned ranks).
os.environ["SWITCHBOARD_IFNAME"] = "127.0.0.1"


def _rank_main(body, rank, world, port, options, results):
    """Runs body(col, rank, world) in a fresh process after joining group "g"."""
    try:
        from switchboard import collective as col
        col.init_collective_group(world, rank, group_name="g", store_host="127.0.0.1",
                                  store_port=port, timeout_ms=options.get("timeout_ms", TIMEOUT_MS),
                                  secret_file=options.get("secret_file"))
        out = body(col, rank, world)
        col.destroy_collective_group("g")
        results.put((rank, "ok", out))
    except BaseException as e:  # noqa: BLE001  (reported to the test)
        results.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def run_ranks(body, world=2, **options):
    """Starts a StoreServer here and `world` ranks running `body`; returns
    {rank: (status, value)} once every rank reported (or exited)."""
    from switchboard import collective as col
    server = col.StoreServer("127.0.0.1", secret_file=options.get("server_secret_file"))
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(body, r, world, server.port, options, results))
             for r in range(world)]
    for p in procs:
        p.start()
    got = {}
    expected = options.get("expected_reports", world)
    while len(got) < expected:
        rank, status, value = results.get(timeout=120)
        got[rank] = (status, value)
    for p in procs:
        p.join(timeout=120)
    server.stop()
    return got


# Bodies run in the ranks' processes (module-level: spawn pickles them by name).

def ops_on_numpy(col, rank, world):
    out = {}
    x = np.full(4, rank + 1, dtype=np.float32)
    x.flags.writeable = False  # as Ray hands arrays to actors: written all the same
    col.allreduce(x, group_name="g")
    out["allreduce"] = x.tolist()
    m = np.array([rank, -rank], dtype=np.int64)
    col.allreduce(m, group_name="g", op="MAX")
    out["allreduce_max"] = m.tolist()
    b = np.full(3, rank, dtype=np.float64)
    col.broadcast(b, src_rank=1, group_name="g")
    out["broadcast"] = b.tolist()
    r = np.full(2, rank + 1, dtype=np.int32)
    col.reduce(r, dst_rank=0, group_name="g")
    out["reduce"] = r.tolist()
    gathered = [np.zeros(2, np.int64) for _ in range(world)]
    col.allgather(gathered, np.array([rank, 10 * rank], np.int64), group_name="g")
    out["allgather"] = [g.tolist() for g in gathered]
    at_root = [np.zeros(1, np.float32) for _ in range(world)]
    col.gather(at_root, np.array([rank + 0.5], np.float32), dst_rank=0, group_name="g")
    out["gather"] = [g.tolist() for g in at_root]
    mine = np.zeros(2, np.float32)
    col.scatter(mine, [np.full(2, 100 + i, np.float32) for i in range(world)], src_rank=0,
                group_name="g")
    out["scatter"] = mine.tolist()
    part = np.zeros(2, np.float32)
    col.reducescatter(part, [np.full(2, i + rank, np.float32) for i in range(world)],
                      group_name="g")
    out["reducescatter"] = part.tolist()
    received = [np.zeros(1, np.int64) for _ in range(world)]
    col.alltoall(received, [np.array([10 * rank + i], np.int64) for i in range(world)],
                 group_name="g")
    out["alltoall"] = [a.tolist() for a in received]
    col.barrier(group_name="g")
    if rank == 0:
        col.send(np.arange(3, dtype=np.uint8), dst_rank=1, group_name="g")
    else:
        got = np.zeros(3, np.uint8)
        col.recv(got, src_rank=0, group_name="g")
        out["recv"] = got.tolist()
    out["rank"] = col.get_rank("g")
    out["size"] = col.get_collective_group_size("g")
    out["torch imported"] = "torch" in sys.modules
    return out


def ops_on_torch(col, rank, world):
    import torch
    t = torch.full((2, 2), float(rank + 1))
    col.allreduce(t, group_name="g")
    b = torch.arange(6, dtype=torch.float64).reshape(2, 3) * (rank + 1)
    col.broadcast(b, src_rank=0, group_name="g")
    try:
        col.broadcast(b.t(), src_rank=0, group_name="g")  # a transposed view: refused here
        refused = "no error"
    except ValueError as e:
        refused = str(e)
    return {"allreduce": t.tolist(), "broadcast": b.tolist(), "view": refused}


def mismatched_shapes(col, rank, world):
    try:
        col.allreduce(np.zeros(3 + rank, np.float32), group_name="g")
    except RuntimeError as e:
        return str(e)
    return "no error"


def rank_1_dies(col, rank, world):
    if rank == 1:
        os._exit(3)  # mid-group, without a word
    try:
        col.allreduce(np.ones(4, np.float32), group_name="g")
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return "no error"


def nothing(col, rank, world):
    return None


class CollectiveTest(unittest.TestCase):
    def test_every_op_on_numpy_arrays_in_place_without_torch(self):
        got = run_ranks(ops_on_numpy)
        for rank in range(2):
            status, out = got[rank]
            self.assertEqual(status, "ok", out)
            self.assertEqual(out["allreduce"], [3.0] * 4)
            self.assertEqual(out["allreduce_max"], [1, 0])
            self.assertEqual(out["broadcast"], [1.0] * 3)
            self.assertEqual(out["allgather"], [[0, 0], [1, 10]])
            self.assertEqual(out["scatter"], [100.0 + rank] * 2)
            self.assertEqual(out["reducescatter"], [2.0 * rank + 1] * 2)
            self.assertEqual(out["alltoall"], [[rank], [10 + rank]])
            self.assertEqual((out["rank"], out["size"]), (rank, 2))
            self.assertFalse(out["torch imported"])
        self.assertEqual(got[0][1]["reduce"], [3, 3])
        self.assertEqual(got[0][1]["gather"], [[0.5], [1.5]])
        self.assertEqual(got[1][1]["recv"], [0, 1, 2])

    def test_torch_tensors_and_strided_views_through_dlpack(self):
        got = run_ranks(ops_on_torch)
        for rank in range(2):
            status, out = got[rank]
            self.assertEqual(status, "ok", out)
            self.assertEqual(out["allreduce"], [[3.0, 3.0], [3.0, 3.0]])
            self.assertEqual(out["broadcast"], [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]])
            self.assertIn("float64[3, 2] on cpu is not contiguous", out["view"])

    def test_shapes_that_disagree_raise_on_both_ranks_naming_both(self):
        got = run_ranks(mismatched_shapes)
        for rank in range(2):
            status, text = got[rank]
            self.assertEqual(status, "ok", text)
            self.assertIn("the ranks disagree", text)
            self.assertIn("float32[3]", text)
            self.assertIn("float32[4]", text)

    def test_a_rank_that_dies_is_named_by_the_others(self):
        got = run_ranks(rank_1_dies, expected_reports=1, timeout_ms=10_000)
        status, text = got[0]
        self.assertEqual(status, "ok", text)
        # Raised, not hung, naming the rank that died.
        self.assertTrue(text.startswith("SwitchboardConnectionError: "), text)
        self.assertIn("the connection to rank 1 failed", text)

    def test_a_rank_without_the_job_secret_is_refused(self):
        from switchboard import collective as col
        with tempfile.TemporaryDirectory() as d:
            good, bad = os.path.join(d, "good"), os.path.join(d, "bad")
            col.write_secret_file(good)
            col.write_secret_file(bad)
            ok = run_ranks(nothing, server_secret_file=good, secret_file=good)
            self.assertEqual([ok[r][0] for r in range(2)], ["ok", "ok"], ok)
            refused = run_ranks(nothing, server_secret_file=good, secret_file=bad,
                                timeout_ms=5_000)
            for rank in range(2):
                status, text = refused[rank]
                self.assertEqual(status, "error")
                self.assertTrue(text.startswith("SwitchboardAuthenticationError: "), text)
                self.assertIn("job secret", text)

    def test_arrays_it_cannot_use_are_refused_by_name(self):
        from switchboard import _collective
        with self.assertRaisesRegex(TypeError, "allreduce: tensor: a list is not an array"):
            _collective.allreduce([1, 2], "g", "SUM")
        with self.assertRaisesRegex(ValueError, "complex|not supported"):
            _collective.allreduce(np.zeros(2, np.complex64), "g", "SUM")
        with self.assertRaisesRegex(ValueError, "big-endian"):
            _collective.allreduce(np.zeros(2, ">f4"), "g", "SUM")


if __name__ == "__main__":
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(CollectiveTest)
    sys.exit(run_and_summarize(suite))
