"""switchboard.collective (python/switchboard/collective.py) as a Python user
runs it: ranks as processes on 127.0.0.1, rank 0's StoreServer as the store,
numpy arrays (read-only ones included) and torch tensors written in place,
and the failures named: arrays that disagree across ranks, a rank that dies
mid-group, a rank without the job's secret. The NCCL backend: built in,
saying why it cannot run where there is no GPU, and found where the loader
finds no NCCL library (CUDA tensors over it: collective_cuda_test.py).
"""

import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from collective_ranks import run_ranks  # noqa: E402
from summary import run_and_summarize  # noqa: E402

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
        # Ranks of one host share memory, and the end of rank 1's process
        # names it; over Gloo's TCP (as across hosts) its connection does.
        for env, words in [({}, "rank 1 (pid "),
                           ({"SWITCHBOARD_GLOO_SHM": "0"}, "the connection to rank 1 failed")]:
            with self.subTest(env=env):
                got = run_ranks(rank_1_dies, expected_reports=1, timeout_ms=10_000, env=env)
                status, text = got[0]
                self.assertEqual(status, "ok", text)
                # Raised, not hung, naming the rank that died.
                self.assertTrue(text.startswith("SwitchboardConnectionError: "), text)
                self.assertIn(words, text)

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

    def test_nccl_is_built_in_and_says_why_it_cannot_run_here(self):
        import torch
        from switchboard import collective as col
        self.assertEqual(col._collective.__name__, "switchboard._collective_cuda")
        self.assertEqual(col.backend_available("gloo"), (True, ""))
        available, why = col.backend_available("NCCL")
        if torch.cuda.device_count() == 0:
            self.assertFalse(available)
            self.assertIn("no CUDA device", why)
        else:
            self.assertEqual((available, why), (True, ""))

    def test_without_the_nccl_library_gloo_serves_and_nccl_says_why(self):
        # As where libnccl.so.2 is nowhere: the import of _collective_cuda
        # fails, and a GLOO group still works.
        script = (
            "import importlib.abc, sys\n"
            "class NoNccl(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'switchboard._collective_cuda':\n"
            "            raise ImportError('libnccl.so.2: cannot open shared object file')\n"
            "sys.meta_path.insert(0, NoNccl())\n"
            "from switchboard import collective as col\n"
            "import numpy as np\n"
            "server = col.StoreServer('127.0.0.1')\n"
            "col.init_collective_group(1, 0, group_name='g', store_host='127.0.0.1',\n"
            "                          store_port=server.port)\n"
            "x = np.ones(2, np.float32)\n"
            "col.allreduce(x, group_name='g')\n"
            "print(col._collective.__name__, col.backend_available('nccl'), x.tolist())\n"
            "try:\n"
            "    col.init_collective_group(1, 0, backend='NCCL', group_name='n',\n"
            "                              store_host='127.0.0.1', store_port=server.port)\n"
            "except Exception as e:\n"
            "    print(type(e).__name__, e)\n")
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)
        # (Switchboard's log lines start with a "[time]".)
        first, second = [line for line in result.stdout.splitlines()
                         if not line.startswith("[")]
        self.assertEqual(first, "switchboard._collective (False, 'switchboard._collective_cuda "
                                "could not be loaded: libnccl.so.2: cannot open shared object "
                                "file') [1.0, 1.0]")
        self.assertIn("NCCL", second)
        self.assertIn("not available here", second)

    def test_where_the_loader_finds_no_nccl_the_nvidia_wheel_s_is_loaded(self):
        # The first import of _collective_cuda fails as where no libnccl.so.2
        # is on the loader's path; switchboard.collective then loads the
        # nvidia-nccl wheel's (PyPI's CUDA torch installs it) and imports
        # the module again, which takes that library.
        script = (
            "import importlib.abc, sys\n"
            "class FirstTime(importlib.abc.MetaPathFinder):\n"
            "    tried = False\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'switchboard._collective_cuda' and not self.tried:\n"
            "            self.tried = True\n"
            "            raise ImportError('libnccl.so.2: cannot open shared object file')\n"
            "sys.meta_path.insert(0, FirstTime())\n"
            "from switchboard import collective as col\n"
            "print(col._collective.__name__)\n"
            "print(*sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libnccl' in l}))\n")
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)
        module, loaded = result.stdout.splitlines()
        self.assertEqual(module, "switchboard._collective_cuda")
        self.assertRegex(loaded, r"^/\S+/site-packages/nvidia/nccl/lib/libnccl\.so\.2$")

    def test_arrays_it_cannot_use_are_refused_by_name(self):
        from switchboard import collective as col
        _collective = col._collective
        with self.assertRaisesRegex(TypeError, "allreduce: tensor: a list is not an array"):
            _collective.allreduce([1, 2], "g", "SUM")
        with self.assertRaisesRegex(ValueError, "complex|not supported"):
            _collective.allreduce(np.zeros(2, np.complex64), "g", "SUM")
        with self.assertRaisesRegex(ValueError, "big-endian"):
            _collective.allreduce(np.zeros(2, ">f4"), "g", "SUM")


if __name__ == "__main__":
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(CollectiveTest)
    sys.exit(run_and_summarize(suite))
