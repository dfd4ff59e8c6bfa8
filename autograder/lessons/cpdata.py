"""What lesson 11's checks run on the ranks besides the learner's answer: layouts, one process's attention, and the
usual mistakes played on one process. The recorder they measure with, :class:`helpers.attention.TensorRecorder`,
is the one the notebook's pictures use.

:mod:`autograder.lessons.cpcheck` runs the learner's answers with these; they ship to learners with it.

Example (the zig-zag layout, and one process's causal attention)::

    >>> import torch
    >>> zigzag_chunks(0, 2), zigzag_chunks(1, 2)
    ((0, 3), (1, 2))
    >>> q = k = v = torch.zeros(1, 4, 2, dtype=torch.float64)
    >>> full_attention(q, k, v, causal=True).shape
    torch.Size([1, 4, 2])
"""

from __future__ import annotations

import math

from helpers.attention import TensorRecorder, zigzag_chunks, zigzag_positions

__all__ = ["SHAPES", "TOLERANCE", "MISTAKES", "full_attention", "zigzag_chunks", "zigzag_positions", "layout",
           "mistakes", "TensorRecorder", "memory_limit", "tolerance"]

#: Sizes per layout: heads, tokens per rank (contiguous) or per chunk (zig-zag), head width d. In the
#: contiguous layout d is half the block, so one score block per head (b x b) is as large as a stacked
#: key/value pair (2 x b x d) and a rank that holds all keys (p b x d) or a whole row of scores (b x p b)
#: makes a tensor larger than both from 3 ranks on. In the zig-zag layout d (5) differs from every
#: key length (3 and 6), so a product that contracts over d is a block of scores and nothing else.
SHAPES = {"ring": {"heads": 2, "block": 8, "d": 4}, "zigzag": {"heads": 2, "block": 3, "d": 5},
          "ulysses": {"heads": 4, "block": 6, "d": 3}}
TOLERANCE = {"float64": 1e-10, "float32": 1e-5}  # the least each dtype is allowed; see tolerance()


def tolerance(dtype_name: str, q, k, v) -> float:
    """How far a right answer's output may be from one process's in float64, for inputs ``q``, ``k``, ``v`` (the
    whole sequence's) of ``dtype_name``: the larger of :data:`TOLERANCE` and 16 u (1 + max|s|) max|v|.

    Why: u is the dtype's unit roundoff (2^-24 for float32). A score s = q.k / sqrt(d) comes out with an absolute
    error of a few u |s|; exp turns an absolute error e of its argument into a relative error e of its result, so
    every softmax weight, and the sum l, carry a relative error of a few u (1 + max|s|), whichever way the blocks
    are merged (rescaled by exp(m_old - m_new), or through log-sum-exp); the output, a weighted mean of the rows
    of v, is then off by that much times max|v|. Right float32 merges measured on these data stay under 2 u (1 +
    max|s|) max|v|; 16 leaves room, and still fails every real mistake, whose error is the size of the output.

    >>> import torch
    >>> ones = torch.ones(1, 2, 4)
    >>> tolerance("float64", ones, ones, ones), round(tolerance("float32", ones, ones, 3 * ones), 9)
    (1e-10, 1e-05)
    """
    import torch

    if dtype_name != "float32":
        return TOLERANCE[dtype_name]
    scores = q.double() @ k.double().transpose(-1, -2) / math.sqrt(q.shape[-1])
    bound = 16 * 2.0 ** -24 * (1 + float(scores.abs().max())) * float(v.double().abs().max())
    return max(TOLERANCE[dtype_name], bound)


def layout(kind: str, rank: int, world_size: int, block: int) -> list[int]:
    """The positions a rank holds: contiguous blocks of ``block`` tokens (``"ring"``, ``"ulysses"``) or zig-zag
    chunks of ``block`` tokens (``"zigzag"``)."""
    if kind == "zigzag":
        return zigzag_positions(rank, world_size, block)
    return list(range(rank * block, (rank + 1) * block))


