"""Checks of hand-built context parallelism (lesson 11, Exercises 11.1-11.3): what runs on the ranks, and the judging.

The learner's ``ring_attention(q, k, v, causal=False)`` gets this rank's block of queries,
keys and values, each ``(heads, s/p, d)``: rank r holds positions ``r*s/p`` to
``(r+1)*s/p - 1`` of a sequence of s tokens. It returns this rank's block of the output of
softmax(q k^T / sqrt(d)) v over the *whole* sequence. Exercise 11.2's
``zigzag_attention(q, k, v)`` is the causal one with the sequence cut into 2p chunks and rank r
holding chunks r and 2p - 1 - r side by side; 11.3's ``ulysses_attention(q, k, v, causal=False)``
takes the same blocks as 11.1 and trades them for whole heads with ``all_to_all``.

- :func:`attention_worker` (on the ranks): draws q, k and v for the whole sequence from a seed
  drawn at grading time, gives this rank its blocks, and runs the learner's function under two
  recorders: the rank's ``torch.distributed`` calls (:func:`autograder.lessons.pieces.recorded`)
  and :class:`TensorRecorder`, a ``TorchDispatchMode`` that notes the largest tensor any torch
  operation created and how many attention scores were computed. It returns, per case, the
  verdict against one process's full attention and, when wrong, which usual mistake
  (:data:`MISTAKES`) gives the learner's numbers;
- :func:`judge_correct`, :func:`judge_ring`, :func:`judge_memory`, :func:`judge_balanced`,
  :func:`judge_exchange`: the feedback.

What "p - 1 blocks" means (Exercise 11.1's text says the same): over one call each rank sends
its right neighbour exactly p - 1 blocks' worth of keys and values, (p - 1) x (the key block's
bytes + the value block's bytes), and receives as much from its left neighbour; nothing to any
other rank. K and V may travel stacked in one message or as two messages of the same step, by
``send``/``recv``, ``isend``/``irecv`` or ``batch_isend_irecv``: the bytes are the same.

The exercises and parts are declared in :mod:`autograder.lessons.lesson11`; this module ships
to learners with it (the self-checks use it).

Example (one process's reference, and the zig-zag layout)::

    >>> import torch
    >>> zigzag_chunks(0, 2), zigzag_chunks(1, 2)
    ((0, 3), (1, 2))
    >>> q = k = v = torch.zeros(1, 4, 2, dtype=torch.float64)
    >>> full_attention(q, k, v, causal=True).shape
    torch.Size([1, 4, 2])
"""

from __future__ import annotations

import math
from typing import Any, Callable

from .kit import Attempt
from .pieces import HALF_FINISHED, plural, read_before_wait, recorded

__all__ = ["SHAPES", "TOLERANCE", "MISTAKES", "full_attention", "zigzag_chunks", "zigzag_positions", "layout",
           "TensorRecorder", "attention_worker", "judge_correct", "judge_ring", "judge_memory", "judge_balanced",
           "judge_exchange", "memory_limit", "balanced_limit"]

#: Sizes per layout: heads, tokens per rank (contiguous) or per chunk (zig-zag), head width d. In the
#: contiguous layout d is half the block, so one score block per head (b x b) is as large as a stacked
#: key/value pair (2 x b x d) and a rank that holds all keys (p b x d) or a whole row of scores (b x p b)
#: makes a tensor larger than both from 3 ranks on. In the zig-zag layout d (5) differs from every
#: key length (3 and 6), so a product that contracts over d is a block of scores and nothing else.
SHAPES = {"ring": {"heads": 2, "block": 8, "d": 4}, "zigzag": {"heads": 2, "block": 3, "d": 5},
          "ulysses": {"heads": 4, "block": 6, "d": 3}}
TOLERANCE = {"float64": 1e-10, "float32": 1e-5}


def zigzag_chunks(rank: int, world_size: int) -> tuple[int, int]:
    """The two chunks of a sequence cut into 2p that rank ``rank`` holds in the zig-zag layout: r and 2p - 1 - r."""
    return rank, 2 * world_size - 1 - rank


