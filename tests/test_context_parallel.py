"""torch's context_parallel on CPU ranks: does it do what lesson 11's table says of the installed torch?

Lesson 11 runs the causal call live (it is refused at once) and leaves the non-causal one to the
learner: where it runs it takes about 20 s of CPU in every rank, since DTensor traces the CPU
kernel's decomposition once for each of the 125 ways q, k and v could be placed. This module runs
both, so the table's CPU column is checked on every torch the suite runs on.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from _torch_features import TORCH, torch_file_has

from helpers import launch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch_file_has("distributed/tensor/experimental/__init__.py", "context_parallel"),
                       reason="this torch does not export context_parallel (torch 2.6 and newer do); lesson 11 skips it"),
]


def _sdpa_under_context_parallel(rank, world_size, causal):
    """A forward, then a backward, of SDPA under context_parallel, as lesson 11's cell makes them: what happened."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    mesh = init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 4, 64 * world_size, 32) for _ in range(3))
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    said = {}
    dist.barrier()                                  # the forward's calls come between this barrier and the next
    try:
        with context_parallel(mesh, buffers=[q, k, v, expected], buffer_seq_dims=[2, 2, 2, 2]):
            query = q.detach().requires_grad_()
            out = F.scaled_dot_product_attention(query, k, v, is_causal=causal)
            said["difference"] = (out - expected).abs().max().item()
            dist.barrier()
            out.sum().backward()
            said["gradient"] = tuple(query.grad.shape)
    except NotImplementedError as err:
        said["refused"] = str(err).splitlines()[0]
    dist.barrier()
    return said


def _forward_calls(result):
    """Rank 0's calls between its first two barriers: the forward's collectives."""
    events = result.trace.for_rank(0)
    barriers = [i for i, e in enumerate(events) if e.op == "barrier"]
    return [(e.op, e.via) for e in events[barriers[0] + 1:barriers[1]]]


def test_causal_attention_is_refused_on_cpu_ranks():
    """Is causal SDPA under context_parallel refused on CPU ranks, at the CPU kernel that has no sharding rule?"""
    result = launch(_sdpa_under_context_parallel, 2, args=(True,), trace=True, output="quiet", timeout=120)
    for rank, said in enumerate(result):
        assert "refused" in said, f"rank {rank}: causal attention under context_parallel ran on CPU ({said}); " \
                                  "lesson 11's table says torch refuses it: update the table and this test"
        assert "_scaled_dot_product_flash_attention_for_cpu" in said["refused"], said["refused"]


def test_non_causal_attention_on_cpu_ranks_is_as_the_lesson_says():
    """From torch 2.12, does a non-causal forward run and match one process, with K and V all-gathered, and its
    backward get refused; before 2.12, is the forward refused?"""
    result = launch(_sdpa_under_context_parallel, 2, args=(False,), trace=True, output="quiet", timeout=600)
    for rank, said in enumerate(result):
        if TORCH < (2, 12):
            assert "refused" in said and "difference" not in said, f"rank {rank} on torch {torch.__version__}: {said}"
            continue
        assert said.get("difference", 1.0) < 1e-5, f"rank {rank}: the non-causal forward did not match one process: {said}"
        assert "gradient" not in said and "_for_cpu_backward" in said.get("refused", ""), (
            f"rank {rank}: the non-causal backward was expected to be refused on CPU ranks: {said}")
    if TORCH >= (2, 12):
        calls = _forward_calls(result)
        assert [op.startswith("all_gather") for op, _ in calls] == [True, True], (
            f"the forward was expected to all-gather K and V (two all-gathers), rank 0 made {calls}")
        assert {via for _, via in calls} == {"functional"}, calls
