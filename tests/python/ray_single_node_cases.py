"""Ray's single-node CPU collective tests, ported to run on any registered
backend (ray_suites.py runs them on GLOO and SWITCHBOARD in one command).

The port of python/ray/util/collective/tests/single_node_cpu_tests/ in
ray-project/ray (test_basic_apis, test_allreduce, test_allgather,
test_broadcast, test_reduce, test_reducescatter, test_sendrecv): each case
keeps its name and parameters, and its assertions are in
ray_collective_checks.py. What differs:
- `backend` is every backend named in SB_RAY_BACKENDS, not Backend.GLOO.
- test_destroy_group re-creates the group with the case's backend; Ray's
  passes none, so its helper's default (NCCL) is used, which needs cupy and
  fails on GLOO too here.
- The case Ray's test_sendrecv.py calls test_reduce_different_name is named
  test_sendrecv_different_name.
- test_gloo_group_isolation.py tests Ray's GLOO group itself and is not
  ported.
"""

import numpy as np
import pytest

import ray_collective_checks as check

NAMES = ["default", "test", "123?34!"]
SIZES = [2, 2**5, 2**10, 2**15, 2**20]
SHAPES = SIZES + [[2, 2], [5, 5, 5]]
DTYPES = [np.uint8, np.float16, np.float32, np.float64]
WORLD = 2
RANKS = [0, 1]


# test_basic_apis

@pytest.mark.parametrize("group_name", NAMES)
def test_init_two_actors(ray_start_single_node, group_name, backend):
    check.init_two_actors(backend, WORLD, group_name)


def test_init_multiple_groups(ray_start_single_node, backend):
    check.init_multiple_groups(backend, WORLD, num_groups=10)


def test_get_rank(ray_start_single_node, backend):
    check.get_rank(backend, WORLD, shuffled=False)


def test_get_world_size(ray_start_single_node, backend):
    check.get_world_size(backend, WORLD)


def test_is_group_initialized(ray_start_single_node, backend):
    check.is_group_initialized(backend, WORLD)


def test_destroy_group(ray_start_single_node, backend):
    check.destroy_group(backend, WORLD)


# test_allreduce

@pytest.mark.parametrize("group_name", NAMES)
def test_allreduce_different_name(ray_start_single_node, group_name, backend):
    check.allreduce_different_name(backend, WORLD, group_name)


@pytest.mark.parametrize("array_size", SIZES)
def test_allreduce_different_array_size(ray_start_single_node, array_size, backend):
    check.allreduce_different_array_size(backend, WORLD, array_size)


def test_allreduce_destroy(ray_start_single_node, backend):
    check.allreduce_destroy(backend, WORLD)


def test_allreduce_multiple_group(ray_start_single_node, backend):
    check.allreduce_multiple_group(backend, WORLD)


def test_allreduce_different_op(ray_start_single_node, backend):
    check.allreduce_different_op(backend, WORLD)


@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_different_dtype(ray_start_single_node, dtype, backend):
    check.allreduce_different_dtype(backend, WORLD, dtype)


def test_allreduce_torch_numpy(ray_start_single_node, backend):
    check.allreduce_torch_numpy(backend, WORLD)


# test_allgather

@pytest.mark.parametrize("tensor_backend", ["numpy", "torch"])
@pytest.mark.parametrize("array_size", SHAPES)
def test_allgather_different_array_size(ray_start_single_node, array_size, tensor_backend,
                                        backend):
    check.allgather_different_array_size(backend, WORLD, array_size, tensor_backend)


@pytest.mark.parametrize("dtype", DTYPES)
def test_allgather_different_dtype(ray_start_single_node, dtype, backend):
    check.allgather_different_dtype(backend, WORLD, dtype)


@pytest.mark.parametrize("length", [0, 1, 2, 3])
def test_unmatched_tensor_list_length(ray_start_single_node, length, backend):
    check.unmatched_tensor_list_length(backend, WORLD, length)


@pytest.mark.parametrize("shape", [10, 20, [4, 5], [1, 3, 5, 7]])
def test_unmatched_tensor_shape(ray_start_single_node, shape, backend):
    check.unmatched_tensor_shape(backend, WORLD, shape)


