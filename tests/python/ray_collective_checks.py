"""The bodies of the ported Ray collective tests, for any group size.

Ray's single-node and distributed CPU tests check the same things with
different group sizes and ranks; ray_single_node_cases.py and
ray_distributed_cases.py give the parameters of each, and call these.
Every check creates its own actors (ray_workers.create_collective_workers)
and asserts what the collective left in their arrays.
"""

import math
import random

import numpy as np
import pytest
import ray
from ray.util.collective.types import ReduceOp

from ray_workers import create_collective_workers, init_tensors_for_gather_scatter, new_workers


def filled(shape, value, dtype=np.float32):
    return np.ones(shape, dtype=dtype) * value


def torch_filled(shape, value):
    import torch
    return torch.ones(shape, dtype=torch.float32) * value


def mixed(kinds, shape, value=1):
    """One array per kind ("numpy" or "torch"), each `value`s of `shape`."""
    return [filled(shape, value) if k == "numpy" else torch_filled(shape, value) for k in kinds]


def alternating(first, world):
    """[first, other, first, ...] of length `world`, over numpy and torch."""
    other = "torch" if first == "numpy" else "numpy"
    return [first if j % 2 == 0 else other for j in range(world)]


def _check_numpy_then_torch(results, value0, value1=None):
    """Rank 0 holds a numpy array of value0s, rank 1 a torch tensor of value1s
    (default: value0s)."""
    assert (results[0] == filled(10, value0)).all()
    assert (results[1] == torch_filled(10, value0 if value1 is None else value1)).all()


# --- groups ------------------------------------------------------------------

def init_two_actors(backend, world, group_name):
    _, results = create_collective_workers(world, group_name, backend)
    assert results == [True] * world


def init_multiple_groups(backend, world, num_groups):
    actors = new_workers(world)
    for g in range(num_groups):
        assert ray.get([a.init_group.remote(world, rank, backend, str(g))
                        for rank, a in enumerate(actors)]) == [True] * world


def get_rank(backend, world, shuffled):
    actors, _ = create_collective_workers(world, backend=backend)
    assert ray.get(actors[0].report_rank.remote()) == 0
    assert ray.get(actors[1].report_rank.remote()) == 1
    # A second group over the same actors, ranks reversed or shuffled.
    ranks = list(reversed(range(world)))
    if shuffled:
        random.shuffle(ranks)
    ray.get([a.init_group.remote(world, ranks[i], backend, "default2")
             for i, a in enumerate(actors)])
    assert ray.get(actors[0].report_rank.remote("default2")) == ranks[0]
    assert ray.get(actors[1].report_rank.remote("default2")) == ranks[1]


def spans_hosts(backend, world, hosts):
    """A group of `world` actors spans `hosts` hosts, and works across them."""
    actors, _ = create_collective_workers(world, backend=backend)
    assert len(set(ray.get([a.node_address.remote() for a in actors]))) == hosts
    for r in ray.get([a.do_allreduce.remote() for a in actors]):
        assert (r == filled(10, world)).all()


def get_world_size(backend, world):
    actors, _ = create_collective_workers(world, backend=backend)
    assert ray.get([a.report_world_size.remote() for a in actors[:2]]) == [world, world]


def is_group_initialized(backend, world):
    actors, _ = create_collective_workers(world, backend=backend)
    assert ray.get(actors[0].report_is_group_initialized.remote())
    for name in ["random", "123", "456"]:
        assert not ray.get(actors[0].report_is_group_initialized.remote(name))
    assert ray.get(actors[1].report_is_group_initialized.remote())


def destroy_group(backend, world):
    actors, _ = create_collective_workers(world, backend=backend)
    ray.get(actors[0].destroy_group.remote())
    assert not ray.get(actors[0].report_is_group_initialized.remote())
    ray.get(actors[0].destroy_group.remote("random"))  # no such group: a no-op
    assert ray.get(actors[1].report_is_group_initialized.remote())
    ray.get(actors[1].destroy_group.remote("random"))
    assert ray.get(actors[1].report_is_group_initialized.remote())
    ray.get(actors[1].destroy_group.remote("default"))
    assert not ray.get(actors[1].report_is_group_initialized.remote())
    ray.get([a.destroy_group.remote("default") for a in actors[2:]])
    # The same name again.
    assert ray.get([a.init_group.remote(world, rank, backend)
                    for rank, a in enumerate(actors)]) == [True] * world
    assert ray.get([a.report_is_group_initialized.remote() for a in actors]) == [True] * world


