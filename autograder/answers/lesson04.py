"""Lesson 04's answers: Exercises 4.1-4.4, the ring all-reduce from point-to-point calls.

The instructor's answers: learners write their own in the notebook. This package never ships
to learners and the grading sandbox hides it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# Lesson 4's split into chunks is the exercise's statement, not an answer: learners get it too.
from autograder.lessons.ringcheck import chunk_bounds

__all__ = ["chunk_bounds", "ring_chunks", "ring_reduce_scatter", "ring_all_gather", "ring_allreduce"]


def ring_chunks(phase: str, step: int, rank: int, world_size: int) -> tuple[int, int]:
    """Exercise 4.1: ``(chunk sent right, chunk received from the left)`` at ``step`` of ``phase``.

    The ring's schedule in which rank r ends the reduce-scatter owning chunk r, as
    ``dist.reduce_scatter`` leaves item r on rank r, and starts the all-gather by sending it.
    In both phases a rank receives the chunk just below the one it sends, and at the next
    step sends what it has just received.

    >>> [ring_chunks("reduce-scatter", s, 0, 4) for s in range(3)]
    [(3, 2), (2, 1), (1, 0)]
    >>> [ring_chunks("all-gather", s, 0, 4) for s in range(3)]
    [(0, 3), (3, 2), (2, 1)]
    """
    if phase == "reduce-scatter":
        send = (rank - step - 1) % world_size
    elif phase == "all-gather":
        send = (rank - step) % world_size
    else:
        raise ValueError(f"phase is 'reduce-scatter' or 'all-gather', not {phase!r}")
    return send, (send - 1) % world_size


def _ring_pass(flat: torch.Tensor, phase: str, add: bool) -> None:
    """The p-1 steps of one phase on the flat view ``flat``: send right, receive from the left.

    Each step posts its send with ``isend`` before it receives, so the calls always pair up.
    """
    rank, p = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % p, (rank - 1) % p
    bounds = chunk_bounds(flat.numel(), p)
    buffer = torch.empty(bounds[0][1] - bounds[0][0], dtype=flat.dtype)
    for step in range(p - 1):
        send_chunk, recv_chunk = ring_chunks(phase, step, rank, p)
        s0, s1 = bounds[send_chunk]
        r0, r1 = bounds[recv_chunk]
        incoming = buffer[: r1 - r0]
        request = dist.isend(flat[s0:s1], right)  # the send is posted, so every rank reaches its recv
        dist.recv(incoming, left)
        request.wait()
        if add:
            flat[r0:r1] += incoming
        else:
            flat[r0:r1] = incoming


def ring_reduce_scatter(tensor: torch.Tensor) -> torch.Tensor:
    """Exercise 4.2: chunk ``rank`` of ``tensor`` (flattened) becomes its sum over all ranks, in place (p-1 messages)."""
    _ring_pass(tensor.view(-1), "reduce-scatter", add=True)
    return tensor


def ring_all_gather(tensor: torch.Tensor) -> torch.Tensor:
    """Exercise 4.3: every rank's chunk ``rank`` is copied into chunk ``rank`` on every rank, in place (p-1 messages)."""
    _ring_pass(tensor.view(-1), "all-gather", add=False)
    return tensor


def ring_allreduce(tensor: torch.Tensor) -> torch.Tensor:
    """Exercise 4.4: sum ``tensor`` in place over all ranks with a bandwidth-optimal ring.

    Reduce-scatter (p-1 steps: rank r then owns the full sum of chunk r), then all-gather
    (p-1 steps): each rank sends 2(p-1) messages of at most ceil(n/p) elements.
    """
    ring_reduce_scatter(tensor)
    ring_all_gather(tensor)
    return tensor