def zigzag_positions(rank: int, world_size: int, chunk: int) -> list[int]:
    """The sequence positions of rank ``rank``'s tokens in the zig-zag layout, in the order it holds them.

    >>> zigzag_positions(0, 2, 2)
    [0, 1, 6, 7]
    """
    return [c * chunk + i for c in zigzag_chunks(rank, world_size) for i in range(chunk)]


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


def _mistakes(q_all, k_all, v_all, rank: int, world_size: int, kind: str, causal: bool, block: int) -> dict:
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

    found = {
        "no_rescale": _blockwise(q, ks, vs, right_masks(), rescale=False),
        "divide_each_step": _blockwise(q, ks, vs, right_masks(), divide_each_step=True),
        "no_scale": full_attention(q * math.sqrt(q.shape[-1]), k_all, v_all, causal, qp, torch.arange(k_all.shape[1])),
    }
    if causal:
        n = len(pos[rank])
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
    "no_rescale": "Your output matches merging the blocks without rescaling: when a new block raises the running "
                  "maximum m, the output and the sum gathered so far were computed with the old maximum and must be "
                  "multiplied by exp(m_old - m_new) before the new block's part is added.",
    "divide_each_step": "Your output matches dividing by the running sum at every step: keep the output unnormalised "
                        "(the sum of exp(score - m) v) while blocks arrive, and divide by the sum l once, after the "
                        "last block.",
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


# -- recording what the answer created ---------------------------------------------------------------------


_MATMULS = ("aten.mm.", "aten.bmm.", "aten.addmm.", "aten.baddbmm.", "aten.matmul.", "aten.dot.")
_SDPA = ("aten._scaled_dot_product",)


class TensorRecorder:
    """A ``TorchDispatchMode`` that notes, while it is active, the largest tensor torch operations create and the
    attention scores computed.

    ``largest`` is ``(elements, shape, op)`` of the largest tensor an operation returned that is not a view of
    another; ``scores`` the number of scores computed: the elements of every matrix product that contracts over
    the head width ``d`` (q k^T; p v contracts over keys), and L x S per head of a fused attention call.
    With a ``limit`` (elements), ``first_over`` is the first such tensor larger than it, as ``largest`` words it.

    >>> import torch
    >>> with TensorRecorder(d=3) as rec:
    ...     s = torch.ones(2, 4, 3) @ torch.ones(2, 3, 5)
    >>> rec.largest[:2], rec.scores
    ((40, (2, 4, 5)), 40)
    """

    def __init__(self, d: int, limit: int | None = None) -> None:
        self.d, self.limit = d, limit
        self.largest: tuple[int, tuple, str] = (0, (), "")
        self.first_over: tuple[int, tuple, str] | None = None
        self.scores = 0
        self._mode = None

    def __enter__(self) -> "TensorRecorder":
        from torch.utils._python_dispatch import TorchDispatchMode

        recorder = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                recorder._note(func, args, out)
                return out

        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)

    def _note(self, func, args, out) -> None:
        import torch
        from torch.utils._pytree import tree_flatten

        name = str(func)
        if not getattr(func, "is_view", False):
            for t in tree_flatten(out)[0]:
                if not isinstance(t, torch.Tensor):
                    continue
                if t.numel() > self.largest[0]:
                    self.largest = (t.numel(), tuple(t.shape), name)
                if self.limit is not None and self.first_over is None and t.numel() > self.limit:
                    self.first_over = (t.numel(), tuple(t.shape), name)
        if name.startswith(_MATMULS):
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            first = tensors[-2] if name.startswith(("aten.addmm.", "aten.baddbmm.")) else tensors[0]
            if first.dim() >= 1 and first.shape[-1] == self.d and isinstance(out, torch.Tensor):
                self.scores += out.numel()
        elif name.startswith(_SDPA):
            q, k = args[0], args[1]
            self.scores += math.prod(q.shape[:-1]) * k.shape[-2]


# -- the worker ------------------------------------------------------------------------------------------