# --- allreduce ---------------------------------------------------------------

def allreduce_different_name(backend, world, group_name):
    actors, _ = create_collective_workers(world, group_name, backend)
    for r in ray.get([a.do_allreduce.remote(group_name) for a in actors]):
        assert (r == filled(10, world)).all()


def allreduce_different_array_size(backend, world, array_size):
    actors, _ = create_collective_workers(world, backend=backend)
    ray.get([a.set_buffer.remote(filled(array_size, 1)) for a in actors])
    for r in ray.get([a.do_allreduce.remote() for a in actors]):
        assert (r == filled(array_size, world)).all()


def allreduce_destroy(backend, world):
    actors, _ = create_collective_workers(world, backend=backend)
    for r in ray.get([a.do_allreduce.remote() for a in actors]):
        assert (r == filled(10, world)).all()
    ray.get([a.destroy_group.remote() for a in actors])
    with pytest.raises(RuntimeError):
        ray.get([a.do_allreduce.remote() for a in actors])
    ray.get([a.init_group.remote(world, rank, backend) for rank, a in enumerate(actors)])
    for r in ray.get([a.do_allreduce.remote() for a in actors]):
        assert (r == filled(10, world * world)).all()


def _in_groups(backend, world, num_groups):
    """New actors in `num_groups` groups: "default", "1", "2", ..."""
    actors, _ = create_collective_workers(world, backend=backend)
    names = ["default"] + [str(g) for g in range(1, num_groups)]
    for name in names[1:]:
        ray.get([a.init_group.remote(world, rank, backend, name)
                 for rank, a in enumerate(actors)])
    return actors, names


def allreduce_multiple_group(backend, world, num_groups=5):
    actors, names = _in_groups(backend, world, num_groups)
    for g, name in enumerate(names):
        results = ray.get([a.do_allreduce.remote(name) for a in actors])
        assert (results[0] == filled(10, world ** (g + 1))).all()


def _ops(world):
    """(op, its result over the values 2, 3, ..., world + 1)."""
    return [(ReduceOp.PRODUCT, math.prod(range(2, world + 2))), (ReduceOp.MIN, 2),
            (ReduceOp.MAX, world + 1)]


def allreduce_different_op(backend, world):
    actors, _ = create_collective_workers(world, backend=backend)
    for op, expected in _ops(world):
        ray.get([a.set_buffer.remote(filled(10, rank + 2)) for rank, a in enumerate(actors)])
        for r in ray.get([a.do_allreduce.remote(op=op) for a in actors]):
            assert (r == filled(10, expected)).all(), op


def allreduce_different_dtype(backend, world, dtype):
    actors, _ = create_collective_workers(world, backend=backend)
    ray.get([a.set_buffer.remote(np.ones(10, dtype=dtype)) for a in actors])
    for r in ray.get([a.do_allreduce.remote() for a in actors]):
        assert (r == filled(10, world, dtype)).all()


def allreduce_torch_numpy(backend, world):
    actors, _ = create_collective_workers(world, backend=backend)
    ray.get(actors[1].set_buffer.remote(torch_filled(10, 1)))
    results = ray.get([a.do_allreduce.remote() for a in actors])
    assert (results[0] == filled(10, world)).all()
    ray.get(actors[0].set_buffer.remote(torch_filled(10, 1)))
    ray.get(actors[1].set_buffer.remote(filled(10, 1)))
    ray.get([a.do_allreduce.remote() for a in actors])


# --- allgather ---------------------------------------------------------------

def allgather_different_array_size(backend, world, array_size, tensor_backend):
    actors, _ = create_collective_workers(world, backend=backend)
    init_tensors_for_gather_scatter(actors, array_size=array_size, tensor_backend=tensor_backend)
    results = ray.get([a.do_allgather.remote() for a in actors])
    for i in range(world):
        for j in range(world):
            assert (results[i][j] == mixed([tensor_backend], array_size, j + 1)[0]).all()


def allgather_different_dtype(backend, world, dtype):
    actors, _ = create_collective_workers(world, backend=backend)
    init_tensors_for_gather_scatter(actors, dtype=dtype)
    results = ray.get([a.do_allgather.remote() for a in actors])
    for i in range(world):
        for j in range(world):
            assert (results[i][j] == filled(10, j + 1, dtype)).all()