def full_attention(q, k, v, causal: bool = False, q_pos=None, k_pos=None):
    """One process's attention, ``softmax(q k^T / sqrt(d)) v``; causal: a query sees keys at its position or before.

    ``q_pos`` and ``k_pos`` are the tokens' positions in the sequence (default 0, 1, ...).
    """
    import torch

    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        qp = torch.arange(q.shape[-2]) if q_pos is None else torch.as_tensor(q_pos)
        kp = torch.arange(k.shape[-2]) if k_pos is None else torch.as_tensor(k_pos)
        scores = scores.masked_fill(kp[None, :] > qp[:, None], float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


# -- the usual mistakes, played on one process ---------------------------------------------------------------


def _ring_order(rank: int, world_size: int) -> list[int]:
    """The ranks whose keys reach rank ``rank`` at steps 0, 1, ...: its own, then its left neighbour's, and so on."""
    return [(rank - step) % world_size for step in range(world_size)]


def _blockwise(q, ks: list, vs: list, masks: list, *, rescale: bool = True, divide_each_step: bool = False):
    """Online softmax over key blocks in the order given: running max m, sum l and output o.

    ``rescale=False`` keeps earlier blocks' o and l as they were when the max grows;
    ``divide_each_step`` divides o by the running sum at every step instead of once at the end.
    A mask entry None means no mask; False means the block is skipped.
    """
    import torch

    scale = 1 / math.sqrt(q.shape[-1])
    o = m = l = None
    for k, v, mask in zip(ks, vs, masks):
        if mask is False:
            continue
        s = q @ k.transpose(-1, -2) * scale
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        bm = s.amax(-1, keepdim=True)
        if m is None:
            m_new = bm
        else:
            m_new = torch.maximum(m, bm)
        pr = torch.exp(s - m_new)
        if o is None:
            o, l = pr @ v, pr.sum(-1, keepdim=True)
        else:
            alpha = torch.exp(m - m_new) if rescale else torch.ones_like(m)
            o, l = alpha * o + pr @ v, alpha * l + pr.sum(-1, keepdim=True)
        m = m_new
        if divide_each_step:
            o = o / l
    return o if divide_each_step else o / l


def _unnormalised(q, k, v, q_pos=None):
    """exp(s - m) v with m each row's largest score: merged blocks never divided by their sum l."""
    import torch

    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if q_pos is not None:
        s = s.masked_fill(torch.arange(k.shape[-2])[None, :] > q_pos[:, None], float("-inf"))
    return torch.exp(s - s.amax(-1, keepdim=True)) @ v


def mistakes(q_all, k_all, v_all, rank: int, world_size: int, kind: str, causal: bool, block: int) -> dict:
    """What each usual mistake would give this rank (contiguous and zig-zag layouts): name -> output."""
    import torch

    p = world_size
    pos = [layout(kind, r, p, block) for r in range(p)]
    qp = torch.tensor(pos[rank])
    q = q_all[:, pos[rank]]
    order = _ring_order(rank, p)
    ks, vs = [k_all[:, pos[j]] for j in order], [v_all[:, pos[j]] for j in order]
    kps = [torch.tensor(pos[j]) for j in order]

    def right_masks():
        return [(kp[None, :] <= qp[:, None]) if causal else None for kp in kps]

    n = len(pos[rank])
    found = {
        # Before the others: on rank 0 several of them reduce to this one, and this one says what happened.
        "own_only": _blockwise(q, ks[:1], vs[:1], [torch.ones(n, n, dtype=torch.bool).tril() if causal else None]),
        "no_rescale": _blockwise(q, ks, vs, right_masks(), rescale=False),
        "divide_each_step": _blockwise(q, ks, vs, right_masks(), divide_each_step=True),
        "no_scale": full_attention(q * math.sqrt(q.shape[-1]), k_all, v_all, causal, qp, torch.arange(k_all.shape[1])),
        "no_divide": _unnormalised(q, k_all, v_all, qp if causal else None),
    }
    if causal:
        local = torch.ones(n, n, dtype=torch.bool).tril()
        # A mask built from the positions inside the block (0 .. n-1) for queries and keys alike: the block's
        # own lower triangle on every block that is not skipped.
        local_masks = []
        for j, kp in zip(order, kps):
            if kind == "zigzag" or j == rank:
                local_masks.append(local)
            else:
                local_masks.append(local if j < rank else False)
        # Global query positions against the keys' positions inside their block: never masks on ranks past 0.
        # (Before "no_mask": on the last rank the two agree, and this one is the more telling.)
        found["global_query_local_key"] = _blockwise(
            q, ks, vs, [torch.arange(len(kp))[None, :] <= qp[:, None] for kp in kps])
        found["no_mask"] = full_attention(q, k_all, v_all)
        found["local_everywhere"] = _blockwise(q, ks, vs, local_masks)
        found["local_everywhere_unskipped"] = _blockwise(q, ks, vs, [local] * len(ks))
        if kind == "zigzag":
            found["contiguous_mask"] = _blockwise(  # the mask of 11.1's layout, as if rank r held block r
                q, ks, vs, [(torch.tensor(layout("ring", j, p, 2 * block))[None, :]
                             <= torch.tensor(layout("ring", rank, p, 2 * block))[:, None]) for j in order])
    return found


#: What feedback says when a rank's output equals one of :func:`_mistakes`'s: the mistake, and its fix.
MISTAKES = {
    "own_only": "Your output matches attention over this rank's own keys and values alone: the other ranks' blocks "
                "never reached the computation. Pass the key/value blocks round the ring, and merge each one as it "
                "arrives.",
    "no_rescale": "Your output matches merging the blocks without rescaling: when a new block raises the running "
                  "maximum m, the output and the sum gathered so far were computed with the old maximum and must be "
                  "multiplied by exp(m_old - m_new) before the new block's part is added.",
    "divide_each_step": "Your output matches dividing by the running sum at every step: keep the output unnormalised "
                        "(the sum of exp(score - m) v) while blocks arrive, and divide by the sum l once, after the "
                        "last block.",
    "no_divide": "Your output matches the merged blocks never divided by their sum: o gathers exp(score - m) v, so "
                 "return o / l once the last block is merged.",
    "no_scale": "Your output matches attention without the 1/sqrt(d) scale: divide the scores q k^T by sqrt(d), "
                "d being the head width (q.shape[-1]).",
    "no_mask": "Your output matches attention with no causal mask at all: with causal=True a query may only see keys "
               "at its own position or before.",
    "local_everywhere": "Your output matches a mask built from positions inside the block (0 .. n-1) for queries and "
                        "keys alike: that is right for the block on the diagonal only. Compare the tokens' positions "
                        "in the whole sequence; a key block from a rank before yours needs no mask, one after it is "
                        "skipped.",
    "global_query_local_key": "Your output matches a mask that compares the query's position in the whole sequence "
                              "with the key's position inside its block: use positions in the whole sequence for "
                              "both (block j's keys are at j*n .. j*n + n - 1).",
    "contiguous_mask": "Your output matches the mask of Exercise 11.1's contiguous layout: in the zig-zag layout rank r "
                       "holds chunks r and 2p - 1 - r, so its positions are those of zigzag_positions(r, p, chunk).",
}


def memory_limit() -> int:
    """Exercise 11.1's memory rule, in numbers: one (s/p) x (s/p) block of scores per head, or one stacked K/V pair.

    A tensor counts its elements, whatever its floating-point precision (scores computed in float64 for float32
    inputs count as many as in float32); a boolean or integer tensor counts its bytes over the inputs' bytes per
    number, so a boolean mask is smaller than a block of scores of the same shape.

    >>> memory_limit()
    128
    """
    sizes = SHAPES["ring"]
    h, b, d = sizes["heads"], sizes["block"], sizes["d"]
    return max(h * b * b, 2 * h * b * d)
