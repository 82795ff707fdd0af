"""Ray's own collective tests, ported, on SWITCHBOARD and on Ray's GLOO in the
same command.

  ray_suites.py [--backend switchboard|gloo|both]
                [--suite registry|single_node|distributed]...
                [--subset] [-k EXPR] [--list]

Suites (each a port of ray-project/ray's python/ray/util/collective/tests/):
  registry     test_backend_registry.py, plus SWITCHBOARD's registration
               (ray_registry_cases.py; backend-independent, run once);
  single_node  single_node_cpu_tests/* on a local ray.init()
               (ray_single_node_cases.py);
  distributed  distributed_cpu_tests/* (ray_distributed_cases.py) on a Ray
               cluster: the one RAY_ADDRESS names, else one this command
               starts on three network-namespace hosts (ray_cluster.py;
               needs root) and tears down.
Default: registry and single_node. --subset runs the few cases of each file
that tools/test runs (SUBSET below); -k is pytest's.

Every case's result is printed, then one line per backend ("switchboard:
P passed, F failed, S skipped of N"), the cases that pass on one backend
only, and the Catch2-style line tools/test counts.
"""

import argparse
import json
import os
import signal
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

SUITES = {
    "registry": "ray_registry_cases.py",
    "single_node": "ray_single_node_cases.py",
    "distributed": "ray_distributed_cases.py",
}

# tools/test's share: a few cases of each ported file, every op on each path.
SUBSET = [
    "test_register_duplicate_backend",
    "test_switchboard_registered_on_import_under_any_case",
    "test_get_rank",
    "test_destroy_group",
    "test_allreduce_destroy",
    "test_allreduce_different_op",
    "test_allreduce_different_dtype[float16",
    "test_allgather_torch_numpy",
    "test_unmatched_tensor_shape[20",
    "test_broadcast_different_name[1-123?34!",
    "test_reduce_multiple_group[1",
    "test_reducescatter_torch_numpy",
    "test_sendrecv_different_name[1024-1-123?34!",
    "test_sendrecv_invalid_rank",
    # distributed
    "test_distributed_group_spans_the_hosts",
    "test_distributed_allreduce_different_op",
    "test_distributed_get_rank[8",
    "test_distributed_sendrecv[1024-3-0-default",
]


class Recorder:
    """A pytest plugin: each case's outcome, by backend."""

    def __init__(self, subset):
        self.subset = subset
        self.backend_of = {}
        self.outcomes = {}  # nodeid -> passed/failed/skipped

    def pytest_collection_modifyitems(self, items):
        if self.subset:
            items[:] = [i for i in items
                        if any(case_name(i.name).startswith(s) for s in SUBSET)]
        for item in items:
            params = getattr(item, "callspec", None)
            backend = params.params.get("backend") if params else None
            self.backend_of[item.nodeid] = (backend or "any").lower()

    def pytest_runtest_logreport(self, report):
        if report.failed:
            self.outcomes[report.nodeid] = "failed"
        elif report.skipped:
            self.outcomes.setdefault(report.nodeid, "skipped")
        elif report.when == "call":
            self.outcomes.setdefault(report.nodeid, "passed")


def case_name(nodeid):
    """The case without its backend: "f::t[GLOO-a-b]" -> "f::t[a-b]"."""
    for b in ("GLOO", "SWITCHBOARD"):
        nodeid = nodeid.replace(f"[{b}]", "").replace(f"[{b}-", "[")
    return nodeid


def run_pytest(suites, args, recorder):
    pytest_args = [os.path.join(HERE, SUITES[s]) for s in suites]
    pytest_args += ["-v", "-p", "no:cacheprovider", "--rootdir", HERE,
                    "-o", "console_output_style=classic"]
    if args.expr:
        pytest_args += ["-k", args.expr]
    if args.list:
        pytest_args.append("--collect-only")
    pytest.main(pytest_args, plugins=[recorder])


