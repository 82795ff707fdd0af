"""switchboard.torch_rpc as a user runs it: PyTorch 2.11's torch.distributed.rpc
with backend=BackendType.SWITCHBOARD, workers in processes of their own on
127.0.0.1.

Run by tests/python/run_python_test.sh (PYTHONPATH: the built package); prints
a Catch2-style summary line ("test cases: N | P passed | F failed") that
tools/test counts.
"""

import os
import sys
import tempfile
import threading
import time
import unittest

import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp

import switchboard.torch_rpc as sbt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from summary import run_and_summarize  # noqa: E402


def _options(init, **extra):
    extra.setdefault("listen_address", "127.0.0.1")
    extra.setdefault("rpc_timeout", 30)
    return sbt.SwitchboardRpcBackendOptions(init_method=init, **extra)


def square(x):
    return x * x


# Set in each worker of the timeout case: held() returns once worker 0 lets
# it (after its calls timed out), never by a clock.
_release = None


def held():
    assert _release.wait(60), "never released"
    return 0


def fail(text):
    raise ValueError(text)


def echo(x):
    return x


# ---- worker bodies (run in spawned processes; each raises on a mismatch) ----

def _calls_worker(rank, world, init):
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=world,
                 backend=rpc.BackendType.SWITCHBOARD, rpc_backend_options=_options(init))
    other = f"w{(rank + 1) % world}"
    assert rpc.rpc_sync(other, torch.add, args=(torch.ones(2), 3)).tolist() == [4.0, 4.0]
    assert rpc.rpc_async(other, square, args=(torch.arange(4.0),)).wait().tolist() == [0, 1, 4, 9]
    rref = rpc.remote(other, torch.mul, args=(torch.ones(3), 5))
    assert rref.owner().name == other
    assert rref.to_here().tolist() == [5.0, 5.0, 5.0]
    # A remote exception comes back as the exception it was.
    try:
        rpc.rpc_sync(other, fail, args=("boom",))
        raise AssertionError("no exception")
    except ValueError as e:
        assert "boom" in str(e), str(e)
    # Every dtype and layout torch pickles into a message arrives exact.
    tensors = [
        torch.randn(3, 4, dtype=torch.float16),
        torch.randn(5, dtype=torch.bfloat16),
        torch.randn(2, 2, dtype=torch.complex64),
        torch.tensor([True, False, True]),
        torch.arange(10, dtype=torch.int64).reshape(2, 5).t(),  # not contiguous
        torch.arange(100, dtype=torch.uint8)[10:20],  # a view into a larger storage
        torch.empty(0, 3),
        torch.tensor(7.5, dtype=torch.float64),  # zero dimensions
    ]
    back = rpc.rpc_sync(other, echo, args=(tensors,))
    assert len(back) == len(tensors)
    for sent, got in zip(tensors, back):
        assert sent.dtype == got.dtype and sent.shape == got.shape, (sent, got)
        assert torch.equal(sent, got), (sent, got)
    assert [w.name for w in rpc.api._get_current_rpc_agent().get_worker_infos()] == [
        f"w{i}" for i in range(world)]
    try:
        rpc.get_worker_info("nobody")
        raise AssertionError("an unknown worker was found")
    except RuntimeError as e:
        assert "could not find destination" in str(e), str(e)  # TensorPipe's words
    rpc.shutdown()


def _timeout_worker(rank, world, init, release):
    global _release
    _release = release
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=world,
                 backend=rpc.BackendType.SWITCHBOARD, rpc_backend_options=_options(init))
    if rank == 0:
        try:
            rpc.rpc_sync("w1", held, timeout=0.5)
            raise AssertionError("no timeout")
        except RuntimeError as e:
            assert "RPC ran for more than set timeout" in str(e), str(e)
        # A remote() that times out marks its RRef timed out (torch reads the
        # error's form): its future fails, to_here() says so, nothing hangs.
        rref = rpc.remote("w1", held, timeout=0.5)
        future = rref._get_future()
        completed = threading.Event()
        future.add_done_callback(lambda _: completed.set())
        assert completed.wait(30), "the timed-out remote()'s future never completed"
        try:
            future.wait()
            raise AssertionError("no timeout")
        except RuntimeError as e:
            assert "RPC ran for more than set timeout" in str(e), str(e)
        try:
            rref.to_here()
            raise AssertionError("to_here() of a timed-out RRef returned")
        except RuntimeError as e:
            assert "RRef creation" in str(e), str(e)
        release.set()  # w1's two held calls end
        # The worker is fine afterwards.
        assert rpc.rpc_sync("w1", square, args=(torch.tensor(3.0),)).item() == 9.0
    rpc.shutdown()


