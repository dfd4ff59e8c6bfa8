"""Lesson 10's answers: Exercise 10.1 (a tensor-parallel MLP) and 10.2-10.4 (pipeline schedules over send/recv).

The instructor's answers: learners write their own in the notebook. This package never ships
to learners and the grading sandbox hides it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["TensorParallelMLP", "gpipe_step", "one_f_one_b_step", "interleaved_step"]


class _CopyToTensorParallel(torch.autograd.Function):
    """f: the identity forward; backward sums the input's gradient over the ranks."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class _ReduceFromTensorParallel(torch.autograd.Function):
    """g: forward sums the ranks' partial outputs; backward is the identity."""

    @staticmethod
    def forward(ctx, partial):
        total = partial.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad


class TensorParallelMLP(torch.nn.Module):
    """Exercise 10.1: ``fc2(gelu(fc1(x)))``, fc1 split by output features (rows r*k:(r+1)*k, k = hidden / p), fc2 by
    input features (the same columns), fc2's bias whole, added once; one all-reduce forward (g), one backward (f)."""

    def __init__(self, fc1: torch.nn.Linear, fc2: torch.nn.Linear) -> None:
        super().__init__()
        rank, world_size = dist.get_rank(), dist.get_world_size()
        k = fc1.out_features // world_size
        mine = slice(rank * k, (rank + 1) * k)
        def shard(param, part):  # a frozen weight's shard stays frozen: torch leaves its .grad None
            return torch.nn.Parameter(param.detach()[part].clone(), requires_grad=param.requires_grad)
        self.w1, self.b1 = shard(fc1.weight, mine), shard(fc1.bias, mine)
        self.w2, self.b2 = shard(fc2.weight, (slice(None), mine)), shard(fc2.bias, slice(None))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _CopyToTensorParallel.apply(x)
        h = torch.nn.functional.gelu(torch.nn.functional.linear(x, self.w1, self.b1))
        return _ReduceFromTensorParallel.apply(torch.nn.functional.linear(h, self.w2)) + self.b2


def _pipeline_forward(stage, i: int, microbatch, requests: list) -> None:
    inputs, targets = microbatch
    x = inputs if stage.is_first else torch.empty(stage.input_shape)
    if not stage.is_first:
        dist.recv(x, src=stage.prev_rank)
    y = stage.forward(i, x, targets if stage.is_last else None)
    if not stage.is_last:
        requests.append((dist.isend(y, dst=stage.next_rank), y))


def _pipeline_backward(stage, i: int, m: int, requests: list) -> None:
    grad = 1.0 / m if stage.is_last else torch.empty(stage.output_shape)  # the step's loss: the mean of m losses
    if not stage.is_last:
        dist.recv(grad, src=stage.next_rank)
    g = stage.backward(i, grad)
    if not stage.is_first:
        requests.append((dist.isend(g, dst=stage.prev_rank), g))


def gpipe_step(stage, microbatches) -> None:
    """Exercise 10.2: every micro-batch forward through the stages, then every one backward."""
    interleaved_step([stage], microbatches)


def one_f_one_b_step(stage, microbatches) -> None:
    """Exercise 10.3: p - s - 1 forwards to fill the pipeline, then one forward and one backward in turn."""
    m, requests = len(microbatches), []
    warmup = min(stage.num_stages - stage.rank - 1, m)
    for i in range(warmup):
        _pipeline_forward(stage, i, microbatches[i], requests)
    for i in range(m - warmup):
        _pipeline_forward(stage, warmup + i, microbatches[warmup + i], requests)
        _pipeline_backward(stage, i, m, requests)
    for i in range(m - warmup, m):
        _pipeline_backward(stage, i, m, requests)
    for request, _ in requests:
        request.wait()


def interleaved_step(stages, microbatches) -> None:
    """Exercise 10.4 (one chunk: 10.2's GPipe): all forwards through chunk 0, then chunk 1, ...; backwards reversed."""
    m, requests = len(microbatches), []
    for stage in stages:
        for i, microbatch in enumerate(microbatches):
            _pipeline_forward(stage, i, microbatch, requests)
    for stage in reversed(stages):
        for i in range(m):
            _pipeline_backward(stage, i, m, requests)
    for request, _ in requests:
        request.wait()
