"""PyTorch's own TCPStore server (PyTorch 2.x), for whatever talks to it:
the baseline of `bench store`, Switchboard's TCPStore client against it
(tests/store/tcp_store_interop_test.cc) and the membership token on it
(tests/rendezvous/membership_token_test.cc).

Starts torch.distributed.TCPStore as master on an ephemeral port of
127.0.0.1, prints `port=N`, then, by --until:
  killed      serves until the process is killed (as torchrun's elastic
              agent hosts one);
  stdin       serves until stdin closes (the parent holds the other end,
              so this process goes with it);
  cpp_client  the interop test's exchange: sets "from_torch", waits for the
              client's "cpp_done" key, checks what the client wrote
              ("ok <what>" per check, then "ALL OK"), and exits non-zero at
              the first mismatch ("FAIL <what>: got ..., want ...").
--server libuv|classic picks the server's implementation (default: torch's,
libuv); --timeout S the store's timeout in seconds (default 300).
"""
import argparse
import signal
import sys
from datetime import timedelta

import torch.distributed as dist


def expect(what, got, want):
    if got != want:
        print(f"FAIL {what}: got {got!r}, want {want!r}", flush=True)
        sys.exit(1)
    print(f"ok {what}", flush=True)


def check_cpp_client(store):
    store.wait(["cpp_done"])
    expect("value set by the C++ client", store.get("from_cpp"), b"cpp-value")
    expect("counter added by the C++ client", store.get("cpp_cnt"), b"3")
    expect("append", store.get("appended"), b"abcd")
    expect("multi_set", [store.get("m1"), store.get("m2")], [b"one", b"two"])
    print("ALL OK", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--until", choices=["killed", "stdin", "cpp_client"],
                        default="killed")
    parser.add_argument("--server", choices=["libuv", "classic"])
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    kwargs = {}
    if args.server is not None:
        kwargs["use_libuv"] = args.server == "libuv"
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=args.timeout), **kwargs)
    if args.until == "cpp_client":
        # The key is there before the client learns the port.
        store.set("from_torch", "torch-value")
    print(f"port={store.port}", flush=True)
    if args.until == "cpp_client":
        check_cpp_client(store)
    elif args.until == "stdin":
        sys.stdin.read()  # returns when the parent closes our stdin
    else:
        while True:
            signal.pause()  # until the parent kills this process


if __name__ == "__main__":
    main()
