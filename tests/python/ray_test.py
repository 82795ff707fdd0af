"""switchboard.ray on a real local Ray cluster (Ray 2.60 from the project's
virtual environment), as a Ray user runs it: actors that import
switchboard.ray and pick backend="switchboard", imperatively
(init_collective_group in each actor) and declaratively
(create_collective_group on the driver); numpy arrays handed to actors
(read-only) written in place; and the failures Ray's own backends get
wrong: shapes that disagree, an actor killed mid-collective, a wrong job
secret. Everything on 127.0.0.1.
"""

import os
import socket
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from summary import run_and_summarize  # noqa: E402

import ray  # noqa: E402
import ray.util.collective as rc  # noqa: E402

import switchboard.ray  # noqa: E402,F401  (registers SWITCHBOARD in the driver)
from switchboard import collective as col  # noqa: E402

ENV = {
    "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    "SWITCHBOARD_IFNAME": "127.0.0.1",
    "SWITCHBOARD_COLLECTIVE_TIMEOUT_MS": "20000",
}


@ray.remote(num_cpus=0)
class Worker:
    def __init__(self):
        import switchboard.ray  # noqa: F401  (registers SWITCHBOARD in this actor)
        self.buffer = None

    def init_group(self, world_size, rank, group_name):
        rc.init_collective_group(world_size, rank, backend="switchboard", group_name=group_name)
        return rc.get_rank(group_name)

    def set_buffer(self, data):
        self.buffer = data  # as Ray hands it over: read-only
        return data.flags.writeable

    def allreduce(self, group_name, op=rc.types.ReduceOp.SUM):
        rc.allreduce(self.buffer, group_name, op)
        return self.buffer

    def ops(self, group_name):
        rank = rc.get_rank(group_name)
        world = rc.get_collective_group_size(group_name)
        out = {}
        b = np.full(3, rank, np.float64)
        rc.broadcast(b, src_rank=1, group_name=group_name)
        out["broadcast"] = b.tolist()
        gathered = [np.zeros(2, np.int64) for _ in range(world)]
        rc.allgather(gathered, np.array([rank, 10 * rank], np.int64), group_name)
        out["allgather"] = [g.tolist() for g in gathered]
        part = np.zeros(2, np.float32)
        rc.reducescatter(part, [np.full(2, i + rank, np.float32) for i in range(world)],
                         group_name)
        out["reducescatter"] = part.tolist()
        r = np.full(2, rank + 1, np.int32)
        rc.reduce(r, dst_rank=0, group_name=group_name)
        out["reduce"] = r.tolist()
        rc.barrier(group_name)
        if rank == 0:
            rc.send(np.arange(3, dtype=np.float32), 1, group_name)
        elif rank == 1:
            got = np.zeros(3, np.float32)
            rc.recv(got, 0, group_name)
            out["recv"] = got.tolist()
        # What Ray's BaseGroup lacks, on the same group.
        name = switchboard.ray.SwitchboardGroup.switchboard_name(group_name)
        received = [np.zeros(1, np.int64) for _ in range(world)]
        col.alltoall(received, [np.array([10 * rank + i], np.int64) for i in range(world)],
                     name)
        out["alltoall"] = [a.tolist() for a in received]
        return out

    def mismatched(self, group_name):
        rank = rc.get_rank(group_name)
        try:
            rc.allreduce(np.zeros(3 + rank, np.float32), group_name)
        except Exception as e:  # noqa: BLE001
            return f"{type(e).__name__}: {e}"
        return "no error"

    def allreduce_expecting_failure(self, group_name):
        try:
            rc.allreduce(np.ones(4, np.float32), group_name)
        except Exception as e:  # noqa: BLE001
            return f"{type(e).__name__}: {e}"
        return "no error"

    def allreduce_on_cuda_without_nccl(self, group_name):
        # Ray's own checks want a real torch or CuPy tensor, which needs a
        # GPU: hand the group what a CUDA tensor shows DLPack instead.
        class OnCuda:
            def __dlpack_device__(self):
                return (2, 0)  # kDLCUDA, device 0

        group = rc.collective._group_mgr.get_group_by_name(group_name)
        try:
            group.allreduce([OnCuda()])
        except Exception as e:  # noqa: BLE001
            return f"{type(e).__name__}: {e}"
        return "no error"

    def try_init(self, world_size, rank, group_name):
        try:
            rc.init_collective_group(world_size, rank, backend="switchboard",
                                     group_name=group_name)
        except Exception as e:  # noqa: BLE001
            return f"{type(e).__name__}: {e}"
        return "joined"

    def destroy(self, group_name):
        rc.destroy_collective_group(group_name)


def workers(n, env=None):
    return [Worker.options(runtime_env={"env_vars": dict(ENV, **(env or {}))}).remote()
            for _ in range(n)]


class RayCollectiveTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
                 runtime_env={"env_vars": ENV}, log_to_driver=False)

    @classmethod
    def tearDownClass(cls):
        ray.shutdown()

    def test_imperative_group_every_op_in_place_on_read_only_arrays(self):
        ws = workers(2)
        self.assertEqual(ray.get([w.init_group.remote(2, r, "imp") for r, w in enumerate(ws)]),
                         [0, 1])
        writable = ray.get([w.set_buffer.remote(np.full(4, r + 1, np.float32))
                            for r, w in enumerate(ws)])
        self.assertEqual(writable, [False, False])
        for got in ray.get([w.allreduce.remote("imp") for w in ws]):
            self.assertEqual(got.tolist(), [3.0] * 4)
        outs = ray.get([w.ops.remote("imp") for w in ws])
        for rank, out in enumerate(outs):
            self.assertEqual(out["broadcast"], [1.0] * 3)
            self.assertEqual(out["allgather"], [[0, 0], [1, 10]])
            self.assertEqual(out["reducescatter"], [2.0 * rank + 1] * 2)
            self.assertEqual(out["alltoall"], [[rank], [10 + rank]])
        self.assertEqual(outs[0]["reduce"], [3, 3])
        self.assertEqual(outs[1]["recv"], [0.0, 1.0, 2.0])
        ray.get([w.destroy.remote("imp") for w in ws])
        # The same name again: a new group.
        ray.get([w.init_group.remote(2, r, "imp") for r, w in enumerate(ws)])
        ray.get([w.set_buffer.remote(np.full(2, 5, np.float32)) for w in ws])
        for got in ray.get([w.allreduce.remote("imp", rc.types.ReduceOp.MAX) for w in ws]):
            self.assertEqual(got.tolist(), [5.0, 5.0])
        ray.get([w.destroy.remote("imp") for w in ws])

    def test_declarative_group_from_the_driver(self):
        ws = workers(2)
        ray.get([w.set_buffer.remote(np.full(3, r + 1, np.float32)) for r, w in enumerate(ws)])
        rc.create_collective_group(ws, 2, [1, 0], backend="switchboard", group_name="decl")
        for got in ray.get([w.allreduce.remote("decl") for w in ws]):
            self.assertEqual(got.tolist(), [3.0] * 3)
        ray.get([w.destroy.remote("decl") for w in ws])

    def test_shapes_that_disagree_raise_in_both_actors_naming_both(self):
        ws = workers(2)
        ray.get([w.init_group.remote(2, r, "mis") for r, w in enumerate(ws)])
        for text in ray.get([w.mismatched.remote("mis") for w in ws]):
            self.assertIn("the ranks disagree", text)
            self.assertIn("float32[3]", text)
            self.assertIn("float32[4]", text)

    def test_a_cuda_tensor_without_a_usable_nccl_is_refused_naming_why(self):
        if col.backend_available("NCCL")[0]:
            self.skipTest("NCCL can run here: a CUDA tensor would go over it")
        ws = workers(2)
        ray.get([w.init_group.remote(2, r, "cu") for r, w in enumerate(ws)])
        for rank, text in enumerate(ray.get([w.allreduce_on_cuda_without_nccl.remote("cu")
                                             for w in ws])):
            self.assertTrue(text.startswith("RuntimeError: SWITCHBOARD group \"cu\" "
                                            f"(rank {rank}): a CUDA tensor needs"), text)
            self.assertIn(col.backend_available("NCCL")[1], text)
        # The CPU group is still whole.
        ray.get([w.set_buffer.remote(np.ones(2, np.float32)) for w in ws])
        for got in ray.get([w.allreduce.remote("cu") for w in ws]):
            self.assertEqual(got.tolist(), [2.0, 2.0])
        ray.get([w.destroy.remote("cu") for w in ws])

    def test_an_actor_killed_mid_group_is_named_by_the_other(self):
        ws = workers(2)
        ray.get([w.init_group.remote(2, r, "kill") for r, w in enumerate(ws)])
        # Rank 0 enters the allreduce (it waits there for rank 1), and rank
        # 1 is killed: before or after rank 0 got there, rank 0 must raise,
        # naming it, not hang.
        pending = ws[0].allreduce_expecting_failure.remote("kill")
        ray.kill(ws[1])
        text = ray.get(pending)
        self.assertTrue(text.startswith("SwitchboardConnectionError: "), text)
        self.assertIn("rank 1", text)

    def test_an_address_left_by_a_dead_rank_0_is_not_used(self):
        # A group of this name whose rank 0 died before removing its store
        # address left it in Ray's KV, where nothing listens now. A rank
        # that reads it keeps waiting, and takes the new rank 0's address
        # once published (here: from the second read on).
        from unittest import mock
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            dead = f"127.0.0.1:{s.getsockname()[1]}"
        with socket.create_server(("127.0.0.1", 0)) as server:
            live = f"127.0.0.1:{server.getsockname()[1]}"
            reads = iter([dead.encode()] + [live.encode()] * 1000)
            with mock.patch.object(switchboard.ray.internal_kv, "_internal_kv_get",
                                   side_effect=lambda key: next(reads)):
                got = switchboard.ray._wait_for_address("k", 20000, "rank 1")
        self.assertEqual(got, live)
        # With no new rank 0, the wait ends naming the address it skipped.
        with mock.patch.object(switchboard.ray.internal_kv, "_internal_kv_get",
                               return_value=dead.encode()):
            with self.assertRaisesRegex(TimeoutError, f"rank 1: .*{dead}, accepts no conn"):
                switchboard.ray._wait_for_address("k", 200, "rank 1")

    def test_a_wrong_job_secret_is_refused(self):
        with tempfile.TemporaryDirectory() as d:
            good, bad = os.path.join(d, "good"), os.path.join(d, "bad")
            col.write_secret_file(good)
            col.write_secret_file(bad)
            short = {"SWITCHBOARD_COLLECTIVE_TIMEOUT_MS": "5000"}
            owner = workers(1, dict(short, SWITCHBOARD_SECRET_FILE=good))[0]
            stranger = workers(1, dict(short, SWITCHBOARD_SECRET_FILE=bad))[0]
            results = ray.get([owner.try_init.remote(2, 0, "sec"),
                               stranger.try_init.remote(2, 1, "sec")])
            self.assertTrue(results[1].startswith("SwitchboardAuthenticationError: "), results)
            self.assertIn("job secret", results[1])
            self.assertNotEqual(results[0], "joined")


if __name__ == "__main__":
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(RayCollectiveTest)
    sys.exit(run_and_summarize(suite))
