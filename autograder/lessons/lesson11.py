"""Lesson 11's graded exercises: attention over a sequence split across ranks.

- 11.1 ``ring_attention(q, k, v, causal=False)``: this rank's query, key and value blocks
  (heads x s/p x d, rank r holding positions r*s/p onwards) in, this rank's output block out;
  keys and values travel round the ring from point-to-point calls, each block merged as it
  arrives with the online softmax. Parts: *correct* (float64 within 1e-10, float32 within what
  its rounding allows, :func:`autograder.lessons.cpdata.tolerance`; causal and not, 1 to 4
  ranks), *ring* (each rank sends its right neighbour exactly p - 1 blocks' worth of keys and
  values and nothing else; stacked or as two messages of a step), *memory* (no tensor of more
  numbers than one s/p x s/p block of scores per head, or one stacked K/V pair, on 3 and 4
  ranks, where holding every key is larger than both; and the bytes held at once the same on 4
  ranks as on 3, so a list of the received blocks loses it), *no_hang* (the blocks passed round
  and the run ended promptly: an answer that sends nothing earns nothing).
- 11.2 ``zigzag_attention(q, k, v)``: the causal one on the zig-zag layout (rank r holds chunks
  r and 2p - 1 - r of 2p). Parts: *correct*, and *balanced* (the ring's traffic, and every rank
  computes the same number of scores, at least every visible one and at most its own chunks
  causally plus half of every other block: the fully masked products skipped, counted by
  :class:`helpers.attention.TensorRecorder`).
- 11.3 (optional) ``ulysses_attention(q, k, v, causal=False)``: all_to_all from the sequence
  split to the heads split and back. Parts: *correct*, and *exchange* (all_to_all only, q, k
  and v in and the output back: 4 blocks' bytes per rank; the self-check runs on 4 ranks, where
  an all-gather made of all_to_all moves 8).

Every run is on fresh gloo ranks with q, k and v drawn at grading time. 11.1 and 11.2 run with
every collective switched off (``forbid=COLLECTIVES``, as Exercise 4.4), so keys can only travel
by point-to-point messages; 11.3 with every collective but all_to_all and every point-to-point
call switched off. The checks are in :mod:`autograder.lessons.cpcheck`.

Hidden test cells and the visible self-checks::

    from autograder import exercise
    from autograder.hidden import grade           # the hidden tests: the instructor's copy only
    grade("11.1", ring_attention, "correct")      # "ring", "memory", "no_hang"
    exercise("11.1").self_check(ring_attention)

"""

from __future__ import annotations

from helpers import COLLECTIVES, POINT_TO_POINT

from .cpcheck import attention_worker, judge_balanced, judge_correct, judge_exchange, judge_memory, judge_ring
from ..kit.exercise import Attempt, Exercise, Part, fresh_seed

__all__ = ["EXERCISES", "exercise_11_1", "exercise_11_2", "exercise_11_3"]

TIMEOUT = 10.0  # a correct answer takes well under a second; the rest is room for a loaded machine
# Exercise 11.1: world size -> cases (causal, dtype) run in one launch.
RING_CASES = {1: ((False, "float64"), (True, "float64")),
              2: ((False, "float64"), (True, "float64"), (True, "float32")),
              3: ((False, "float64"), (True, "float64")),
              4: ((False, "float64"), (True, "float64"), (False, "float32"))}
MEMORY_WORLDS = (3, 4)  # from 3 ranks on, all the keys are larger than a block of scores or a K/V pair
# Exercises 11.2 and 11.3 from 2 ranks: alone, a rank's zig-zag ring or all-to-all has nothing to exchange.
ZIGZAG_CASES = {2: ((True, "float64"), (True, "float32")), 3: ((True, "float64"),), 4: ((True, "float64"),)}
ULYSSES_CASES = {2: ((False, "float64"), (True, "float64")), 4: ((False, "float64"), (True, "float64"), (True, "float32"))}

RING_REASON = ("Exercises 11.1 and 11.2 build ring attention yourself: keys and values travel from rank to rank with "
               "send, recv, isend, irecv or batch_isend_irecv, one block per step; a collective would hand every "
               "rank every key at once, which is what the ring avoids")
ULYSSES_REASON = ("Exercise 11.3 moves the sequence with dist.all_to_all (or all_to_all_single) only: the exchange "
                  "from tokens split to heads split is the exercise")
HINTS = {
    "DeadlockError": "Every rank is blocked waiting for another: when every rank calls a blocking dist.send "
                     "(or dist.recv) first, none reaches the matching call. Post the exchange with dist.isend to the "
                     "right and dist.irecv from the left (or dist.batch_isend_irecv), compute on the block in hand, "
                     "then wait() on both requests before using the new block. Send K and V in the same step, in "
                     "the same order on every rank.",
    "RuntimeError": "If it is about sizes that do not match in a send or receive, check that every rank sends "
                    "and receives the same things in the same order at each step (K then V, or both stacked), "
                    "into buffers shaped like what arrives (torch.empty_like of what you send).",
}

_RUNS: dict = {}