def unmatched_tensor_list_length(backend, world, length):
    actors, _ = create_collective_workers(world, backend=backend)
    arrays = [filled(10, 1) for _ in range(length)]
    ray.get([a.set_list_buffer.remote(arrays, copy=True) for a in actors])
    if length != world:
        with pytest.raises(RuntimeError):
            ray.get([a.do_allgather.remote() for a in actors])
    else:
        ray.get([a.do_allgather.remote() for a in actors])


def unmatched_tensor_shape(backend, world, shape):
    actors, _ = create_collective_workers(world, backend=backend)
    init_tensors_for_gather_scatter(actors, array_size=10)
    arrays = [filled(shape, 1) for _ in range(world)]
    ray.get([a.set_list_buffer.remote(arrays, copy=True) for a in actors])
    if shape != 10:
        with pytest.raises(RuntimeError):
            ray.get([a.do_allgather.remote() for a in actors])
    else:
        ray.get([a.do_allgather.remote() for a in actors])


def allgather_torch_numpy(backend, world):
    shape = [10, 10]
    actors, _ = create_collective_workers(world, backend=backend)
    layouts = [("torch", ["numpy"] * world),              # the input torch, the list numpy
               ("numpy", ["torch"] * world),              # the reverse
               ("numpy", alternating("torch", world))]    # a mixed list
    for kind, list_kinds in layouts:
        for rank, a in enumerate(actors):
            ray.get(a.set_buffer.remote(mixed([kind], shape, rank + 1)[0]))
            ray.get(a.set_list_buffer.remote(mixed(list_kinds, shape), copy=True))
        results = ray.get([a.do_allgather.remote() for a in actors])
        for i in range(world):
            for j in range(world):
                assert (results[i][j] == mixed([list_kinds[j]], shape, j + 1)[0]).all()


# --- broadcast ---------------------------------------------------------------

def broadcast_different_name(backend, world, group_name, src_rank):
    actors, _ = create_collective_workers(world, group_name, backend)
    ray.get([a.set_buffer.remote(filled(10, rank + 2)) for rank, a in enumerate(actors)])
    for r in ray.get([a.do_broadcast.remote(group_name, src_rank) for a in actors]):
        assert (r == filled(10, src_rank + 2)).all()


def broadcast_different_array_size(backend, world, array_size, src_rank):
    actors, _ = create_collective_workers(world, backend=backend)
    ray.get([a.set_buffer.remote(filled(array_size, rank + 2)) for rank, a in enumerate(actors)])
    for r in ray.get([a.do_broadcast.remote(src_rank=src_rank) for a in actors]):
        assert (r == filled(array_size, src_rank + 2)).all()


def broadcast_torch_numpy(backend, world, src_rank):
    actors, _ = create_collective_workers(world, backend=backend)
    ray.get(actors[1].set_buffer.remote(torch_filled(10, world)))
    results = ray.get([a.do_broadcast.remote(src_rank=src_rank) for a in actors])
    _check_numpy_then_torch(results, 1 if src_rank == 0 else world)


def invalid_rank(backend, world, method, **rank):
    """Every actor calls `method` with a rank outside the group: ValueError."""
    actors, _ = create_collective_workers(world, backend=backend)
    with pytest.raises(ValueError):
        ray.get([getattr(a, method).remote(**rank) for a in actors])


# --- reduce ------------------------------------------------------------------

def _check_reduced(results, dst_rank, at_dst, elsewhere, shape=10):
    for rank, r in enumerate(results):
        assert (r == filled(shape, at_dst if rank == dst_rank else elsewhere(rank))).all()


def reduce_different_name(backend, world, group_name, dst_rank):
    actors, _ = create_collective_workers(world, group_name, backend)
    results = ray.get([a.do_reduce.remote(group_name, dst_rank) for a in actors])
    _check_reduced(results, dst_rank, world, lambda rank: 1)


def reduce_different_array_size(backend, world, array_size, dst_rank):
    actors, _ = create_collective_workers(world, backend=backend)
    ray.get([a.set_buffer.remote(filled(array_size, 1)) for a in actors])
    results = ray.get([a.do_reduce.remote(dst_rank=dst_rank) for a in actors])
    _check_reduced(results, dst_rank, world, lambda rank: 1, array_size)


