"""A pipelined ring all-reduce: lesson 4's ring with each chunk cut into pieces, so sending overlaps adding.

The plain ring (lesson 4) sends a chunk, waits for the whole incoming chunk, adds it, and
only then sends it on: while a rank adds, its link is idle, and while it waits, its
processor is. Here every chunk travels as pieces of about ``piece_bytes``. All receives of
a step are posted at once (``irecv``, one tag per piece); as soon as piece j has arrived
and been added, it is sent on (``isend``) as piece j of the next step, while the pieces
after it are still in flight. The last reduce-scatter step flows straight into the
all-gather. Each rank sends 2(p-1)/p of the tensor, as in the plain ring, in more,
smaller messages. With ``piece_bytes=None`` every chunk is one piece: no pipelining.

Lesson 8 shows how it works; ``bench/ring_bench.py`` compares it with gloo's own
``all_reduce`` and the course's reference ring.

Example::

    >>> import torch
    >>> from helpers import launch
    >>> from helpers.ring import pipelined_ring_allreduce
    >>> out = launch(lambda rank, world_size: pipelined_ring_allreduce(torch.arange(6.) * (rank + 1), 8), 3,
    ...              output="quiet")
    >>> out[0].tolist()
    [0.0, 6.0, 12.0, 18.0, 24.0, 30.0]
"""

from __future__ import annotations

__all__ = ["pipelined_ring_allreduce", "ring_schedule"]

# The landing buffers of the last call, kept for the next call of the same size and dtype:
# allocating tens of megabytes afresh costs page faults on every call, as much as adding them.
_spare: dict = {}


def ring_schedule(rank: int, world_size: int) -> list[tuple[int, int, bool]]:
    """The ring's 2(p-1) steps for ``rank``: ``(chunk sent right, chunk received from the left, add it?)``.

    Reduce-scatter steps add what arrives (rank r ends owning the sum of chunk r); all-gather
    steps copy it. At every step a rank sends what it received at the step before.

    >>> ring_schedule(0, 3)
    [(2, 1, True), (1, 0, True), (0, 2, False), (2, 1, False)]
    """
    p = world_size
    steps = [((rank - s - 1) % p, (rank - s - 2) % p, True) for s in range(p - 1)]
    steps += [((rank - s) % p, (rank - s - 1) % p, False) for s in range(p - 1)]
    return steps


def pipelined_ring_allreduce(tensor, piece_bytes: int | None = 1 << 20):
    """Sum ``tensor`` in place over every rank of the default group with a pipelined ring; return it.

    ``tensor`` must be contiguous. Each chunk (ceil(n/p) elements) moves in pieces of about
    ``piece_bytes`` (at least one element); ``None`` sends every chunk whole.
    """
    import torch
    import torch.distributed as dist

    rank, p = dist.get_rank(), dist.get_world_size()
    if p == 1:
        return tensor
    right, left = (rank + 1) % p, (rank - 1) % p
    flat = tensor.view(-1)
    size = -(-flat.numel() // p)
    bounds = [(min(c * size, flat.numel()), min((c + 1) * size, flat.numel())) for c in range(p)]
    per_piece = max(1, piece_bytes // flat.element_size()) if piece_bytes else max(1, size)

    def pieces(chunk: int) -> list[tuple[int, int]]:
        start, stop = bounds[chunk]
        return [(i, min(i + per_piece, stop)) for i in range(start, stop, per_piece)]

    steps = ring_schedule(rank, p)
    key = (size, flat.dtype)
    if key not in _spare:
        _spare.clear()
        _spare[key] = [torch.empty(size, dtype=flat.dtype) for _ in range(2)]
    spare = _spare[key]  # two steps' landing buffers take turns
    sending: dict[int, list] = {c: [] for c in range(p)}  # chunk -> isends still reading it
    first = steps[0][0]  # step 0's chunk is ready at once: all of its pieces go now
    sending[first] = [dist.isend(flat[a:b], right, tag=j) for j, (a, b) in enumerate(pieces(first))]
    for s, (_, recv_chunk, add) in enumerate(steps):
        r0 = bounds[recv_chunk][0]
        if add:  # reduce-scatter: a piece lands in a spare buffer, to be added
            targets = [spare[s % 2][a - r0:b - r0] for a, b in pieces(recv_chunk)]
        else:    # all-gather: a finished piece lands where it belongs ...
            for request in sending[recv_chunk]:  # ... once no send still reads the old values there
                request.wait()
            sending[recv_chunk] = []
            targets = [flat[a:b] for a, b in pieces(recv_chunk)]
        receives = [dist.irecv(target, left, tag=j) for j, target in enumerate(targets)]
        last = s == len(steps) - 1
        for j, ((a, b), request) in enumerate(zip(pieces(recv_chunk), receives)):
            request.wait()
            if add:
                flat[a:b] += targets[j]
            if not last:  # what arrived (and was added) is the next step's piece j: pass it on now
                sending[recv_chunk].append(dist.isend(flat[a:b], right, tag=j))
    for requests in sending.values():
        for request in requests:
            request.wait()
    return tensor
