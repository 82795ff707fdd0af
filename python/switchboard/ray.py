"""SWITCHBOARD in Ray's collective registry (ray.util.collective).

Import this module in the driver and in every actor (Ray's registry lives
in each process); it registers the backend once per process:

    import switchboard.ray  # noqa: F401
    ray.util.collective.init_collective_group(world_size, rank,
                                              backend="switchboard", group_name="g")

or, from the driver, ray.util.collective.create_collective_group(actors,
world_size, ranks, backend="switchboard", group_name="g").

Rendezvous: rank 0 starts a Switchboard store server on its node's address
(an ephemeral port) and publishes "address:port" in Ray's internal KV under
"switchboard_collective_store_<group_name>"; the other ranks read it from
there, then every rank joins Switchboard's named group over that store, as
Ray's own GLOO backend finds its peers through the KV. Nothing needs an
address setting. The job secret (SWITCHBOARD_SECRET_FILE, given to every
actor, e.g. through runtime_env) authenticates every store connection; a
rank without it is refused.

Ops: those of Ray's BaseGroup (allreduce, barrier, reduce, allgather,
broadcast, reducescatter, send, recv), on numpy arrays and torch tensors, in
place; gather, scatter and alltoall are reachable on the same group through
switchboard.collective with group_name=SwitchboardGroup.switchboard_name(
group_name). CPU arrays go over Switchboard's GLOO backend. CUDA tensors
(torch's, CuPy's: anything whose __dlpack_device__ is CUDA) go over its
NCCL backend, in a second Switchboard group that every rank creates at its
first op on a CUDA tensor, through rank 0's store (switchboard_name(
group_name, cuda=True)); each actor uses the CUDA device rank % (visible
devices), which is its own GPU when Ray gave it num_gpus=1. barrier runs
on the CPU group. Timeout: SWITCHBOARD_COLLECTIVE_TIMEOUT_MS (default 30000, as
Ray's gloo_timeout), for the rendezvous and for every op.

Errors: switchboard.collective's (TimeoutError, ConnectionError naming the
rank, PermissionError for the secret, RuntimeError when the ranks disagree),
and SwitchboardArgumentError (both ValueError and RuntimeError) for arrays
or arguments wrong on this rank.
"""

import os
import socket
import time

import ray
from ray.experimental import internal_kv
from ray.util.collective import backend_registry, types
from ray.util.collective.collective_group.base_collective_group import BaseGroup

from switchboard import collective as col

BACKEND = "SWITCHBOARD"
_KV_PREFIX = "switchboard_collective_store_"
_POLL_S = 0.05


def _timeout_ms():
    return int(os.environ.get("SWITCHBOARD_COLLECTIVE_TIMEOUT_MS", "30000"))


class SwitchboardArgumentError(ValueError, RuntimeError):
    """Arrays or arguments wrong on this rank (a shape, a dtype, a list's
    length), found before anything is sent. Ray's own backends raise
    RuntimeError for some of these (an allgather output of the wrong shape)
    and ValueError for others (a reducescatter output): this is both, so
    code written for either catches it."""


def _checked(op, *args):
    try:
        op(*args)
    except ValueError as e:
        raise SwitchboardArgumentError(str(e)) from None


def _listening(address):
    """Whether a TCP connection to "host:port" is accepted."""
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=_POLL_S * 20):
            return True
    except OSError:
        return False


def _wait_for_address(key, timeout_ms, who):
    """The store address rank 0 published under Ray KV key `key`. An address
    where nothing listens is left over from a group of this name whose rank
    0 died before removing it: wait for the new rank 0 to replace it.
    TimeoutError after timeout_ms, its message starting with `who`."""
    deadline = time.monotonic() + timeout_ms / 1000
    stale = None
    while True:
        value = internal_kv._internal_kv_get(key)
        if value:
            address = value.decode() if isinstance(value, bytes) else value
            if _listening(address):
                return address
            stale = address
        if time.monotonic() >= deadline:
            seen = f"; the address there, {stale}, accepts no connection" if stale else ""
            raise TimeoutError(f"{who}: rank 0 did not publish its store address (Ray KV key "
                               f"\"{key}\") within {timeout_ms} ms{seen}")
        time.sleep(_POLL_S)


_KDLCUDA = 2  # DLPack's kDLCUDA


def _is_cuda(tensor):
    device = getattr(tensor, "__dlpack_device__", None)
    return device is not None and device()[0] == _KDLCUDA


def _op(reduce_op):
    return {types.ReduceOp.SUM: "SUM", types.ReduceOp.PRODUCT: "PRODUCT",
            types.ReduceOp.MIN: "MIN", types.ReduceOp.MAX: "MAX"}[reduce_op]