def reduce_multiple_group(backend, world, dst_rank, num_groups=5):
    actors, names = _in_groups(backend, world, num_groups)
    for g, name in enumerate(names):
        results = ray.get([a.do_reduce.remote(name, dst_rank) for a in actors])
        # The root's buffer accumulates from group to group.
        _check_reduced(results, dst_rank, 1 + (g + 1) * (world - 1), lambda rank: 1)


def reduce_different_op(backend, world, dst_rank):
    actors, _ = create_collective_workers(world, backend=backend)
    for op, expected in _ops(world):
        ray.get([a.set_buffer.remote(filled(10, rank + 2)) for rank, a in enumerate(actors)])
        results = ray.get([a.do_reduce.remote(dst_rank=dst_rank, op=op) for a in actors])
        _check_reduced(results, dst_rank, expected, lambda rank: rank + 2)


def reduce_torch_numpy(backend, world, dst_rank):
    actors, _ = create_collective_workers(world, backend=backend)
    ray.get(actors[1].set_buffer.remote(torch_filled(10, 1)))
    results = ray.get([a.do_reduce.remote(dst_rank=dst_rank) for a in actors])
    _check_numpy_then_torch(results, world if dst_rank == 0 else 1,
                            world if dst_rank == 1 else 1)


# --- reducescatter -----------------------------------------------------------

def reducescatter_different_array_size(backend, world, array_size, tensor_backend):
    actors, _ = create_collective_workers(world, backend=backend)
    init_tensors_for_gather_scatter(actors, array_size=array_size, tensor_backend=tensor_backend)
    for r in ray.get([a.do_reducescatter.remote() for a in actors]):
        assert (r == mixed([tensor_backend], array_size, world)[0]).all()


def reducescatter_different_dtype(backend, world, dtype):
    actors, _ = create_collective_workers(world, backend=backend)
    init_tensors_for_gather_scatter(actors, dtype=dtype)
    for r in ray.get([a.do_reducescatter.remote() for a in actors]):
        assert (r == filled(10, world, dtype)).all()


def reducescatter_torch_numpy(backend, world):
    shape = [10, 10]
    actors, _ = create_collective_workers(world, backend=backend)
    # (each rank's output, the list): Ray's four layouts. The lists go
    # uncopied, so their numpy arrays are read-only in the actors.
    layouts = [(["torch"] * world, ["numpy"] * world),
               (["numpy"] * world, ["torch"] * world),
               (alternating("torch", world), alternating("torch", world)),
               (alternating("torch", world), alternating("numpy", world))]
    for outs, list_kinds in layouts:
        for rank, a in enumerate(actors):
            ray.get(a.set_buffer.remote(mixed([outs[rank]], shape, rank + 1)[0]))
            ray.get(a.set_list_buffer.remote(mixed(list_kinds, shape)))
        results = ray.get([a.do_reducescatter.remote() for a in actors])
        for rank, r in enumerate(results):
            assert (r == mixed([outs[rank]], shape, world)[0]).all()


# --- send and recv -----------------------------------------------------------

def sendrecv(backend, world, group_name, array_size, src_rank, dst_rank, destroy=False):
    """src_rank sends its array (src_rank + 1s) to dst_rank; the other ranks
    only report theirs."""
    actors, _ = create_collective_workers(world, group_name, backend)
    ray.get([a.set_buffer.remote(filled(array_size, rank + 1)) for rank, a in enumerate(actors)])
    refs = [a.get_buffer.remote() for a in actors]
    refs[src_rank] = actors[src_rank].do_send.remote(group_name, dst_rank)
    refs[dst_rank] = actors[dst_rank].do_recv.remote(group_name, src_rank)
    results = ray.get(refs)
    for rank in (src_rank, dst_rank):
        assert (results[rank] == filled(array_size, src_rank + 1)).all()
    if destroy:
        ray.get([a.destroy_group.remote(group_name) for a in actors])


def sendrecv_torch_numpy(backend, world, dst_rank):
    actors, _ = create_collective_workers(world, backend=backend)
    ray.get(actors[1].set_buffer.remote(torch_filled(10, 2)))
    src_rank = 1 - dst_rank
    results = ray.get([a.do_recv.remote(src_rank=src_rank) if rank == dst_rank
                       else a.do_send.remote(dst_rank=dst_rank)
                       for rank, a in enumerate(actors)])
    _check_numpy_then_torch(results, 2 if dst_rank == 0 else 1)
