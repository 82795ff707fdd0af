"""Ray's distributed CPU collective tests, ported to run on any registered
backend, on a Ray cluster of several hosts (ray_suites.py --suite
distributed starts one on network-namespace hosts: ray_cluster.py).

The port of python/ray/util/collective/tests/distributed_cpu_tests/ in
ray-project/ray (test_distributed_basic_apis, _allreduce, _allgather,
_broadcast, _reduce, _reducescatter, _sendrecv): each case keeps its group
sizes, ranks and parameters, and its assertions are in
ray_collective_checks.py. Names get the prefix "test_distributed_", so that
one run's results keep the two suites apart. As in Ray's, the actors (one
CPU each) span the cluster's hosts: a group of 8 cannot fit on one. What
differs: `backend` is every backend named in SB_RAY_BACKENDS, not
Backend.GLOO.
"""

import numpy as np
import pytest

import ray_collective_checks as check

NAMES = ["default", "test", "123?34!"]
SIZES = [2, 2**5, 2**10, 2**15, 2**20]
SHAPES = SIZES + [[2, 2], [5, 5, 5]]
DTYPES = [np.uint8, np.float16, np.float32, np.float64]


def test_distributed_group_spans_the_hosts(ray_start_distributed_2_nodes, backend):
    # Not in Ray's suite: that the cluster is what the other cases need (a
    # group of 8 one-CPU actors on three hosts of 3 CPUs uses all three).
    check.spans_hosts(backend, 8, hosts=3)


# test_distributed_basic_apis

@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("group_name", NAMES)
def test_distributed_init_two_actors(ray_start_distributed_2_nodes, world_size, group_name,
                                     backend):
    check.init_two_actors(backend, world_size, group_name)


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_distributed_init_multiple_groups(ray_start_distributed_2_nodes, world_size, backend):
    check.init_multiple_groups(backend, world_size, num_groups=5)


@pytest.mark.parametrize("world_size", [5, 6, 7, 8])
def test_distributed_get_rank(ray_start_distributed_2_nodes, world_size, backend):
    check.get_rank(backend, world_size, shuffled=True)


@pytest.mark.parametrize("world_size", [5, 6, 7, 8])
def test_distributed_get_world_size(ray_start_distributed_2_nodes, world_size, backend):
    check.get_world_size(backend, world_size)


def test_distributed_is_group_initialized(ray_start_distributed_2_nodes, backend):
    check.is_group_initialized(backend, 8)


def test_distributed_destroy_group(ray_start_distributed_2_nodes, backend):
    check.destroy_group(backend, 8)


# test_distributed_allreduce

@pytest.mark.parametrize("group_name", NAMES)
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_distributed_allreduce_different_name(ray_start_distributed_2_nodes, group_name,
                                              world_size, backend):
    check.allreduce_different_name(backend, world_size, group_name)


@pytest.mark.parametrize("array_size", SIZES)
def test_distributed_allreduce_different_array_size(ray_start_distributed_2_nodes, array_size,
                                                    backend):
    check.allreduce_different_array_size(backend, 4, array_size)


def test_distributed_allreduce_destroy(ray_start_distributed_2_nodes, backend):
    check.allreduce_destroy(backend, 4)


def test_distributed_allreduce_multiple_group(ray_start_distributed_2_nodes, backend):
    check.allreduce_multiple_group(backend, 4)


