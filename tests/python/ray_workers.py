"""The actor and helpers that the ports of Ray's collective tests share
(ray_single_node_cases.py, ray_distributed_cases.py): the role of Ray's
python/ray/util/collective/tests/cpu_util.py, written for any registered
backend.

A Worker holds one array (`buffer`, ten float32 ones) and a list of arrays
(`list_buffer`) and runs one collective on them per call, returning what the
collective left there. It imports switchboard.ray, so SWITCHBOARD is in its
process's registry (Ray's registry is per process), and takes the backend
by name. Where Ray's helper defaults init_group's backend to NCCL, this one
has no default: every caller names it.
"""

import numpy as np
import ray
import ray.util.collective as col
from ray.util.collective.types import ReduceOp

# The actors each case created; the fixtures kill them when the case ends.
spawned = []


@ray.remote(num_cpus=1)
class Worker:
    def __init__(self):
        import switchboard.ray  # noqa: F401  (registers SWITCHBOARD here)
        self.buffer = np.ones(10, dtype=np.float32)
        self.list_buffer = [np.ones(10, dtype=np.float32) for _ in range(2)]

    def init_group(self, world_size, rank, backend, group_name="default"):
        col.init_collective_group(world_size, rank, backend, group_name)
        return True

    def set_buffer(self, data):
        self.buffer = data
        return self.buffer

    def get_buffer(self):
        return self.buffer

    def set_list_buffer(self, arrays, copy=False):
        if copy:
            arrays = [a.clone().detach() if hasattr(a, "clone") else a.copy() for a in arrays]
        self.list_buffer = arrays
        return self.list_buffer

    def do_allreduce(self, group_name="default", op=ReduceOp.SUM):
        col.allreduce(self.buffer, group_name, op)
        return self.buffer

    def do_reduce(self, group_name="default", dst_rank=0, op=ReduceOp.SUM):
        col.reduce(self.buffer, dst_rank, group_name, op)
        return self.buffer

    def do_broadcast(self, group_name="default", src_rank=0):
        col.broadcast(self.buffer, src_rank, group_name)
        return self.buffer

    def do_allgather(self, group_name="default"):
        col.allgather(self.list_buffer, self.buffer, group_name)
        return self.list_buffer

    def do_reducescatter(self, group_name="default", op=ReduceOp.SUM):
        col.reducescatter(self.buffer, self.list_buffer, group_name, op)
        return self.buffer

    def do_send(self, group_name="default", dst_rank=0):
        col.send(self.buffer, dst_rank, group_name)
        return self.buffer

    def do_recv(self, group_name="default", src_rank=0):
        col.recv(self.buffer, src_rank, group_name)
        return self.buffer

    def destroy_group(self, group_name="default"):
        col.destroy_collective_group(group_name)
        return True

    def report_rank(self, group_name="default"):
        return col.get_rank(group_name)

    def report_world_size(self, group_name="default"):
        return col.get_collective_group_size(group_name)

    def report_is_group_initialized(self, group_name="default"):
        return col.is_group_initialized(group_name)

    def node_address(self):
        return ray.util.get_node_ip_address()


def new_workers(n):
    actors = [Worker.remote() for _ in range(n)]
    spawned.extend(actors)
    return actors


def create_collective_workers(num_workers, group_name="default", backend=None):
    """`num_workers` new actors in one group, rank i on actor i (imperatively,
    as Ray's helper does); returns (actors, what init_group returned)."""
    assert backend is not None, "name the backend"
    actors = new_workers(num_workers)
    results = ray.get([a.init_group.remote(num_workers, rank, backend, group_name)
                       for rank, a in enumerate(actors)])
    return actors, results


def ones(shape, dtype, tensor_backend):
    if tensor_backend == "numpy":
        return np.ones(shape, dtype=dtype)
    import torch
    return torch.ones(shape, dtype=torch.float32)


def init_tensors_for_gather_scatter(actors, array_size=10, dtype=np.float32,
                                    tensor_backend="numpy"):
    """Rank i's buffer holds i + 1; every rank's list holds world-size arrays
    of ones, copied in the actor (so writable)."""
    for rank, a in enumerate(actors):
        ray.get(a.set_buffer.remote(ones(array_size, dtype, tensor_backend) * (rank + 1)))
    arrays = [ones(array_size, dtype, tensor_backend) for _ in actors]
    ray.get([a.set_list_buffer.remote(arrays, copy=True) for a in actors])


def kill_spawned():
    while spawned:
        ray.kill(spawned.pop())