def run_distributed(args, recorder):
    """The distributed suite, on the cluster RAY_ADDRESS names or on one made
    here for it, where this script runs again as the driver in the
    cluster's first host and hands its results back in a file."""
    if os.environ.get("RAY_ADDRESS") or args.list:
        run_pytest(["distributed"], args, recorder)
        return
    import ray_cluster
    why = ray_cluster.unavailable()
    if why:
        print(f"skipped: the distributed suite: {why}")
        return
    cluster = ray_cluster.NetnsRayCluster(env={
        "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]),
        # Ray's GLOO (torch's ProcessGroupGloo) binds to the address of this.
        "GLOO_SOCKET_IFNAME": "eth0"})
    results = os.path.join(cluster.temp_dir, "results.json")
    argv = [sys.executable, os.path.abspath(__file__), "--suite", "distributed",
            "--backend", args.backend, "--results", results]
    if args.subset:
        argv.append("--subset")
    if args.expr:
        argv += ["-k", args.expr]
    # A SIGTERM (bazel's timeout, a user's kill) still runs the teardown.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        cluster.start()
        cluster.driver(argv, env={"SB_RAY_NODES": str(cluster.hosts)})
        with open(results) as f:
            got = json.load(f)
        recorder.outcomes.update(got["outcomes"])
        recorder.backend_of.update(got["backend_of"])
    except (OSError, ValueError, RuntimeError) as e:
        recorder.outcomes["ray_distributed_cases.py (the cluster)"] = "failed"
        print(f"FAILED: the distributed suite's cluster: {type(e).__name__}: {e}")
    finally:
        cluster.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=["switchboard", "gloo", "both"], default="both")
    parser.add_argument("--suite", choices=sorted(SUITES), action="append", dest="suites")
    parser.add_argument("--subset", action="store_true")
    parser.add_argument("-k", dest="expr")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--results", help=argparse.SUPPRESS)  # the cluster's driver's
    args = parser.parse_args()
    backends = ["GLOO", "SWITCHBOARD"] if args.backend == "both" else [args.backend.upper()]
    suites = args.suites or ["registry", "single_node"]
    os.environ["SB_RAY_BACKENDS"] = ",".join(backends)

    recorder = Recorder(args.subset)
    local = [s for s in suites if s != "distributed"]
    if local:
        run_pytest(local, args, recorder)
    if "distributed" in suites:
        run_distributed(args, recorder)
    if args.list:
        return 0
    if args.results:
        with open(args.results, "w") as f:
            json.dump({"outcomes": recorder.outcomes, "backend_of": recorder.backend_of}, f)
        return 0

    counts = {}
    for nodeid, outcome in recorder.outcomes.items():
        backend = recorder.backend_of.get(nodeid, "any")
        counts.setdefault(backend, {}).setdefault(outcome, []).append(nodeid)
        if outcome == "skipped":
            print(f"skipped: {nodeid}")
    for backend in sorted(counts):
        r = counts[backend]
        n = sum(len(v) for v in r.values())
        print(f"{backend}: {len(r.get('passed', []))} passed, {len(r.get('failed', []))} failed, "
              f"{len(r.get('skipped', []))} skipped of {n}")
    if len(backends) == 2:
        passed = {b: {case_name(t) for t in counts.get(b.lower(), {}).get("passed", [])}
                  for b in backends}
        for name in sorted(passed["GLOO"] - passed["SWITCHBOARD"]):
            print(f"passes on GLOO only: {name}")
        for name in sorted(passed["SWITCHBOARD"] - passed["GLOO"]):
            print(f"passes on SWITCHBOARD only: {name}")
    failed = sum(len(r.get("failed", [])) for r in counts.values())
    ran = sum(len(r.get("passed", [])) + len(r.get("failed", [])) for r in counts.values())
    print(f"test cases: {ran} | {ran - failed} passed | {failed} failed")
    return 1 if failed or not ran else 0


if __name__ == "__main__":
    sys.exit(main())