def _secret_worker(rank, world, init, secret_file):
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=world,
                 backend=rpc.BackendType.SWITCHBOARD,
                 rpc_backend_options=_options(init, secret_file=secret_file))
    other = f"w{(rank + 1) % world}"
    assert rpc.rpc_sync(other, torch.add, args=(torch.ones(1), 1)).item() == 2.0
    metrics = rpc.api._get_current_rpc_agent().get_debug_info()
    assert int(metrics["agent.thread_pool_size"]) == rpc.constants.DEFAULT_NUM_WORKER_THREADS
    rpc.shutdown()


def _wait_until(condition, what, seconds=60):
    """Polls `condition` (a worker's view that changes on its own thread)
    until it holds; fails naming `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _names():
    return sorted(w.name for w in rpc.api._get_current_rpc_agent().get_worker_infos())


def _dynamic_worker(rank, init, events):
    w0_up, w1_called, w0_saw_w1, w1_left = events
    options = _options(init)
    if rank == 0:
        rpc.init_rpc("w0", rank=0, backend=rpc.BackendType.SWITCHBOARD, rpc_backend_options=options)
        assert not rpc.api._get_current_rpc_agent().is_static_group
        w0_up.set()
        assert w1_called.wait(60)
        _wait_until(lambda: _names() == ["w0", "w1"], "w0 to see w1 join")
        w0_saw_w1.set()
        assert w1_left.wait(60)
        _wait_until(lambda: _names() == ["w0"], "w0 to see w1 leave")
        rpc.shutdown()
    else:
        assert w0_up.wait(60)
        rpc.init_rpc("w1", rank=1, backend=rpc.BackendType.SWITCHBOARD, rpc_backend_options=options)
        assert _names() == ["w0", "w1"], _names()
        assert rpc.rpc_sync("w0", torch.add, args=(torch.ones(2), 2)).tolist() == [3.0, 3.0]
        w1_called.set()
        assert w0_saw_w1.wait(60)
        rpc.shutdown()  # leaves; w0 goes on
        w1_left.set()


def _mixed_worker(rank, init, events):
    static_up, refused = events
    options = _options(init)
    if rank == 0:
        rpc.init_rpc("w0", rank=0, world_size=1, backend=rpc.BackendType.SWITCHBOARD,
                     rpc_backend_options=options)
        static_up.set()
        assert refused.wait(60)
        rpc.shutdown()
    else:
        assert static_up.wait(60)
        try:
            rpc.init_rpc("w1", rank=1, backend=rpc.BackendType.SWITCHBOARD,
                         rpc_backend_options=options)
            raise AssertionError("a dynamic worker joined a static group")
        except RuntimeError as e:
            # TensorPipe's words (torch's own test_dynamic_and_static_init_rpc_together).
            assert ("RPC group mixes statically and dynamically initialized members which is "
                    "not supported.") in str(e), str(e)
            assert "holds a static group" in str(e), str(e)
        finally:
            refused.set()


def _kept_states():
    return sbt._C._kept_python_thread_states()


def _thread_states_worker(rank, world, tmp):
    # Two rounds in the same processes: a pool thread keeps its Python thread
    # state while it serves calls and completes their futures, and frees it
    # when rpc.shutdown() joins it (a thread that took the GIL to free it
    # while shutdown held the GIL would hang here).
    other = f"w{(rank + 1) % world}"
    for round_ in range(2):
        init = "file://" + os.path.join(tmp, f"rendezvous{round_}")
        rpc.init_rpc(f"w{rank}", rank=rank, world_size=world,
                     backend=rpc.BackendType.SWITCHBOARD, rpc_backend_options=_options(init))
        # Served on a pool thread of `other`, which keeps a state for it.
        assert rpc.rpc_sync(other, _kept_states) >= 1
        # A future's callbacks run on the pool thread that completed it.
        kept_here = rpc.rpc_async(other, square, args=(torch.ones(2),)).then(
            lambda _: _kept_states()).wait()
        assert kept_here >= 1, kept_here
        futures = [rpc.rpc_async(other, square, args=(torch.full((2,), float(i)),))
                   for i in range(200)]
        assert [f.wait()[0].item() for f in futures] == [float(i * i) for i in range(200)]
        rpc.shutdown()
        assert _kept_states() == 0, f"round {round_}: {_kept_states()} states left after shutdown"


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tls_worker(rank, world, init, cert_dir):
    name = f"w{rank}"
    rpc.init_rpc(name, rank=rank, world_size=world, backend=rpc.BackendType.SWITCHBOARD,
                 rpc_backend_options=_options(
                     init, tls_cert_file=os.path.join(cert_dir, name + ".pem"),
                     tls_key_file=os.path.join(cert_dir, name + ".key"),
                     tls_ca_file=os.path.join(cert_dir, "ca.pem")))
    other = f"w{(rank + 1) % world}"
    t = torch.arange(1 << 18, dtype=torch.float32)  # 1 MiB through TLS
    assert torch.equal(rpc.rpc_sync(other, echo, args=(t,)), t)
    rpc.shutdown()


def _spawn(fn, *args, world=2):
    with tempfile.TemporaryDirectory() as tmp:
        init = "file://" + os.path.join(tmp, "rendezvous")
        mp.spawn(fn, args=(world, init) + args, nprocs=world, join=True)


class TorchRpcOnSwitchboard(unittest.TestCase):
    def test_registered_and_options_constructed_as_for_tensorpipe(self):
        backend = rpc.backend_registry.BackendType["SWITCHBOARD"]
        self.assertIs(rpc.BackendType.SWITCHBOARD, backend)
        options = rpc.backend_registry.construct_rpc_backend_options(
            backend, init_method="tcp://127.0.0.1:1", rpc_timeout=7, num_worker_threads=3,
            secret_file="/nonexistent")
        self.assertIsInstance(options, sbt.SwitchboardRpcBackendOptions)
        self.assertIsInstance(options, rpc.RpcBackendOptions)
        self.assertEqual((options.rpc_timeout, options.init_method, options.num_worker_threads),
                         (7, "tcp://127.0.0.1:1", 3))
        options.set_device_map("w1", {"cuda:0": "cuda:1"})
        self.assertEqual(options.device_maps["w1"], {torch.device("cuda:0"): torch.device("cuda:1")})
        with self.assertRaisesRegex(ValueError, "one-to-one"):
            options.set_device_map("w1", {"cuda:2": "cuda:1"})
        # TensorPipe is still the default, and still type-checks.
        self.assertIn("TENSORPIPE", rpc.BackendType.__members__)

    def test_calls_rrefs_errors_and_every_dtype_between_two_workers(self):
        _spawn(_calls_worker)

    def test_a_timeout_fails_the_call_and_remote_with_tensorpipes_words_and_the_worker_goes_on(self):
        _spawn(_timeout_worker, mp.get_context("spawn").Event())

    def test_workers_with_the_job_secret_talk(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "secret")
            with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
                f.write(os.urandom(32))
            _spawn(_secret_worker, path)

    def test_workers_with_tls_files_talk_inside_mutual_tls(self):
        certs = os.path.join(os.getcwd(), "tools/certs/certs")
        if not os.access(certs, os.X_OK):
            self.skipTest(f"no {certs} (run under bazel test)")
        with tempfile.TemporaryDirectory() as tmp:
            import subprocess
            subprocess.run([certs, "--dir", tmp, "w0", "w1"], check=True,
                           stdout=subprocess.DEVNULL)
            _spawn(_tls_worker, tmp)

    def test_listening_beyond_loopback_without_a_secret_is_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            init = "file://" + os.path.join(tmp, "rendezvous")
            options = _options(init, listen_address="198.18.0.1")  # refused before it binds
            saved = os.environ.pop("SWITCHBOARD_SECRET_FILE", None)
            try:
                with self.assertRaisesRegex(Exception, "beyond loopback, without a job secret"):
                    rpc.init_rpc("w0", rank=0, world_size=1,
                                 backend=rpc.BackendType.SWITCHBOARD, rpc_backend_options=options)
            finally:
                if saved is not None:
                    os.environ["SWITCHBOARD_SECRET_FILE"] = saved
            self.assertFalse(rpc.api._is_current_rpc_agent_set())

    def test_a_dynamic_group_without_world_size_is_joined_and_left_while_the_other_runs(self):
        ctx = mp.get_context("spawn")
        events = tuple(ctx.Event() for _ in range(4))
        init = f"tcp://127.0.0.1:{_free_port()}"
        mp.spawn(_dynamic_worker, args=(init, events), nprocs=2, join=True)

    def test_a_dynamic_worker_is_refused_by_a_static_group_in_tensorpipes_words(self):
        ctx = mp.get_context("spawn")
        events = (ctx.Event(), ctx.Event())
        init = f"tcp://127.0.0.1:{_free_port()}"
        mp.spawn(_mixed_worker, args=(init, events), nprocs=2, join=True)

    def test_pool_threads_keep_their_python_thread_states_and_free_them_at_shutdown(self):
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(_thread_states_worker, args=(2, tmp), nprocs=2, join=True)

    def test_a_group_of_one_calls_itself(self):
        with tempfile.TemporaryDirectory() as tmp:
            init = "file://" + os.path.join(tmp, "rendezvous")
            rpc.init_rpc("solo", rank=0, world_size=1, backend=rpc.BackendType.SWITCHBOARD,
                         rpc_backend_options=_options(init))
            try:
                self.assertEqual(rpc.rpc_sync("solo", square, args=(torch.tensor(4.0),)).item(), 16.0)
                self.assertEqual(rpc.remote("solo", torch.add, args=(1, 2)).to_here(), 3)
            finally:
                rpc.shutdown()

    def test_a_worker_that_exits_without_shutdown_has_its_agent_stopped_before_the_exit_handlers(self):
        # The exit handler registered first runs last: it finds the agent
        # that switchboard.torch_rpc's handler stopped (its Switchboard
        # side gone from the metrics), not one still running into the C++
        # exit handlers (where a thread logging a lost peer once corrupted
        # the exiting process's heap and hung it).
        script = (
            "import atexit, os, torch.distributed.rpc as rpc\n"
            "from torch.distributed.rpc import api\n"
            "def late():\n"
            "    agent = api._get_current_rpc_agent()\n"
            "    running = any(k.startswith('switchboard.') for k in agent.get_metrics())\n"
            "    print('running at the last exit handler:', running, flush=True)\n"
            "atexit.register(late)\n"
            "import switchboard.torch_rpc as sbt\n"
            "rpc.init_rpc('solo', rank=0, world_size=1, backend=rpc.BackendType.SWITCHBOARD,\n"
            "             rpc_backend_options=sbt.SwitchboardRpcBackendOptions(\n"
            "                 init_method='file://' + os.environ['SB_RENDEZVOUS'],\n"
            "                 listen_address='127.0.0.1'))\n"
            "print('initialized', flush=True)\n")
        import subprocess
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, SB_RENDEZVOUS=os.path.join(tmp, "rendezvous"))
            out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                                 text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("initialized", out.stdout)
        self.assertIn("running at the last exit handler: False", out.stdout, out.stderr)


if __name__ == "__main__":
    sys.exit(run_and_summarize(unittest.defaultTestLoader.loadTestsFromTestCase(TorchRpcOnSwitchboard)))
