"""A real PyTorch TCPStore master (PyTorch 2.x) for our C++ client to talk to.

Starts the server on an ephemeral port, prints `port=N`, sets a key for the
C++ side, then waits (up to 60 s) for the C++ client's "cpp_done" key and
checks what it wrote. Exits non-zero on the first mismatch. argv[1], for
PyTorch 2.x only: "libuv" or "nolibuv", the server's implementation.
"""
import sys
from datetime import timedelta

import torch.distributed as dist


def expect(what, got, want):
    if got != want:
        print(f"FAIL {what}: got {got!r}, want {want!r}", flush=True)
        sys.exit(1)
    print(f"ok {what}", flush=True)


def main():
    kwargs = {}
    if len(sys.argv) > 1:
        kwargs["use_libuv"] = sys.argv[1] == "libuv"
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=60), **kwargs)
    store.set("from_torch", "torch-value")
    print(f"port={store.port}", flush=True)
    store.wait(["cpp_done"])
    expect("value set by the C++ client", store.get("from_cpp"), b"cpp-value")
    expect("counter added by the C++ client", store.get("cpp_cnt"), b"3")
    expect("append", store.get("appended"), b"abcd")
    expect("multi_set", [store.get("m1"), store.get("m2")], [b"one", b"two"])
    print("ALL OK", flush=True)


if __name__ == "__main__":
    main()
