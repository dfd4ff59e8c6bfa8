"""Instructor reference answers of lesson 11 (context parallelism); each lesson's are in :mod:`autograder.answers`.

Like every module there, it never ships to learners and the grading sandbox hides it. How to use it::

    from autograder.answers.lesson11 import ring_attention
    helpers.launch(lambda rank, ws: ring_attention(*torch.randn(3, 2, 8, 4)).shape, 4)
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["block_attention", "merge_blocks", "ring_attention", "zigzag_attention", "ulysses_attention"]


def block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None):
    """One block of attention, unnormalised: ``(o, m, l)`` with o = exp(s - m) v, m the rows' maxima, l their sums."""
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    m = s.amax(-1, keepdim=True)
    e = torch.exp(s - m)
    return e @ v, m, e.sum(-1, keepdim=True)


def merge_blocks(a, b):
    """Two partial results ``(o, m, l)`` over different keys merged into one, each rescaled to the larger maximum."""
    if a is None:
        return b
    (oa, ma, la), (ob, mb, lb) = a, b
    m = torch.maximum(ma, mb)
    wa, wb = torch.exp(ma - m), torch.exp(mb - m)
    return oa * wa + ob * wb, m, la * wa + lb * wb


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """Exercise 11.1: keys and values travel right round the ring; each block is merged as it arrives.

    The next block's receive is posted before the current block is computed, so the transfer
    overlaps the work; K and V travel stacked in one message per step.
    """
    rank, p = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % p, (rank - 1) % p
    kv, acc = torch.stack((k, v)), None
    for step in range(p):
        if step < p - 1:
            incoming = torch.empty_like(kv)
            requests = [dist.isend(kv, right), dist.irecv(incoming, left)]
        source = (rank - step) % p            # whose keys are in hand
        if not causal or source < rank:
            acc = merge_blocks(acc, block_attention(q, kv[0], kv[1]))
        elif source == rank:                  # the diagonal block: positions inside it compare as they are
            n = q.shape[-2]
            acc = merge_blocks(acc, block_attention(q, kv[0], kv[1], torch.ones(n, n, dtype=torch.bool).tril()))
        if step < p - 1:
            for request in requests:
                request.wait()
            kv = incoming
    o, _, l = acc
    return o / l


def zigzag_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Exercise 11.2: causal ring attention on the zig-zag layout (rank r holds chunks r and 2p - 1 - r).

    From a rank before this one only the first chunk of its keys is visible, to all this rank's
    queries; from a rank after it, all its keys are visible to this rank's second chunk only.
    """
    rank, p = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % p, (rank - 1) % p
    n = q.shape[-2]
    c = n // 2
    kv = torch.stack((k, v))
    whole = acc = None
    late = None                               # the second chunk's partial results from later ranks
    for step in range(p):
        if step < p - 1:
            incoming = torch.empty_like(kv)
            requests = [dist.isend(kv, right), dist.irecv(incoming, left)]
        source = (rank - step) % p
        if source == rank:
            whole = block_attention(q, kv[0], kv[1], torch.ones(n, n, dtype=torch.bool).tril())
        elif source < rank:
            whole = merge_blocks(whole, block_attention(q, kv[0, :, :c], kv[1, :, :c]))
        else:
            late = merge_blocks(late, block_attention(q[:, c:], kv[0], kv[1]))
        if step < p - 1:
            for request in requests:
                request.wait()
            kv = incoming
    o, m, l = whole
    if late is not None:
        o2, m2, l2 = merge_blocks((o[:, c:], m[:, c:], l[:, c:]), late)
        o, l = torch.cat((o[:, :c], o2), 1), torch.cat((l[:, :c], l2), 1)
    return o / l


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """Exercise 11.3: all-to-all from sequence-split to heads-split, whole attention on h/p heads, and back.

    ``all_to_all_single`` (one tensor, cut along its first dimension into p equal pieces, piece j to rank j)
    runs on gloo in every torch the course supports; the list form ``all_to_all`` needs a newer gloo.
    """
    p = dist.get_world_size()
    h, n, d = q.shape

    def to_heads(x):                          # (h, s/p, d) -> (h/p, s, d): piece j of the heads goes to rank j
        got = torch.empty(p, h // p, n, d, dtype=x.dtype)
        dist.all_to_all_single(got, x.reshape(p, h // p, n, d).contiguous())
        return got.transpose(0, 1).reshape(h // p, p * n, d)   # rank j's tokens come j-th: the sequence in order

    qh, kh, vh = to_heads(q), to_heads(k), to_heads(v)
    s = qh @ kh.transpose(-1, -2) / d ** 0.5
    if causal:
        m = s.shape[-1]
        s = s.masked_fill(~torch.ones(m, m, dtype=torch.bool).tril(), float("-inf"))
    out = torch.softmax(s, -1) @ vh           # (h/p, s, d)
    got = torch.empty(p, h // p, n, d, dtype=q.dtype)
    dist.all_to_all_single(got, out.reshape(h // p, p, n, d).transpose(0, 1).contiguous())  # rank j's tokens back to j
    return got.reshape(h, n, d)               # the heads in order: (h, s/p, d)
