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
  recorders: the rank's ``torch.distributed`` calls (:func:`autograder.kit.pieces.recorded`)
  and :class:`TensorRecorder`, a ``TorchDispatchMode`` that notes the largest tensor any torch
  operation created, the most bytes the answer's tensors held at once and how many attention
  scores were computed. It returns, per case, the verdict against one process's full attention
  (within :func:`autograder.lessons.cpdata.tolerance`) and, when wrong, which usual mistake
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

Layouts, one process's attention, the mistakes and the recorder are in :mod:`autograder.lessons.cpdata`.

Example (the most score elements a zig-zag rank may compute on 2 ranks, per the rule above)::

    >>> balanced_limit(2)
    108
"""

from __future__ import annotations

from typing import Any, Callable

from .cpdata import MISTAKES, SHAPES, TensorRecorder, full_attention, layout, memory_limit, mistakes, tolerance
from ..kit.exercise import Attempt
from ..kit.pieces import plural, recorded

__all__ = ["attention_worker", "judge_correct", "judge_ring", "judge_memory", "judge_balanced", "judge_exchange",
           "balanced_limit", "visible_scores"]

# -- the worker ------------------------------------------------------------------------------------------


def _data(seed: int, heads: int, s: int, d: int, dtype_name: str):
    import torch

    g = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, dtype_name)
    # Scores spread over several units, so blocks' maxima differ and a merge that forgets to rescale shows.
    return [(torch.randn(heads, s, d, generator=g, dtype=torch.float64) * 2).to(dtype) for _ in range(3)]


def attention_worker(rank: int, world_size: int, fn: Callable, seed: int, kind: str, cases: list) -> list[dict]:
    """Run ``fn`` on this rank for each case ``(causal, dtype_name)``; one verdict row per case.

    A row holds: ``ok``; ``error`` (the largest difference) and ``tolerance``; ``why`` and ``mistake`` when wrong;
    ``calls`` (``(op, peer, bytes)`` of every call the answer made); ``largest``, ``over`` (the first tensor over
    Exercise 11.1's limit, in numbers), ``peak_live`` (the most bytes the answer's tensors held at once) and
    ``scores`` (from :class:`TensorRecorder`); ``kv_bytes`` (one key block's plus one value block's bytes).
    """
    import torch

    sizes = SHAPES[kind]
    heads, block, d = sizes["heads"], sizes["block"], sizes["d"]
    per_rank = 2 * block if kind == "zigzag" else block
    s = per_rank * world_size
    rows = []
    for i, (causal, dtype_name) in enumerate(cases):
        mine = layout(kind, rank, world_size, block)
        q, k, v = (t[:, mine].clone() for t in _data(seed + 7919 * i, heads, s, d, dtype_name))
        # Only this rank's blocks exist while the answer runs: the others' keys must come by message.
        row: dict[str, Any] = {"causal": causal, "dtype": dtype_name, "ok": False, "mistake": None,
                               "kv_bytes": k.numel() * k.element_size() + v.numel() * v.element_size(),
                               "block_bytes": q.numel() * q.element_size()}
        recorder = TensorRecorder(d, memory_limit() if kind == "ring" else None, itemsize=q.element_size())
        try:
            with recorder:
                out, calls = recorded(lambda: fn(q, k, v) if kind == "zigzag" else fn(q, k, v, causal=causal))
        except RuntimeError as err:
            if "does not support alltoall" not in str(err):
                raise
            # torch 2.4's gloo has all_to_all_single only: name the call that runs instead of blaming the checks
            row.update(calls=[], largest=0, scores=0, over=None, peak_live=0,
                       why=(f"dist.all_to_all failed: {str(err).splitlines()[0]}. This torch's gloo has no list form; "
                            "use dist.all_to_all_single(output, input), which cuts input along its first dimension "
                            "into p equal pieces, piece j to rank j"))
            rows.append(row)
            continue
        row["calls"] = [(e.op, e.peer, e.nbytes) for e in calls]
        row["largest"], row["scores"], row["over"] = recorder.largest, recorder.scores, recorder.first_over
        row["peak_live"] = recorder.peak_live
        q_all, k_all, v_all = _data(seed + 7919 * i, heads, s, d, dtype_name)
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
            tol = tolerance(dtype_name, q_all, k_all, v_all)
            row["error"], row["tolerance"] = error, tol
            if error <= tol and not torch.isnan(out).any():
                row["ok"] = True
            else:
                bad = (out.detach().double() - want.double()).abs() > tol
                h, t, c = (int(x) for x in bad.nonzero()[0]) if bad.any() else (0, 0, 0)
                row["why"] = (f"its output differs from one process's full attention by up to {error:.3g} (allowed "
                              f"{tol:.3g}); first at head {h}, token {t} of this rank (position {mine[t]} of {s}): "
                              f"expected {float(want[h, t, c]):.6g}, got {float(out[h, t, c]):.6g}")
                if bool(torch.isnan(out).any()):
                    row["why"] += ("; it holds NaN: a row of scores masked entirely gives exp(-inf - (-inf)); skip "
                                   "blocks that are masked for every query instead of masking them")
                for name, got in mistakes(q_all.double(), k_all.double(), v_all.double(), rank, world_size, kind,
                                           causal, block).items():
                    if name == "own_only" and row["calls"]:
                        continue  # it received blocks: a mask or a merge dropped them, as a later mistake says
                    if got is not None and float((got - out.detach().double()).abs().max()) <= max(tol, 1e-6):
                        row["mistake"] = name
                        break
        rows.append(row)
    return rows


# -- judging ----------------------------------------------------------------------------------------------


def _where(p: int, row: dict) -> str:
    return f"on {plural(p, 'rank')}, {'causal' if row['causal'] else 'not causal'}, {row['dtype']}"


#: What feedback adds to wrong values on several ranks that match no usual mistake.
ARRIVALS = ("If the same function is right on 1 rank, the merge is right and the blocks in hand are not: the K and V you "
            "compute with at each step must come from the same rank, sent in the same step; a buffer filled by "
            "dist.irecv holds its data only once wait() on its request has returned, so wait before you read it; and "
            "do not receive into a tensor you are still sending.")


def judge_correct(attempt: Attempt, p: int, replies: list) -> None:
    """Every rank's output block equals one process's full attention on its positions."""
    for rank, rows in enumerate(replies):
        for row in rows:
            if row["ok"]:
                continue
            msg = f"{_where(p, row)}, rank {rank}: {row['why']}."
            if row.get("mistake"):
                msg += "\n  " + MISTAKES[row["mistake"].removesuffix("_unskipped")]
            if not row.get("mistake") and p > 1 and "error" in row:
                msg += "\n  " + ARRIVALS
            attempt.fail(msg)


def _sizes(calls: list, which: Callable) -> list:
    return [(peer, n or 0) for op, peer, n in calls if which(op)]


def judge_ring(attempt: Attempt, p: int, replies: list, causal: bool = False) -> None:
    """Each rank sends (p - 1) x (K block + V block) bytes to its right neighbour only, receives as much from its left.

    In one, two or 2(p - 1) messages' worth per step: stacked K and V, or K and V as two messages of a step.
    Every call must be a point-to-point one (collectives are switched off anyway). Exercise 11.1's causal runs
    pass the same blocks, so only its non-causal ones are counted; ``causal`` counts them too (Exercise 11.2's
    runs are all causal).
    """
    for rank, rows in enumerate(replies):
        right, left = (rank + 1) % p, (rank - 1) % p
        for row in rows:
            if row["causal"] and not causal:
                continue
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


def judge_memory(attempt: Attempt, p: int, replies: list) -> None:
    """No tensor created while the answer ran holds more numbers than one block of scores per head (or one stacked
    K/V pair), whatever its precision (:func:`autograder.lessons.cpdata.memory_limit`)."""
    sizes = SHAPES["ring"]
    h, b, d = sizes["heads"], sizes["block"], sizes["d"]
    for rank, rows in enumerate(replies):
        for row in rows:
            needed = h * b * p * b  # every query against every key, once
            if not row["causal"] and row["scores"] < needed:
                attempt.fail(f"{_where(p, row)}, rank {rank}: the recorder saw {row['scores']} scores computed, fewer "
                             f"than the {needed} that {b} queries x {p * b} keys x {h} heads take. Compute the scores "
                             "with torch operations (q @ k.transpose(-1, -2), matmul, einsum) inside your function, "
                             "while it runs, so that what they create can be measured.")
            if row["over"] is None:
                continue
            n, shape, op = row["over"]  # in numbers: a float64 copy of float32 scores counts as many
            what = ""
            if shape and shape[-1] == d and n >= h * p * b * d:
                what = (f" That is every rank's {'keys or values' if n < 2 * h * p * b * d else 'keys and values'} "
                        f"at once ({p * b} tokens): a ring attention never holds more than the block in hand and the "
                        "one arriving. Compute with each block as it comes and let it go.")
            elif shape and shape[-1] == p * b:
                what = (f" That is a whole row of scores, {b} queries x all {p * b} keys: compute one {b} x {b} block "
                        "of scores per step and merge it with the online softmax.")
            attempt.fail(f"{_where(p, row)}, rank {rank} created a tensor of shape {shape} ({n:,} numbers, by {op}); "
                         f"the most a step needs is {memory_limit():,}: one {b} x {b} block of scores for each of the "
                         f"{h} heads ({h * b * b} numbers), or a key block and a value block stacked "
                         f"({2 * h * b * d} numbers)." + what)


def balanced_limit(p: int) -> int:
    """Exercise 11.2's most score elements a rank may compute: its own two chunks causally (a (2c) x (2c) block)
    plus half of each of the other p - 1 blocks, per head."""
    sizes = SHAPES["zigzag"]
    h, c = sizes["heads"], sizes["block"]
    return h * (4 * c * c + (p - 1) * 2 * c * c)


def visible_scores(p: int) -> int:
    """The scores the causal mask leaves a zig-zag rank, per head times heads: chunk r's queries see r chunks and
    their own lower triangle, chunk 2p - 1 - r's see 2p - 1 - r chunks and theirs; the same on every rank.

    >>> visible_scores(2), balanced_limit(2)
    (78, 108)
    """
    sizes = SHAPES["zigzag"]
    h, c = sizes["heads"], sizes["block"]
    return h * ((2 * p - 1) * c * c + c * (c + 1))


def judge_balanced(attempt: Attempt, p: int, replies: list) -> None:
    """The ring's work, done evenly: the ring's traffic (:func:`judge_ring`), and every rank computed the same
    number of scores, at least :func:`visible_scores` (every visible one) and at most :func:`balanced_limit`
    (fully masked blocks skipped)."""
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
    if counts[0] < visible_scores(p):
        attempt.fail(f"on {plural(p, 'rank')}, each rank computed {counts[0]} scores, fewer than the "
                     f"{visible_scores(p)} its queries see through the causal mask (every key at a query's position "
                     "or before, on every rank): blocks that the ring brings were never computed. Balanced means the "
                     "ring's whole work, shared evenly.")
    judge_ring(attempt, p, replies, causal=True)
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
                blocks = moved / row["block_bytes"]
                whole = "keys and values" if blocks == 2 * p else "queries, keys and values"
                gathered = (f" {blocks:g} blocks are your {whole} sent whole to each of the {p} ranks: an all-gather "
                            "made of all_to_all, which gives every rank every token, not the heads split. Send rank j "
                            "only heads j h/p to (j + 1) h/p - 1 of your tokens." if blocks in (2 * p, 3 * p) else "")
                attempt.fail(f"{where} passed {moved} bytes through all_to_all; Ulysses exchanges q, k and v (sequence "
                             f"split -> heads split) and the output back (heads -> sequence): 4 x {row['block_bytes']} "
                             f"= {want} bytes per rank." + gathered)
