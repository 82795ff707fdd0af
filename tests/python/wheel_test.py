"""The wheel as a user installs it: `pip install` of //python:wheel into a
fresh virtual environment that holds PyTorch, then `import
switchboard.torch_rpc` and two workers calling each other over SWITCHBOARD.

The fresh environment is made with `python -m venv` from the Python the
project's environment was made from (pyenv's 3.12). Its PyTorch is the
project environment's, made visible by a .pth file instead of a second
multi-GB download: pip sees it as installed, and the wheel's Requires-Dist
(torch==<the release it was built against>) is checked against it. pip
runs offline (--no-index): the wheel must install from itself alone.

Checked: pip installs it; the package imported is the environment's copy;
_C.so's run path names nothing of the build (only $ORIGIN/../switchboard.libs);
the bundled libraries are the ones loaded (with LD_LIBRARY_PATH unset); an
rpc_sync between two processes returns the right value; the collectives
work without torch, with the NCCL backend's module loaded against the
nvidia-nccl wheel's library (NCCL is not bundled); a Ray job (Ray from the
project environment, as its PyTorch) picks backend="switchboard" in its
actors; pip uninstall removes it. Skipped (printing why) without the project environment.

    wheel_test.py WHEEL NAME_FILE   (paths from //python:wheel)
"""
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from summary import run_and_summarize  # noqa: E402

WHEEL = NAME_FILE = None

# What each of the two workers runs in the fresh environment: rank 0 serves,
# rank 1 calls it; both print what they found.
WORKER = textwrap.dedent("""
    import os, sys
    rank, init = int(sys.argv[1]), sys.argv[2]
    import torch
    import torch.distributed.rpc as rpc
    import switchboard, switchboard.torch_rpc as sbt
    print("package", os.path.dirname(switchboard.__file__))
    with open("/proc/self/maps") as maps:
        for line in maps:
            if line.rstrip().endswith(("libfmt.so.9", "libspdlog.so.1.10")):
                print("loaded", line.split()[-1])
    options = sbt.SwitchboardRpcBackendOptions(init_method=init, listen_address="127.0.0.1",
                                               rpc_timeout=60)
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=2, backend=rpc.BackendType.SWITCHBOARD,
                 rpc_backend_options=options)
    if rank == 1:
        print("sum", rpc.rpc_sync("w0", torch.add, args=(torch.ones(3), 2)).tolist())
    rpc.shutdown()
""")


# A Ray job on a local Ray (Ray 2.60, from the project environment like its
# PyTorch): two actors in a SWITCHBOARD group allreduce; prints where the
# driver's and the actors' switchboard came from.
RAY_JOB = textwrap.dedent("""
    import numpy as np, ray, ray.util.collective as rc
    import switchboard, switchboard.ray
    print("driver", switchboard.__file__)

    @ray.remote(num_cpus=0)
    class Worker:
        def __init__(self):
            import switchboard.ray  # registers SWITCHBOARD in this actor
        def allreduce(self, world, rank):
            rc.init_collective_group(world, rank, backend="switchboard", group_name="g")
            x = np.full(2, rank + 1, np.float32)
            rc.allreduce(x, "g")
            return x.tolist(), switchboard.ray.__file__

    ray.init(num_cpus=1, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False)
    workers = [Worker.remote() for _ in range(2)]
    got = ray.get([w.allreduce.remote(2, r) for r, w in enumerate(workers)])
    print("actors", [g[0] for g in got], [g[1] for g in got])
    ray.shutdown()
""")


def run(argv, **kwargs):
    result = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {result.returncode}:\n"
                             f"{result.stdout}\n{result.stderr}")
    return result.stdout


