"""helpers.ring: is the pipelined ring all-reduce lesson 8 shows a correct all-reduce, on lesson 4's schedule?"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from autograder.reference import ring_chunks
from helpers import launch
from helpers.ring import pipelined_ring_allreduce, ring_schedule


@pytest.mark.parametrize("world_size", [2, 3, 5])
def test_the_schedule_is_lesson_4s(world_size):
    """Does every step send and receive the chunks of the reference ring's schedule, adding in the reduce-scatter only?"""
    for rank in range(world_size):
        expected = [ring_chunks(phase, s, rank, world_size) + (phase == "reduce-scatter",)
                    for phase in ("reduce-scatter", "all-gather") for s in range(world_size - 1)]
        assert ring_schedule(rank, world_size) == expected


def _sums(rank, world_size, cases):
    out = []
    for numel, dtype_name, piece in cases:
        g = torch.Generator().manual_seed(rank)
        t = (torch.randn(numel, generator=g) * 100).to(getattr(torch, dtype_name))
        expected = t.clone()
        dist.all_reduce(expected)                     # gloo's own answer, for comparison
        same = pipelined_ring_allreduce(t, piece) is t
        out.append((same, bool(torch.allclose(t.double(), expected.double(), rtol=1e-5, atol=1e-3))))
    return out


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_pipelined_ring_sums_like_all_reduce(world_size):
    """Does it sum in place like dist.all_reduce for sizes below, at and above the world size, tiny and whole-chunk pieces, three dtypes?"""
    cases = [(1, "float32", 4), (3, "float32", 4), (10, "float64", 8), (1001, "float32", 64), (1001, "int64", None),
             (50_000, "float32", 1 << 12)]
    for rank, results in enumerate(launch(_sums, world_size, (cases,), output="quiet", timeout=60)):
        for (numel, dtype_name, piece), (same, right) in zip(cases, results):
            assert same, f"rank {rank}: the result is not the tensor passed in ({numel} {dtype_name})"
            assert right, f"rank {rank} of {world_size}: wrong sum for {numel} {dtype_name} in pieces of {piece} bytes"


def test_docstring_examples_run():
    """Do the examples in helpers.ring's docstrings give what they show?"""
    import doctest

    import helpers.ring

    result = doctest.testmod(helpers.ring)
    assert result.attempted >= 3 and result.failed == 0
