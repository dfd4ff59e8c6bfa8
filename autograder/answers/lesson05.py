"""Lesson 05's answers: Exercise 5.1 (averaging gradients) and 5.2 (data-parallel SGD).

The instructor's answers: learners write their own in the notebook. This package never ships
to learners and the grading sandbox hides it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["average_gradients", "train"]


def average_gradients(model: torch.nn.Module) -> None:
    """Exercise 5.1: every parameter's ``.grad`` becomes its mean over all ranks, in place.

    Frozen parameters, and those with no gradient on any rank, are left alone; a gradient on some ranks only counts
    as zero on the others. One small all-reduce first makes the ranks agree on which to reduce (the same calls).
    """
    world_size = dist.get_world_size()
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return
    present = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=params[0].device)
    dist.all_reduce(present)
    for p, ranks_with_grad in zip(params, present.tolist()):
        if ranks_with_grad == 0:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad)
        p.grad /= world_size


def train(rank: int, world_size: int, dataset, model: torch.nn.Module, epochs: int, batch_size: int,
          lr: float) -> list[float]:
    """Exercise 5.2: data-parallel SGD on this rank's shard; returns this rank's loss at each step."""
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, DistributedSampler

    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for inputs, labels in loader:
            loss = F.cross_entropy(model(inputs), labels)
            opt.zero_grad()
            loss.backward()
            average_gradients(model)
            opt.step()
            losses.append(loss.item())
    return losses
