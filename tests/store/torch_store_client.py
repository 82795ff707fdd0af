"""A real PyTorch TCPStore client (PyTorch 2.x) against a server given on argv.

Run by tcp_store_interop_test: exercises every operation PyTorch 1.13's
Python TCPStore has (and, with PyTorch 2.x, multi_set, multi_get and append),
checks the keys the C++ side set, and leaves keys for it to check. Prints
one line per step; exits non-zero on the first failure.
"""
import sys
from datetime import timedelta

import torch.distributed as dist


def expect(what, got, want):
    if got != want:
        print(f"FAIL {what}: got {got!r}, want {want!r}", flush=True)
        sys.exit(1)
    print(f"ok {what}", flush=True)


def timed_out(error):
    """A wait's timeout as the client's PyTorch reports it: 1.13's
    RuntimeError("Socket Timeout"), 2.x's DistStoreError."""
    store_error = getattr(dist, "DistStoreError", None)
    if store_error is not None and isinstance(error, store_error):
        return "timeout" in str(error)
    return "Socket Timeout" in str(error)


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    # world_size + wait_for_workers: the client ADDs "init/" as PyTorch does.
    store = dist.TCPStore(host, port, world_size=2, is_master=False,
                          timeout=timedelta(seconds=30))
    expect("get of a key set by the C++ client", store.get("from_cpp"), b"hello")
    store.set("from_torch", "torch-value")
    store.set("binary", b"\x00\x01\xff")
    expect("binary round trip", store.get("binary"), b"\x00\x01\xff")
    store.set("empty", b"")
    expect("empty value", store.get("empty"), b"")
    expect("add from zero", store.add("cnt", 5), 5)
    expect("add negative", store.add("cnt", -7), -2)
    expect("add stored as ASCII", store.get("cnt"), b"-2")
    expect("compare_set missing, expected given",
           store.compare_set("cs", "exp", "new"), b"exp")
    expect("compare_set missing, expected empty",
           store.compare_set("cs", "", "v1"), b"v1")
    expect("compare_set equal", store.compare_set("cs", "v1", "v2"), b"v2")
    expect("compare_set different", store.compare_set("cs", "v1", "v3"), b"v2")
    expect("delete existing", store.delete_key("cs"), True)
    expect("delete missing", store.delete_key("cs"), False)
    # Keys: from_cpp, init/, from_torch, binary, empty, cnt (+ any the C++
    # side added before starting us: it tells us how many on argv).
    expect("num_keys", store.num_keys(), int(sys.argv[3]) + 5)
    store.wait(["from_torch", "cnt"])
    try:
        store.wait(["never"], timedelta(milliseconds=200))
        print("FAIL wait on a missing key returned", flush=True)
        sys.exit(1)
    except RuntimeError as e:
        expect("wait timeout raises PyTorch's timeout error", timed_out(e), True)
    # After a timed-out wait a 1.13 client's connection owes a STOP_WAITING;
    # use a fresh store for the rest, as PyTorch users must.
    store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=30))
    store.set_timeout(timedelta(milliseconds=300))
    try:
        store.get("still_missing")
        print("FAIL get of a missing key returned", flush=True)
        sys.exit(1)
    except RuntimeError as e:
        expect("get timeout after set_timeout", timed_out(e), True)
    store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=30))
    if hasattr(store, "multi_set"):  # PyTorch 2.x
        store.multi_set(["ms1", "ms2"], ["one", "two"])
        expect("multi_get", store.multi_get(["ms1", "ms2"]), [b"one", b"two"])
        store.append("ms1", "+")
        expect("append", store.get("ms1"), b"one+")
        expect("check", store.check(["ms1", "ms2"]), True)
    store.set("torch_done", "1")
    print("ALL OK", flush=True)


if __name__ == "__main__":
    main()
