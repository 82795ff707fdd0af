"""Ranks of a switchboard.collective group as processes on 127.0.0.1, for
the tests: run_ranks(body) starts a StoreServer here and `world` spawned
processes that each join group "g" and run body(col, rank, world), and
returns what each reported. Needs nothing but the package (no numpy).
"""

import multiprocessing
import os
import traceback

TIMEOUT_MS = 30_000

# The ranks' Gloo listeners on loopback, as the tests talk over 127.0.0.1
# only (inherited by the spawned ranks).
os.environ["SWITCHBOARD_IFNAME"] = "127.0.0.1"


def _rank_main(body, rank, world, port, options, results):
    """Runs body(col, rank, world) in a fresh process after joining group "g"."""
    os.environ.update(options.get("env", {}))
    try:
        from switchboard import collective as col
        col.init_collective_group(world, rank, backend=options.get("backend", "GLOO"),
                                  group_name="g", store_host="127.0.0.1",
                                  store_port=port, timeout_ms=options.get("timeout_ms", TIMEOUT_MS),
                                  secret_file=options.get("secret_file"))
        out = body(col, rank, world)
        col.destroy_collective_group("g")
        results.put((rank, "ok", out))
    except BaseException as e:  # noqa: BLE001  (reported to the test)
        results.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def run_ranks(body, world=2, **options):
    """Starts a StoreServer here and `world` ranks running `body`; returns
    {rank: (status, value)} once every rank reported (or exited). Options:
    backend, timeout_ms, secret_file, server_secret_file, expected_reports,
    env (variables the ranks set before they join)."""
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