class SwitchboardGroup(BaseGroup):
    """One rank of a Ray collective group over Switchboard's Gloo groups."""

    def __init__(self, world_size, rank, group_name):
        super().__init__(world_size, rank, group_name)
        self._name = self.switchboard_name(group_name)
        self._cuda_name = None  # the NCCL group's, once created
        self._server = None
        timeout_ms = _timeout_ms()
        key = _KV_PREFIX + group_name
        secret = os.environ.get("SWITCHBOARD_SECRET_FILE") or None
        self._timeout_ms = timeout_ms
        self._secret = secret
        if rank == 0:
            host = ray.util.get_node_ip_address()
            self._server = col.StoreServer(host, 0, secret)
            address = f"{host}:{self._server.port}"
            internal_kv._internal_kv_put(key, address, overwrite=True)
        else:
            address = _wait_for_address(
                key, timeout_ms,
                f"SWITCHBOARD group \"{group_name}\" (rank {rank} of {world_size})")
        host, port = address.rsplit(":", 1)
        self._store = (host, int(port))
        try:
            col.init_collective_group(world_size, rank, "GLOO", self._name, timeout_ms,
                                      store_host=host, store_port=int(port),
                                      secret_file=secret)
        except BaseException:
            if self._server is not None:
                self._server.stop()
                self._server = None
            raise
        finally:
            if rank == 0:
                # Everyone has joined (or this rank gave up): a later group
                # of this name publishes anew.
                internal_kv._internal_kv_del(key)

    @staticmethod
    def switchboard_name(group_name, cuda=False):
        """The name of Ray's group `group_name` in switchboard.collective:
        its GLOO group, or with cuda=True its NCCL group."""
        return ("ray-cuda:" if cuda else "ray:") + group_name.replace("/", "%2F")

    def _group_for(self, tensor):
        """The Switchboard group for `tensor`'s device: the NCCL group for a
        CUDA tensor (created here at the first one), else the GLOO group."""
        if not _is_cuda(tensor):
            return self._name
        if self._cuda_name is None:
            name = self.switchboard_name(self.group_name, cuda=True)
            available, why_not = col.backend_available("NCCL")
            if not available:
                raise RuntimeError(
                    f"SWITCHBOARD group \"{self.group_name}\" (rank {self.rank}): a CUDA tensor "
                    f"needs Switchboard's NCCL backend, which cannot run here: {why_not}")
            col.init_collective_group(self.world_size, self.rank, "NCCL", name, self._timeout_ms,
                                      store_host=self._store[0], store_port=self._store[1],
                                      secret_file=self._secret)
            self._cuda_name = name
        return self._cuda_name

    @classmethod
    def backend(cls):
        return BACKEND

    @classmethod
    def check_backend_availability(cls):
        return True

    def destroy_group(self):
        col.destroy_collective_group(self._name)
        if self._cuda_name is not None:
            col.destroy_collective_group(self._cuda_name)
            self._cuda_name = None
        if self._server is not None:
            self._server.stop()
            self._server = None

    def allreduce(self, tensors, allreduce_options=types.AllReduceOptions()):
        _checked(col.allreduce, tensors[0], self._group_for(tensors[0]),
                 _op(allreduce_options.reduceOp))

    def barrier(self, barrier_options=types.BarrierOptions()):
        _checked(col.barrier, self._name)

    def reduce(self, tensors, reduce_options=types.ReduceOptions()):
        _checked(col.reduce, tensors[0], reduce_options.root_rank, self._group_for(tensors[0]),
                 _op(reduce_options.reduceOp))

    def allgather(self, tensor_lists, tensors, allgather_options=types.AllGatherOptions()):
        _checked(col.allgather, tensor_lists[0], tensors[0], self._group_for(tensors[0]))

    def broadcast(self, tensors, broadcast_options=types.BroadcastOptions()):
        _checked(col.broadcast, tensors[0], broadcast_options.root_rank,
                 self._group_for(tensors[0]))

    def reducescatter(self, tensors, tensor_lists,
                      reducescatter_options=types.ReduceScatterOptions()):
        _checked(col.reducescatter, tensors[0], tensor_lists[0], self._group_for(tensors[0]),
                 _op(reducescatter_options.reduceOp))

    def send(self, tensors, send_options):
        _checked(col.send, tensors[0], send_options.dst_rank, self._group_for(tensors[0]))

    def recv(self, tensors, recv_options):
        _checked(col.recv, tensors[0], recv_options.src_rank, self._group_for(tensors[0]))


def register():
    """Registers SWITCHBOARD in this process's registry (once; idempotent)."""
    if not backend_registry._global_registry.is_registered(BACKEND):
        backend_registry.register_collective_backend(BACKEND, SwitchboardGroup)


register()
