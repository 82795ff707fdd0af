"""pytest fixtures for the ports of Ray's collective tests
(ray_single_node_cases.py, ray_distributed_cases.py, ray_registry_cases.py),
which ray_suites.py runs.

Every case that takes `backend` runs once per backend named in
SB_RAY_BACKENDS (comma-separated; default "GLOO,SWITCHBOARD"), where Ray's
own tests name only Backend.GLOO.

Ray is started once per session, not once per case as Ray's conftest does
(ray.init costs seconds here): locally with 8 logical CPUs, as Ray's
ray_start_single_node, or, when RAY_ADDRESS names a running cluster, by
joining it (Ray's ray_start_distributed_2_nodes) once SB_RAY_NODES nodes
(default 1) are alive. Each case still gets new
actors, and they are killed when it ends.
"""

import os
import time

import pytest
import ray

import ray_workers


def pytest_generate_tests(metafunc):
    if "backend" in metafunc.fixturenames:
        backends = os.environ.get("SB_RAY_BACKENDS", "GLOO,SWITCHBOARD").split(",")
        metafunc.parametrize("backend", backends)


def _wait_for_nodes(count, timeout_s=180):
    """Returns once `count` nodes are alive (`ray start` returns before its
    node has joined); RuntimeError after timeout_s naming those seen."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = sorted(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"])
        if len(alive) >= count:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"after {timeout_s} s, {len(alive)} of {count} Ray nodes are "
                               f"alive: {alive}")
        time.sleep(1)


@pytest.fixture(scope="session")
def _ray_session():
    import switchboard.ray  # noqa: F401  (the driver's registry, as a Ray user's)
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=False)
        _wait_for_nodes(int(os.environ.get("SB_RAY_NODES", "1")))
    else:
        ray.init(num_cpus=8, include_dashboard=False, _node_ip_address="127.0.0.1",
                 log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture
def ray_start_single_node(_ray_session):
    yield
    ray_workers.kill_spawned()


@pytest.fixture
def ray_start_distributed_2_nodes(_ray_session):
    yield
    ray_workers.kill_spawned()
