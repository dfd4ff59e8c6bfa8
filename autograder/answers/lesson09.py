"""Lesson 09's answer: Exercise 9.1, ZeRO-1 (a sharded optimizer) from collectives.

The instructor's answers: learners write their own in the notebook. This package never ships
to learners and the grading sandbox hides it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["ShardedOptimizer"]


class ShardedOptimizer:
    """Exercise 9.1: ZeRO-1. Each rank keeps optimizer state for its 1/p slice of the flattened trainable parameters.

    ``step()`` reduce-scatters the padded flat gradients (each rank receives its slice's mean), steps the slice, and
    all-gathers the updated slices into every rank's parameters. The slice is one piece per parameter in it (and one
    for the padding), so a piece whose parameter got no gradient gets none and is left as torch's optimizers leave such
    a parameter. Every rank must see the same parameters without a gradient, as FSDP2 also assumes.
    """

    def __init__(self, params, optimizer_cls, **kwargs) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.world_size, self.rank = dist.get_world_size(), dist.get_rank()
        self.numel = sum(p.numel() for p in self.params)
        self.shard = -(-self.numel // self.world_size)
        flat = self._flatten([p.detach() for p in self.params])
        start, end = self.rank * self.shard, (self.rank + 1) * self.shard
        self.pieces, offset = [], 0  # (parameter, or None for the padding; this rank's piece of it)
        for p in self.params + [None]:  # None: the padding after the last parameter
            size = p.numel() if p is not None else self.shard * self.world_size - self.numel
            lo, hi = max(offset, start), min(offset + size, end)
            if lo < hi:
                self.pieces.append((p, torch.nn.Parameter(flat[lo:hi].clone())))
            offset += size
        self.optimizer = optimizer_cls([piece for _, piece in self.pieces], **kwargs)

    def _flatten(self, tensors) -> torch.Tensor:
        flat = torch.cat([t.reshape(-1) for t in tensors])
        return torch.nn.functional.pad(flat, (0, self.shard * self.world_size - self.numel))

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        grads = self._flatten([p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params])
        mean = torch.empty(self.shard, dtype=grads.dtype)
        (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(mean, grads)
        offset = 0
        for p, piece in self.pieces:
            has_grad = p is not None and p.grad is not None
            piece.grad = mean[offset:offset + piece.numel()] / self.world_size if has_grad else None
            offset += piece.numel()
        self.optimizer.step()
        flat = torch.empty_like(grads)
        (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(
            flat, torch.cat([piece.detach() for _, piece in self.pieces]))
        offset = 0
        for p in self.params:
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