class WheelInstallsAndRuns(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="sb_wheel_")
        self.venv = os.path.join(self.tmp, "venv")
        # The interpreter the project environment was made from.
        base = getattr(sys, "_base_executable", sys.executable)
        run([base, "-m", "venv", self.venv])
        self.python = os.path.join(self.venv, "bin", "python")
        site = run([self.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
        # The user's PyTorch: the project environment's.
        with open(os.path.join(site.strip(), "project_torch.pth"), "w") as f:
            f.write(sysconfig.get_paths()["purelib"] + "\n")
        with open(NAME_FILE) as f:
            self.wheel = os.path.join(self.tmp, f.read().strip())
        shutil.copyfile(WHEEL, self.wheel)
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("PYTHONPATH", "LD_LIBRARY_PATH")}

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_pip_install_then_rpc_between_two_workers(self):
        pip = [self.python, "-m", "pip", "--disable-pip-version-check"]
        out = run(pip + ["install", "--no-index", self.wheel], env=self.env)
        self.assertIn("Successfully installed switchboard-", out)

        worker = os.path.join(self.tmp, "worker.py")
        with open(worker, "w") as f:
            f.write(WORKER)
        init = f"file://{self.tmp}/rendezvous"
        procs = [subprocess.Popen([self.python, worker, str(rank), init], cwd=self.tmp,
                                  env=self.env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
                 for rank in (0, 1)]
        outs = []
        for proc in procs:
            out, _ = proc.communicate(timeout=180)
            outs.append(out)
            self.assertEqual(proc.returncode, 0, out)
        for out in outs:
            self.assertIn(f"package {self.venv}/lib/", out)
            # One line per mapped segment: each library's path, once.
            loaded = {line.split()[1] for line in out.splitlines() if line.startswith("loaded ")}
            self.assertEqual(len(loaded), 2, out)
            for path in loaded:
                self.assertIn("/switchboard.libs/", path)
                self.assertTrue(path.startswith(self.venv), path)
        self.assertIn("sum [3.0, 3.0, 3.0]", outs[1])

        # Nothing of the build is named in the extension's run path.
        extension = run([self.python, "-c",
                         "import importlib.util as u; "
                         "print(u.find_spec('switchboard._C').origin)"], env=self.env).strip()
        with open(extension, "rb") as f:
            data = f.read()
        self.assertIn(b"$ORIGIN/../switchboard.libs", data)
        self.assertNotIn(b"/.venv/", data)

        # The collectives load from the installed copy too, without torch:
        # a group of one, its store in the same process. NCCL is not in the
        # wheel: the module with the NCCL backend takes the system's (here:
        # the CUDA toolkit's, in ld.so.cache) or else the nvidia-nccl
        # wheel's (collective_test checks that way).
        script = ("import sys, numpy as np; from switchboard import collective as col; "
                  "s = col.StoreServer('127.0.0.1'); "
                  "col.init_collective_group(1, 0, group_name='g', store_host='127.0.0.1', "
                  "store_port=s.port, timeout_ms=20000); "
                  "x = np.arange(3, dtype=np.float32); col.allreduce(x, group_name='g'); "
                  "print(col.__file__, x.tolist(), 'torch' in sys.modules); "
                  "print('module', col._collective.__name__); "
                  "print('nccl', *sorted({l.split()[-1] for l in open('/proc/self/maps') "
                  "if 'libnccl' in l}))")
        env = dict(self.env, SWITCHBOARD_IFNAME="127.0.0.1")
        out = run([self.python, "-c", script], env=env)
        self.assertIn(f"{self.venv}/lib/", out)
        self.assertIn("[0.0, 1.0, 2.0] False", out)
        self.assertIn("module switchboard._collective_cuda", out)
        nccl = [line for line in out.splitlines() if line.startswith("nccl ")]
        self.assertEqual(len(nccl), 1, out)
        self.assertRegex(nccl[0], r"^nccl /\S+/libnccl\.so\.2$")
        self.assertNotIn("switchboard.libs", nccl[0])
        libs = os.listdir(os.path.join(os.path.dirname(os.path.dirname(extension)),
                                       "switchboard.libs"))
        self.assertFalse([lib for lib in libs if lib.startswith("libnccl")], libs)

        # A Ray job picks backend="switchboard" from the installed copy:
        # the driver and each actor import switchboard.ray.
        out = run([self.python, "-c", RAY_JOB], env=env, cwd=self.tmp)
        self.assertIn(f"driver {self.venv}/lib/", out)
        self.assertIn(f"actors [[3.0, 3.0], [3.0, 3.0]] ['{self.venv}/lib/", out)

        run(pip + ["uninstall", "--yes", "switchboard"], env=self.env)
        self.assertFalse(os.path.exists(extension))


if __name__ == "__main__":
    WHEEL, NAME_FILE = sys.argv[1], sys.argv[2]
    sys.exit(run_and_summarize(
        unittest.defaultTestLoader.loadTestsFromTestCase(WheelInstallsAndRuns)))