def test_distributed_allreduce_different_op(ray_start_distributed_2_nodes, backend):
    check.allreduce_different_op(backend, 4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_distributed_allreduce_different_dtype(ray_start_distributed_2_nodes, dtype, backend):
    check.allreduce_different_dtype(backend, 4, dtype)


def test_distributed_allreduce_torch_numpy(ray_start_distributed_2_nodes, backend):
    check.allreduce_torch_numpy(backend, 4)


# test_distributed_allgather

@pytest.mark.parametrize("tensor_backend", ["numpy", "torch"])
@pytest.mark.parametrize("array_size", SHAPES)
def test_distributed_allgather_different_array_size(ray_start_distributed_2_nodes, array_size,
                                                    tensor_backend, backend):
    check.allgather_different_array_size(backend, 8, array_size, tensor_backend)


@pytest.mark.parametrize("dtype", DTYPES)
def test_distributed_allgather_different_dtype(ray_start_distributed_2_nodes, dtype, backend):
    check.allgather_different_dtype(backend, 8, dtype)


@pytest.mark.parametrize("length", [0, 1, 3, 4, 7, 8])
def test_distributed_unmatched_tensor_list_length(ray_start_distributed_2_nodes, length,
                                                  backend):
    check.unmatched_tensor_list_length(backend, 8, length)


@pytest.mark.parametrize("shape", [10, 20, [4, 5], [1, 3, 5, 7]])
def test_distributed_unmatched_tensor_shape(ray_start_distributed_2_nodes, shape, backend):
    check.unmatched_tensor_shape(backend, 8, shape)


def test_distributed_allgather_torch_numpy(ray_start_distributed_2_nodes, backend):
    check.allgather_torch_numpy(backend, 8)


# test_distributed_broadcast

@pytest.mark.parametrize("group_name", NAMES)
@pytest.mark.parametrize("src_rank", [0, 2, 5, 6, 7])
def test_distributed_broadcast_different_name(ray_start_distributed_2_nodes, group_name,
                                              src_rank, backend):
    check.broadcast_different_name(backend, 8, group_name, src_rank)


@pytest.mark.parametrize("array_size", SIZES)
@pytest.mark.parametrize("src_rank", [0, 2, 5, 6, 7])
def test_distributed_broadcast_different_array_size(ray_start_distributed_2_nodes, array_size,
                                                    src_rank, backend):
    check.broadcast_different_array_size(backend, 8, array_size, src_rank)


@pytest.mark.parametrize("src_rank", [0, 2, 5, 6, 7])
def test_distributed_broadcast_torch_numpy(ray_start_distributed_2_nodes, src_rank, backend):
    check.broadcast_torch_numpy(backend, 8, src_rank)


def test_distributed_broadcast_invalid_rank(ray_start_distributed_2_nodes, backend):
    check.invalid_rank(backend, 8, "do_broadcast", src_rank=9)


# test_distributed_reduce

@pytest.mark.parametrize("group_name", NAMES)
@pytest.mark.parametrize("dst_rank", [0, 1, 2, 3])
def test_distributed_reduce_different_name(ray_start_distributed_2_nodes, group_name, dst_rank,
                                           backend):
    check.reduce_different_name(backend, 4, group_name, dst_rank)


@pytest.mark.parametrize("array_size", SIZES)
@pytest.mark.parametrize("dst_rank", [0, 1, 2, 3])
def test_distributed_reduce_different_array_size(ray_start_distributed_2_nodes, array_size,
                                                 dst_rank, backend):
    check.reduce_different_array_size(backend, 4, array_size, dst_rank)


@pytest.mark.parametrize("dst_rank", [0, 1, 2, 3])
def test_distributed_reduce_different_op(ray_start_distributed_2_nodes, dst_rank, backend):
    check.reduce_different_op(backend, 4, dst_rank)


@pytest.mark.parametrize("dst_rank", [0, 1])
def test_distributed_reduce_torch_numpy(ray_start_distributed_2_nodes, dst_rank, backend):
    check.reduce_torch_numpy(backend, 4, dst_rank)


def test_distributed_reduce_invalid_rank(ray_start_distributed_2_nodes, backend):
    check.invalid_rank(backend, 4, "do_reduce", dst_rank=7)


# test_distributed_reducescatter

@pytest.mark.parametrize("tensor_backend", ["numpy", "torch"])
@pytest.mark.parametrize("array_size", SHAPES)
def test_distributed_reducescatter_different_array_size(ray_start_distributed_2_nodes,
                                                        array_size, tensor_backend, backend):
    check.reducescatter_different_array_size(backend, 4, array_size, tensor_backend)


@pytest.mark.parametrize("dtype", DTYPES)
def test_distributed_reducescatter_different_dtype(ray_start_distributed_2_nodes, dtype,
                                                   backend):
    check.reducescatter_different_dtype(backend, 4, dtype)


def test_distributed_reducescatter_torch_numpy(ray_start_distributed_2_nodes, backend):
    check.reducescatter_torch_numpy(backend, 4)


# test_distributed_sendrecv

@pytest.mark.parametrize("group_name", NAMES)
@pytest.mark.parametrize("dst_rank", [0, 1, 2, 3])
@pytest.mark.parametrize("src_rank", [0, 1, 2, 3])
@pytest.mark.parametrize("array_size", [2**10, 2**15, 2**20, [2, 2], [5, 9, 10, 85]])
def test_distributed_sendrecv(ray_start_distributed_2_nodes, group_name, array_size, src_rank,
                              dst_rank, backend):
    if src_rank == dst_rank:
        pytest.skip("a rank does not send to itself")
    check.sendrecv(backend, 4, group_name, array_size, src_rank, dst_rank, destroy=True)