def _data(seed: int, heads: int, s: int, d: int, dtype_name: str):
    import torch

    g = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, dtype_name)
    # Scores spread over several units, so blocks' maxima differ and a merge that forgets to rescale shows.
    return [(torch.randn(heads, s, d, generator=g, dtype=torch.float64) * 2).to(dtype) for _ in range(3)]


def attention_worker(rank: int, world_size: int, fn: Callable, seed: int, kind: str, cases: list) -> list[dict]:
    """Run ``fn`` on this rank for each case ``(causal, dtype_name)``; one verdict row per case.

    A row holds: ``ok``; ``error`` (the largest difference); ``why`` and ``mistake`` when wrong; ``calls``
    (``(op, peer, bytes)`` of every call the answer made); ``largest`` and ``scores`` (from
    :class:`TensorRecorder`); ``kv_bytes`` (one key block's plus one value block's bytes).
    """
    import torch

    sizes = SHAPES[kind]
    heads, block, d = sizes["heads"], sizes["block"], sizes["d"]
    per_rank = 2 * block if kind == "zigzag" else block
    s = per_rank * world_size
    rows = []
    for i, (causal, dtype_name) in enumerate(cases):
        q_all, k_all, v_all = _data(seed + 7919 * i, heads, s, d, dtype_name)
        mine = layout(kind, rank, world_size, block)
        q, k, v = (t[:, mine].clone() for t in (q_all, k_all, v_all))
        row: dict[str, Any] = {"causal": causal, "dtype": dtype_name, "ok": False, "mistake": None, "hint": ""}
        recorder = TensorRecorder(d, memory_limit(world_size) if kind == "ring" else None)
        with recorder:
            out, calls = recorded(lambda: fn(q, k, v) if kind == "zigzag" else fn(q, k, v, causal=causal))
        row["calls"] = [(e.op, e.peer, e.nbytes) for e in calls]
        row["largest"], row["scores"], row["over"] = recorder.largest, recorder.scores, recorder.first_over
        row["kv_bytes"] = k.numel() * k.element_size() + v.numel() * v.element_size()
        row["block_bytes"] = q.numel() * q.element_size()
        want = full_attention(q_all.double(), k_all.double(), v_all.double(), causal)[:, mine].to(q.dtype)
        if not isinstance(out, torch.Tensor):
            row["why"] = f"it returned {type(out).__name__}, not a tensor: return this rank's output block"
        elif tuple(out.shape) != tuple(want.shape):
            row["why"] = (f"it returned a tensor of shape {tuple(out.shape)}; this rank's output block has the shape "
                          f"of its queries, {tuple(want.shape)} (heads, tokens on this rank, d)")
        elif out.dtype != want.dtype:
            row["why"] = f"it returned {out.dtype}; keep the inputs' dtype, {want.dtype}"
        else:
            error = float((out.detach().double() - want.double()).abs().max())
            row["error"] = error
            tol = TOLERANCE[dtype_name]
            if error <= tol and not torch.isnan(out).any():
                row["ok"] = True
            else:
                bad = (out.detach().double() - want.double()).abs() > tol
                h, t, c = (int(x) for x in bad.nonzero()[0]) if bad.any() else (0, 0, 0)
                row["why"] = (f"its output differs from one process's full attention by up to {error:.3g} (allowed "
                              f"{tol:g}); first at head {h}, token {t} of this rank (position {mine[t]} of {s}): "
                              f"expected {float(want[h, t, c]):.6g}, got {float(out[h, t, c]):.6g}")
                if bool(torch.isnan(out).any()):
                    row["why"] += ("; it holds NaN: a row of scores masked entirely gives exp(-inf - (-inf)); skip "
                                   "blocks that are masked for every query instead of masking them")
                for name, got in _mistakes(q_all.double(), k_all.double(), v_all.double(), rank, world_size, kind,
                                           causal, block).items():
                    if got is not None and float((got - out.detach().double()).abs().max()) <= max(tol, 1e-6):
                        row["mistake"] = name
                        break
                if row["mistake"] is None and read_before_wait(calls):
                    row["hint"] = HALF_FINISHED
        rows.append(row)
    return rows


# -- judging ----------------------------------------------------------------------------------------------