def test_allgather_torch_numpy(ray_start_single_node, backend):
    check.allgather_torch_numpy(backend, WORLD)


# test_broadcast

@pytest.mark.parametrize("group_name", NAMES)
@pytest.mark.parametrize("src_rank", RANKS)
def test_broadcast_different_name(ray_start_single_node, group_name, src_rank, backend):
    check.broadcast_different_name(backend, WORLD, group_name, src_rank)


@pytest.mark.parametrize("array_size", SIZES)
@pytest.mark.parametrize("src_rank", RANKS)
def test_broadcast_different_array_size(ray_start_single_node, array_size, src_rank, backend):
    check.broadcast_different_array_size(backend, WORLD, array_size, src_rank)


@pytest.mark.parametrize("src_rank", RANKS)
def test_broadcast_torch_numpy(ray_start_single_node, src_rank, backend):
    check.broadcast_torch_numpy(backend, WORLD, src_rank)


def test_broadcast_invalid_rank(ray_start_single_node, backend):
    check.invalid_rank(backend, WORLD, "do_broadcast", src_rank=3)


# test_reduce

@pytest.mark.parametrize("group_name", NAMES)
@pytest.mark.parametrize("dst_rank", RANKS)
def test_reduce_different_name(ray_start_single_node, group_name, dst_rank, backend):
    check.reduce_different_name(backend, WORLD, group_name, dst_rank)


@pytest.mark.parametrize("array_size", SIZES)
@pytest.mark.parametrize("dst_rank", RANKS)
def test_reduce_different_array_size(ray_start_single_node, array_size, dst_rank, backend):
    check.reduce_different_array_size(backend, WORLD, array_size, dst_rank)


@pytest.mark.parametrize("dst_rank", RANKS)
def test_reduce_multiple_group(ray_start_single_node, dst_rank, backend):
    check.reduce_multiple_group(backend, WORLD, dst_rank)


@pytest.mark.parametrize("dst_rank", RANKS)
def test_reduce_different_op(ray_start_single_node, dst_rank, backend):
    check.reduce_different_op(backend, WORLD, dst_rank)


@pytest.mark.parametrize("dst_rank", RANKS)
def test_reduce_torch_numpy(ray_start_single_node, dst_rank, backend):
    check.reduce_torch_numpy(backend, WORLD, dst_rank)


def test_reduce_invalid_rank(ray_start_single_node, backend):
    check.invalid_rank(backend, WORLD, "do_reduce", dst_rank=3)


# test_reducescatter

@pytest.mark.parametrize("tensor_backend", ["numpy", "torch"])
@pytest.mark.parametrize("array_size", SHAPES)
def test_reducescatter_different_array_size(ray_start_single_node, array_size, tensor_backend,
                                            backend):
    check.reducescatter_different_array_size(backend, WORLD, array_size, tensor_backend)


@pytest.mark.parametrize("dtype", DTYPES)
def test_reducescatter_different_dtype(ray_start_single_node, dtype, backend):
    check.reducescatter_different_dtype(backend, WORLD, dtype)


def test_reducescatter_torch_numpy(ray_start_single_node, backend):
    check.reducescatter_torch_numpy(backend, WORLD)


# test_sendrecv

@pytest.mark.parametrize("group_name", NAMES)
@pytest.mark.parametrize("dst_rank", RANKS)
@pytest.mark.parametrize("array_size", SIZES + [[2, 2], [5, 9, 10, 85]])
def test_sendrecv_different_name(ray_start_single_node, group_name, array_size, dst_rank,
                                 backend):
    check.sendrecv(backend, WORLD, group_name, array_size, 1 - dst_rank, dst_rank)


@pytest.mark.parametrize("dst_rank", RANKS)
def test_sendrecv_torch_numpy(ray_start_single_node, dst_rank, backend):
    check.sendrecv_torch_numpy(backend, WORLD, dst_rank)


def test_sendrecv_invalid_rank(ray_start_single_node, backend):
    check.invalid_rank(backend, WORLD, "do_send", dst_rank=3)