def _runs(attempt: Attempt, kind: str, cases: dict, worlds=None, *, timeout: float = TIMEOUT,
          shared: bool = True) -> list[tuple[int, list]]:
    """One launch per world size, all its cases in it; shared by the parts of one answer (fresh seed per launch)."""
    if _RUNS.get("answer") is not attempt.fn:
        _RUNS.clear()
        _RUNS["answer"] = attempt.fn
    out = []
    for world in sorted(worlds or cases):
        key = (kind, world, tuple(sorted(attempt.exercise.forbidden(attempt.rules or attempt.part))))
        if not shared or key not in _RUNS:
            result = list(attempt.run(attention_worker, world, (attempt.fn, fresh_seed(), kind, list(cases[world])),
                                      timeout=timeout, trace=True, context=_context(kind)))
            if not shared:
                out.append((world, result))
                continue
            _RUNS[key] = result
        out.append((world, _RUNS[key]))
    return out


def _context(kind: str) -> str:
    from .cpdata import SHAPES

    sizes = SHAPES[kind]
    tokens = "chunks of" if kind == "zigzag" else "blocks of"
    return f"{sizes['heads']} heads, {tokens} {sizes['block']} tokens, d = {sizes['d']}"


def _ring_self_check(attempt: Attempt) -> str:
    for world, replies in _runs(attempt, "ring", RING_CASES, (1, 3)):
        judge_correct(attempt, world, replies)
        judge_ring(attempt, world, replies)
        if world in MEMORY_WORLDS:
            judge_memory(attempt, world, replies)
    return ("Self-check passed on 1 and 3 ranks, causal and not: every rank's output block equals one process's "
            "full attention, each rank passed its right neighbour p - 1 blocks of keys and values and nothing else, "
            "and no tensor grew past one block of scores per head. The hidden tests also try 2 and 4 ranks, "
            "float32, and fresh data.")


exercise_11_1 = Exercise(
    number="11.1",
    function="ring_attention",
    title="ring attention from point-to-point calls",
    parts=(
        Part("correct", 3, "every rank's output block equals one process's full attention (float64 within 1e-10, "
             "float32 within what its rounding allows, 16 x 2^-24 x (1 + the largest |score|) x the largest |v|), "
             "causal and not, on 1 to 4 ranks."),
        Part("ring", 2, "each rank sends its right neighbour exactly p - 1 blocks of keys and values (K and V "
             "stacked, or two messages a step) and nothing else; collectives switched off."),
        Part("memory", 2, "no tensor of more numbers than one s/p x s/p block of scores per head (or one stacked K/V "
             "pair) is ever created, and what is held at once does not grow from 3 ranks to 4."),
        Part("no_hang", 1, "passes the blocks round the ring and finishes promptly on 2, 3 and 4 ranks."),
    ),
    visible_check=_ring_self_check,
    forbid=COLLECTIVES,
    forbid_reason=RING_REASON,
    hints=HINTS,
)


def _zigzag_self_check(attempt: Attempt) -> str:
    for world, replies in _runs(attempt, "zigzag", ZIGZAG_CASES, (3,)):
        judge_correct(attempt, world, replies)
        judge_balanced(attempt, world, replies)
    return ("Self-check passed on 3 ranks: every rank's output equals one process's causal attention on its two "
            "chunks, each rank passed its right neighbour p - 1 blocks, and every rank computed the same number of "
            "scores, every visible one and none of the fully masked ones. The hidden tests also try 2 and 4 ranks "
            "and float32.")


exercise_11_2 = Exercise(
    number="11.2",
    function="zigzag_attention",
    title="zig-zag causal ring attention",
    parts=(
        Part("correct", 2, "every rank's output equals one process's causal attention on its chunks r and 2p - 1 - r "
             "(2 to 4 ranks)."),
        Part("balanced", 2, "the ring's work, done evenly: p - 1 blocks to the right neighbour, and every rank "
             "computes the same number of scores, every visible one and no fully masked block (counted)."),
    ),
    visible_check=_zigzag_self_check,
    forbid=COLLECTIVES,
    forbid_reason=RING_REASON,
    hints=HINTS,
)


def _ulysses_self_check(attempt: Attempt) -> str:
    for world, replies in _runs(attempt, "ulysses", ULYSSES_CASES, (4,)):  # on 2 ranks an all-gather moves 4 blocks too
        judge_correct(attempt, world, replies)
        judge_exchange(attempt, world, replies)
    return ("Self-check passed on 4 ranks, causal and not: the output equals one process's full attention, and "
            "all_to_all moved 4 blocks' bytes per rank, q, k and v to the heads split and the output back (gathering "
            "every rank's keys and values would move 8). The hidden tests also try 2 ranks.")


exercise_11_3 = Exercise(
    number="11.3",
    function="ulysses_attention",
    title="(optional) Ulysses attention with all_to_all",
    parts=(
        Part("correct", 1, "every rank's output block equals one process's full attention, causal and not, on 2 and "
             "4 ranks."),
        Part("exchange", 1, "all_to_all only: q, k and v to the heads split and the output back, 4 blocks' bytes "
             "per rank."),
    ),
    visible_check=_ulysses_self_check,
    forbid=tuple(c for c in COLLECTIVES if c not in ("all_to_all", "all_to_all_single")) + POINT_TO_POINT,
    forbid_reason=ULYSSES_REASON,
    hints=HINTS,
)

# The checks' ranks import torch._dynamo (the notebook's, as graded, do not): their factory imports it once,
# ahead (autograder.kit.registry.warm_ranks).
WARM_RANKS = ("checks",)

EXERCISES = (exercise_11_1, exercise_11_2, exercise_11_3)
