"""Lesson 06's answers: Exercise 6.1 (an all-reduce per parameter from its hook) and 6.2 (MiniDDP).

The instructor's answers: learners write their own in the notebook. This package never ships
to learners and the grading sandbox hides it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# The bucket rule is the exercise's statement, not an answer: learners get it too.
from autograder.lessons.lesson06 import bucket_layout

__all__ = ["PerParameterDDP", "MiniDDP", "bucket_layout"]


def _broadcast_state(module: torch.nn.Module) -> None:
    """Every parameter and buffer takes rank 0's value (6.1 and 6.2 start this way)."""
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(tensor, src=0)


class PerParameterDDP(torch.nn.Module):
    """Exercise 6.1: each gradient's asynchronous all-reduce starts from its parameter's hook."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module
        _broadcast_state(module)
        self._works: list[tuple[torch.Tensor, object]] = []
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._gradient_ready)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _gradient_ready(self, param: torch.Tensor) -> None:
        self._works.append((param, dist.all_reduce(param.grad, async_op=True)))

    def finish_gradient_synchronization(self) -> None:
        """Wait for every all-reduce of this step; each ``.grad`` becomes the mean over the ranks."""
        for param, work in self._works:
            work.wait()
            param.grad /= dist.get_world_size()
        self._works = []


class MiniDDP(torch.nn.Module):
    """Exercise 6.2: data parallelism that reduces gradients in buckets while backward runs.

    At construction every parameter and buffer takes rank 0's value. A bucket's asynchronous all-reduce starts when
    its last gradient is ready; ``finish_gradient_synchronization`` starts any bucket still waiting (a missing
    gradient counts as zero), waits for all and writes each mean back into ``.grad``. A parameter whose gradient never
    came keeps ``.grad`` None, as DDP leaves a parameter no rank used, so an optimizer skips it.
    """

    def __init__(self, module: torch.nn.Module, bucket_size_mb: float = 25.0) -> None:
        super().__init__()
        self.module = module
        _broadcast_state(module)
        params = [p for p in module.parameters() if p.requires_grad]
        layout = bucket_layout([p.numel() * p.element_size() for p in params], bucket_size_mb)
        self.buckets = [[params[i] for i in bucket] for bucket in layout]
        self._bucket_of = {id(p): b for b, bucket in enumerate(self.buckets) for p in bucket}
        self._ready = [0] * len(self.buckets)
        self._started: list[tuple[int, torch.Tensor, object]] = []
        for p in params:
            p.register_post_accumulate_grad_hook(self._gradient_ready)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _gradient_ready(self, param: torch.Tensor) -> None:
        b = self._bucket_of[id(param)]
        self._ready[b] += 1
        if self._ready[b] == len(self.buckets[b]):
            self._start(b)

    def _start(self, b: int) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.buckets[b]]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self._started.append((b, flat, dist.all_reduce(flat, async_op=True)))
        self._ready[b] = -1  # started: later hooks in this step must not start it again

    def finish_gradient_synchronization(self) -> None:
        """Wait for every bucket's all-reduce; each ``.grad`` becomes the mean over the ranks."""
        for b in range(len(self.buckets)):
            if self._ready[b] != -1:
                self._start(b)  # a parameter without a gradient kept this bucket from starting
        world_size = dist.get_world_size()
        for b, flat, work in self._started:
            work.wait()
            flat /= world_size
            offset = 0
            for p in self.buckets[b]:
                if p.grad is not None:  # one that never came stays None: no rank used it (the same on every rank)
                    p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        self._started = []
        self._ready = [0] * len(self.buckets)