def _where(p: int, row: dict) -> str:
    return f"on {plural(p, 'rank')}, {'causal' if row['causal'] else 'not causal'}, {row['dtype']}"


def judge_correct(attempt: Attempt, p: int, replies: list) -> None:
    """Every rank's output block equals one process's full attention on its positions."""
    for rank, rows in enumerate(replies):
        for row in rows:
            if row["ok"]:
                continue
            msg = f"{_where(p, row)}, rank {rank}: {row['why']}."
            if row.get("mistake"):
                msg += "\n  " + MISTAKES[row["mistake"].removesuffix("_unskipped")]
            if row.get("hint"):
                msg += "\n  " + row["hint"]
            attempt.fail(msg)


def _sizes(calls: list, which: Callable) -> list:
    return [(peer, n or 0) for op, peer, n in calls if which(op)]


def judge_ring(attempt: Attempt, p: int, replies: list) -> None:
    """Each rank sends (p - 1) x (K block + V block) bytes to its right neighbour only, receives as much from its left.

    In one, two or 2(p - 1) messages' worth per step: stacked K and V, or K and V as two messages of a step.
    Every call must be a point-to-point one (collectives are switched off anyway).
    """
    for rank, rows in enumerate(replies):
        right, left = (rank + 1) % p, (rank - 1) % p
        for row in rows:
            if row["causal"]:
                continue  # a causal ring passes the same blocks; the non-causal runs are counted
            where, kv = f"{_where(p, row)}, rank {rank}", row["kv_bytes"]
            sends = _sizes(row["calls"], lambda op: op in ("send", "isend"))
            recvs = _sizes(row["calls"], lambda op: op in ("recv", "irecv"))
            other = sorted({op for op, _, _ in row["calls"]} - {"send", "isend", "recv", "irecv", "wait"})
            if other:
                attempt.fail(f"{where} called {', '.join(other)}; a ring moves the key and value blocks with "
                             "send/recv, isend/irecv or batch_isend_irecv only (tensors, not Python objects).")
            if p == 1:
                if sends or recvs:
                    attempt.fail(f"{where} sent or received messages; alone, a rank already holds every key.")
                continue
            wrong_peer = sorted({peer for peer, _ in sends if peer != right})
            if wrong_peer:
                attempt.fail(f"{where} sent to rank {wrong_peer[0]}; in a ring each rank sends only to its right "
                             f"neighbour, rank {right} = (rank + 1) % p.")
            from_whom = sorted({str(peer) for peer, _ in recvs if peer != left})
            if from_whom:
                attempt.fail(f"{where} received from {'any source' if 'None' in from_whom else 'rank ' + from_whom[0]}; "
                             f"in a ring each rank receives only from its left neighbour, rank {left} = "
                             "(rank - 1) % p (say src=left).")
            sent, got = sum(n for _, n in sends), sum(n for _, n in recvs)
            want = (p - 1) * kv
            too_big = [n for _, n in sends if n > kv]
            if too_big:
                attempt.fail(f"{where} sent a message of {too_big[0]} bytes, more than one key block and one value "
                             f"block together ({kv} bytes): pass one block pair per step, not several.")
            if sent != want or got != want:
                blocks = sent / kv
                attempt.fail(f"{where} sent {sent} bytes and received {got} in {plural(len(sends), 'message')}: "
                             f"{blocks:g} key/value blocks; a ring attention passes its neighbour p - 1 = "
                             f"{plural(p - 1, 'block')} of keys and values, {want} bytes ({kv} per step, K and V together or as "
                             "two messages of the same step). "
                             + ("Do not send the block you received at the last step: nobody needs it."
                                if sent > want else "Every step but the last passes on the block that just arrived."))


def memory_limit(p: int) -> int:
    """Exercise 11.1's memory rule in elements: one (s/p) x (s/p) block of scores per head, or one stacked K/V pair."""
    sizes = SHAPES["ring"]
    h, b, d = sizes["heads"], sizes["block"], sizes["d"]
    return max(h * b * b, 2 * h * b * d)


