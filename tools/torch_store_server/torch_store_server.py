"""PyTorch's own TCPStore server, the baseline of `bench store`.

Starts torch.distributed.TCPStore as master on an ephemeral port, prints
`port=N`, then blocks until stdin closes (the bench holds the other end, so
this process dies with the bench) and exits.
"""
import sys

import torch.distributed as dist


def main():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    print(f"port={store.port}", flush=True)
    sys.stdin.read()  # returns when the bench closes our stdin
    del store


if __name__ == "__main__":
    main()
