"""A bare PyTorch TCPStore server (PyTorch 2.x, with its default libuv
implementation), as torchrun's elastic agent hosts one.

Starts it on an ephemeral port of 127.0.0.1, prints `port=N`, and serves
until it is killed (the test kills it when it is done).
"""
import signal
from datetime import timedelta

import torch.distributed as dist


def main():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=300))
    print(f"port={store.port}", flush=True)
    while True:
        signal.pause()  # until the test kills this process


if __name__ == "__main__":
    main()