def judge_memory(attempt: Attempt, p: int, replies: list) -> None:
    """No tensor created while the answer ran is larger than one block of scores per head (or one stacked K/V pair)."""
    sizes = SHAPES["ring"]
    h, b, d = sizes["heads"], sizes["block"], sizes["d"]
    limit = memory_limit(p)
    for rank, rows in enumerate(replies):
        for row in rows:
            if row["over"] is None:
                continue
            n, shape, op = row["over"]
            what = ""
            if shape and shape[-1] == d and n >= h * p * b * d:
                what = (f" That is every rank's {'keys or values' if n < 2 * h * p * b * d else 'keys and values'} "
                        f"at once ({p * b} tokens): a ring attention never holds more than the block in hand and the "
                        "one arriving. Compute with each block as it comes and let it go.")
            elif shape and shape[-1] == p * b:
                what = (f" That is a whole row of scores, {b} queries x all {p * b} keys: compute one {b} x {b} block "
                        "of scores per step and merge it with the online softmax.")
            attempt.fail(f"{_where(p, row)}, rank {rank} created a tensor of shape {shape} ({n} elements, by {op}); "
                         f"the most a step needs is {limit} elements: one {b} x {b} block of scores for each of the "
                         f"{h} heads ({h * b * b}), or a key block and a value block stacked ({2 * h * b * d})."
                         + what)


def balanced_limit(p: int) -> int:
    """Exercise 11.2's most score elements a rank may compute: its own two chunks causally (a (2c) x (2c) block)
    plus half of each of the other p - 1 blocks, per head."""
    sizes = SHAPES["zigzag"]
    h, c = sizes["heads"], sizes["block"]
    return h * (4 * c * c + (p - 1) * 2 * c * c)


def judge_balanced(attempt: Attempt, p: int, replies: list) -> None:
    """Every rank computed the same number of scores, at most :func:`balanced_limit` (fully masked blocks skipped)."""
    sizes = SHAPES["zigzag"]
    h, c = sizes["heads"], sizes["block"]
    counts = [rows[0]["scores"] for rows in replies]
    full = h * p * (2 * c) ** 2
    if any(n == 0 for n in counts):
        attempt.fail(f"on {plural(p, 'rank')}, the checks counted no scores on rank {counts.index(0)}: compute the "
                     "scores as q @ k.transpose(-1, -2) (or torch.matmul, einsum or bmm) so they can be counted.")
    if len(set(counts)) > 1:
        attempt.fail(f"on {plural(p, 'rank')}, the ranks computed {counts} scores: the zig-zag split gives every rank "
                     "the same causal work. Is the layout right (rank r holds chunks r and 2p - 1 - r)?")
    if counts[0] > balanced_limit(p):
        attempt.fail(f"on {plural(p, 'rank')}, each rank computed {counts[0]} scores; skipping what the causal mask "
                     f"hides leaves at most {balanced_limit(p)} ({full} without skipping). From a rank before yours "
                     "only the first chunk of its keys is visible, to both your chunks; from a rank after yours "
                     "only your second chunk sees its keys. Compute just those products.")


def judge_exchange(attempt: Attempt, p: int, replies: list) -> None:
    """Exercise 11.3: all_to_all only, moving q, k and v in and the output back: 4 blocks' bytes per rank."""
    for rank, rows in enumerate(replies):
        for row in rows:
            where = f"{_where(p, row)}, rank {rank}"
            ops = sorted({op for op, _, _ in row["calls"]} - {"wait"})
            bad = [op for op in ops if op not in ("all_to_all", "all_to_all_single")]
            if bad:
                attempt.fail(f"{where} called {', '.join(bad)}; Ulysses moves data with all_to_all (or "
                             "all_to_all_single) only.")
            if p == 1:
                continue
            moved = sum(n or 0 for op, _, n in row["calls"] if op.startswith("all_to_all"))
            want = 4 * row["block_bytes"]
            if moved != want:
                attempt.fail(f"{where} passed {moved} bytes through all_to_all; Ulysses exchanges q, k and v (sequence "
                             f"split -> heads split) and the output back (heads -> sequence): 4 x {row['block_bytes']} "
                             f"= {want} bytes per rank.")
