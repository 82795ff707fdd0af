"""Switchboard's collective groups from Python, without torch.

Named groups as in Ray's ray.util.collective, over Switchboard's GLOO
backend (CPU arrays) and NCCL backend (CUDA arrays). Arrays are numpy
arrays, torch tensors, or anything with __array_interface__ or __dlpack__
(CUDA tensors through __dlpack__); they are used in place, without copies,
and every op writes its result into the caller's arrays (read-only numpy
arrays included, as Ray hands them to actors).

NCCL: backend="NCCL" needs NCCL's library (libnccl.so.2), found as the
process already loaded it (import torch first), from the nvidia-nccl wheel
that PyPI's CUDA torch installs, or on the loader's path; and a CUDA device.
Each rank uses device rank % (visible devices), and NCCL refuses two ranks
of one group on one device. backend_available("NCCL") says whether NCCL can
run here, and if not, why. SWITCHBOARD_COLLECTIVE_CUDA=0 leaves NCCL out.

    import numpy as np
    from switchboard import collective as col

    server = col.StoreServer("10.0.0.1") if rank == 0 else None   # once, on rank 0
    col.init_collective_group(2, rank, group_name="g",
                              store_host="10.0.0.1", store_port=port)
    x = np.ones(4, dtype=np.float32)
    col.allreduce(x, group_name="g")                 # x == [2, 2, 2, 2]
    col.destroy_collective_group("g")

The store: store_host/store_port name a Switchboard (or PyTorch) TCPStore
server, such as a StoreServer that one rank starts; without them,
MASTER_ADDR and MASTER_PORT do. The job secret (secret_file, else
SWITCHBOARD_SECRET_FILE) authenticates every connection to the store and
between the ranks; a rank with a wrong or missing secret is refused.

Every op is synchronous: it returns once done on this rank, or raises
TimeoutError after the group's timeout, ConnectionError naming the rank
whose connection failed (it died or was cut off), PermissionError for a wrong or
missing job secret, ValueError for arguments that are wrong here (a
non-contiguous view, an unsupported dtype), RuntimeError when the ranks
disagree on an op (each side's op and arrays named; the group is then
unusable). Ops on one group must be issued in the same order on every
rank.
"""

import ctypes
import glob
import importlib
import os
import sys
from enum import Enum


def _preload_nccl():
    """Loads libnccl.so.2 from the nvidia-nccl wheel when the process has
    not loaded one, as torch does, so that _collective_cuda finds it."""
    for entry in sys.path:
        for path in glob.glob(os.path.join(entry or ".", "nvidia", "nccl", "lib", "libnccl.so.2")):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                return
            except OSError:
                continue


def _load():
    """(module, why NCCL is missing): _collective_cuda where it loads, else
    _collective (GLOO only)."""
    if os.environ.get("SWITCHBOARD_COLLECTIVE_CUDA", "1") == "0":
        return importlib.import_module("switchboard._collective"), \
            "SWITCHBOARD_COLLECTIVE_CUDA=0 left NCCL out"
    try:
        return importlib.import_module("switchboard._collective_cuda"), None
    except ImportError as first:
        _preload_nccl()
        try:
            return importlib.import_module("switchboard._collective_cuda"), None
        except ImportError:
            return importlib.import_module("switchboard._collective"), \
                f"switchboard._collective_cuda could not be loaded: {first}"


_collective, _no_nccl = _load()
StoreServer = _collective.StoreServer
write_secret_file = _collective.write_secret_file


def backend_available(name):
    """(available, reason): whether backend `name` ("GLOO", "NCCL", any
    case) can run in this process; reason says why not ("" when it can)."""
    if _no_nccl is not None and name.upper() == "NCCL":
        return False, _no_nccl
    return _collective.backend_available(name)


class ReduceOp(Enum):
    SUM = "SUM"
    PRODUCT = "PRODUCT"
    MIN = "MIN"
    MAX = "MAX"
    AVG = "AVG"


def _op(op):
    if isinstance(op, ReduceOp):
        return op.value
    if isinstance(op, str):
        return op.upper()
    # Ray's ray.util.collective.types.ReduceOp, or any enum named alike.
    name = getattr(op, "name", None)
    if name is None:
        raise TypeError(f"reduce op {op!r}: not a ReduceOp or a name such as 'SUM'")
    return name.upper()


def init_collective_group(world_size, rank, backend="GLOO", group_name="default",
                          timeout_ms=300_000, store_host=None, store_port=None,
                          secret_file=None):
    """Joins `group_name` as `rank` of `world_size`; returns once every rank joined."""
    _collective.init_collective_group(world_size, rank, backend, group_name, timeout_ms,
                                      store_host, store_port, secret_file)


def destroy_collective_group(group_name="default"):
    """Drops this process's group; False when none of that name was initialized."""
    return _collective.destroy_collective_group(group_name)


def is_group_initialized(group_name="default"):
    return _collective.is_group_initialized(group_name)


def get_rank(group_name="default"):
    """This process's rank in the group, or -1."""
    return _collective.get_rank(group_name)


def get_collective_group_size(group_name="default"):
    """The group's size, or -1."""
    return _collective.get_collective_group_size(group_name)


def allreduce(tensor, group_name="default", op=ReduceOp.SUM):
    _collective.allreduce(tensor, group_name, _op(op))


def reduce(tensor, dst_rank=0, group_name="default", op=ReduceOp.SUM):
    _collective.reduce(tensor, dst_rank, group_name, _op(op))


def broadcast(tensor, src_rank=0, group_name="default"):
    _collective.broadcast(tensor, src_rank, group_name)


def allgather(tensor_list, tensor, group_name="default"):
    """tensor_list[r] receives rank r's tensor."""
    _collective.allgather(list(tensor_list), tensor, group_name)


def gather(tensor_list, tensor, dst_rank=0, group_name="default"):
    """On dst_rank, tensor_list[r] receives rank r's tensor (elsewhere unused)."""
    _collective.gather(list(tensor_list), tensor, dst_rank, group_name)


def scatter(tensor, tensor_list, src_rank=0, group_name="default"):
    """Rank r's tensor receives src_rank's tensor_list[r]."""
    _collective.scatter(tensor, list(tensor_list), src_rank, group_name)


def reducescatter(tensor, tensor_list, group_name="default", op=ReduceOp.SUM):
    """Rank r's tensor receives the reduction over ranks of tensor_list[r]."""
    _collective.reducescatter(tensor, list(tensor_list), group_name, _op(op))


def alltoall(output_list, input_list, group_name="default"):
    """output_list[r] receives rank r's input_list[this rank]."""
    _collective.alltoall(list(output_list), list(input_list), group_name)


def barrier(group_name="default"):
    _collective.barrier(group_name)


def send(tensor, dst_rank, group_name="default", tag=0):
    _collective.send(tensor, dst_rank, group_name, tag)


def recv(tensor, src_rank, group_name="default", tag=0):
    _collective.recv(tensor, src_rank, group_name, tag)
