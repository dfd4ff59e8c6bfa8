"""A faster ring all-reduce than lesson 4's: receives posted steps ahead, chunks sent in pieces.

Lesson 4's ring posts each step's receive only when it is ready to take the data. On
gloo (and most transports) a message moves only once its receiver has posted the
matching receive, so every step of that ring starts with a round trip: "I am ready" goes
left, and only then do the bytes come right. Here the receives of the next ``ahead``
steps are posted while this step is still running, each into a landing buffer of its
own, so the left neighbour's bytes flow the moment they are ready, even when it runs a
step or two ahead on a busy machine.

Every chunk also travels as pieces of at most ``piece_bytes``. All receives of a step
are posted at once (``irecv``, one tag per step and piece); as soon as piece j has
arrived and been added, it is sent on (``isend``) as piece j of the next step, while
the pieces after it are still in flight, so sending and adding overlap. The last
reduce-scatter step flows straight into the all-gather. Each rank sends 2(p-1)/p of the
tensor, as in the plain ring, in more, smaller messages.

``ahead=0`` and ``piece_bytes=None`` switch the two ideas off, so lesson 8 can measure
each one; with both off this is a plain ring like lesson 4's, its chunks turned by one
(:func:`ring_schedule`). This is the instructor's reference ring of lesson 8:
``bench/ring_bench.py`` compares it with gloo's own ``all_reduce`` and with lesson 4's
plain ring (the answer to Exercise 4.4).

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

    Reduce-scatter steps add what arrives, all-gather steps copy it; at every step a rank
    sends what it received at the step before, and receives what its left neighbour sends.
    Which rank owns which finished chunk between the two phases does not matter to an
    all-reduce: here rank r ends the reduce-scatter owning chunk r + 1 (mod p), a rotation
    on from the one lesson 4's exercises ask for (rank r owning chunk r, as
    ``dist.reduce_scatter`` leaves it).
    """
    p = world_size
    steps = [((rank - s) % p, (rank - s - 1) % p, True) for s in range(p - 1)]
    steps += [((rank - s + 1) % p, (rank - s) % p, False) for s in range(p - 1)]
    return steps


def pipelined_ring_allreduce(tensor, piece_bytes: int | None = 4 << 20, ahead: int = 2):
    """Sum ``tensor`` in place over every rank of the default group with a ring; return it.

    ``tensor`` must be contiguous. Each chunk (ceil(n/p) elements) moves in pieces of at
    most ``piece_bytes`` (at least one element each); ``None`` sends every chunk whole.
    The receives of the next ``ahead`` steps (at most p-1) are posted before this step's
    data is waited for, so that the left neighbour does not wait for them; ``0`` posts
    each step's receives only when the step begins. The reduce-scatter needs a landing
    buffer per step in flight: min(ahead + 1, p - 1) chunks, kept for the next call.

    >>> pipelined_ring_allreduce(None, piece_bytes=0)
    Traceback (most recent call last):
    ValueError: piece_bytes must be a positive number of bytes or None (whole chunks), not 0
    >>> pipelined_ring_allreduce(None, ahead=-1)
    Traceback (most recent call last):
    ValueError: ahead must be a whole number of steps, 0 or more, not -1
    """
    if piece_bytes is not None and (not isinstance(piece_bytes, int) or piece_bytes < 1):
        raise ValueError(f"piece_bytes must be a positive number of bytes or None (whole chunks), not {piece_bytes!r}")
    if not isinstance(ahead, int) or ahead < 0:
        raise ValueError(f"ahead must be a whole number of steps, 0 or more, not {ahead!r}")
    import torch
    import torch.distributed as dist

    if tensor.device.type != "cpu":
        raise ValueError(
            f"pipelined_ring_allreduce is written for CPU tensors over gloo, and this tensor is on "
            f"{tensor.device}. It posts receives before the matching sends and tells messages apart by tag; "
            "nccl ignores tags and runs a pair's sends and receives in the order they were issued, so on "
            "GPUs this ring could deadlock. Move the tensor to the CPU (tensor.cpu()) and launch with "
            "backend='gloo', or use dist.all_reduce, whose nccl ring is already pipelined."
        )
    rank, p = dist.get_rank(), dist.get_world_size()
    if p == 1:
        return tensor
    right, left = (rank + 1) % p, (rank - 1) % p
    flat = tensor.view(-1)
    size = -(-flat.numel() // p)
    bounds = [(min(c * size, flat.numel()), min((c + 1) * size, flat.numel())) for c in range(p)]
    per_piece = min(size, max(1, piece_bytes // flat.element_size())) if piece_bytes else max(1, size)
    per_chunk = -(-size // per_piece)  # pieces in a full chunk: tags run step * per_chunk + piece

    def pieces(chunk: int) -> list[tuple[int, int]]:
        start, stop = bounds[chunk]
        return [(i, min(i + per_piece, stop)) for i in range(start, stop, per_piece)]

    steps = ring_schedule(rank, p)
    # Receives posted this many steps early. An all-gather receive overwrites a chunk this
    # rank sent in the reduce-scatter, p-1 steps before; going further ahead than p-1 would
    # wait for sends not made yet.
    ahead = min(ahead, p - 1)
    landing = max(1, min(ahead + 1, p - 1))  # reduce-scatter steps in flight at once
    key = (size, flat.dtype, landing)
    if key not in _spare:
        _spare.clear()
        _spare[key] = [torch.empty(size, dtype=flat.dtype) for _ in range(landing)]
    spare = _spare[key]  # reduce-scatter step s lands in spare[s % landing]
    sending: dict[int, list] = {c: [] for c in range(p)}  # chunk -> its isends, piece by piece

    def post_receives(s: int) -> list:
        """Post every receive of step s; return (where the piece lands, request) per piece."""
        _, chunk, add = steps[s]
        posted = []
        for j, (a, b) in enumerate(pieces(chunk)):
            if add:    # reduce-scatter: the piece lands in a spare buffer, to be added
                target = spare[s % landing][a - bounds[chunk][0]:b - bounds[chunk][0]]
            else:      # all-gather: the finished piece lands where it belongs, once the
                target = flat[a:b]  # send that still reads the old values there is done
                if sending[chunk]:
                    sending[chunk][j].wait()
            posted.append((target, dist.irecv(target, left, tag=s * per_chunk + j)))
        if not add:
            sending[chunk] = []
        return posted

    receives = {s: post_receives(s) for s in range(ahead)}
    first = steps[0][0]  # step 0's chunk is ready at once: all of its pieces go now
    sending[first] = [dist.isend(flat[a:b], right, tag=j) for j, (a, b) in enumerate(pieces(first))]
    for s, (_, chunk, add) in enumerate(steps):
        for early in range(s, min(s + ahead, len(steps) - 1) + 1):
            if early not in receives:  # step s's own receives, then the ones ahead of it
                receives[early] = post_receives(early)
        last = s == len(steps) - 1
        for j, ((a, b), (target, request)) in enumerate(zip(pieces(chunk), receives.pop(s))):
            request.wait()
            if add:
                flat[a:b] += target
            if not last:  # what arrived (and was added) is the next step's piece j: pass it on now
                sending[chunk].append(dist.isend(flat[a:b], right, tag=(s + 1) * per_chunk + j))
    for requests in sending.values():
        for request in requests:
            request.wait()
    return tensor
