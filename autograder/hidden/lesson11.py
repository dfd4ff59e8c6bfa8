"""Lesson 11's hidden tests: the check of every graded part of Exercises 11.1, 11.2, 11.3.

The declarations, the self-checks and what they share are in :mod:`autograder.lessons.lesson11`, which learners get;
this module stays with the instructor. :func:`autograder.hidden.grade` runs one part.

Example (the instructor's answers pass)::

    >>> from autograder.hidden import grade
    >>> from autograder.answers.lesson11 import ring_attention
    >>> grade("11.1", ring_attention, "memory")
"""

from __future__ import annotations

from autograder.lessons.cpcheck import judge_balanced, judge_correct, judge_exchange, judge_memory, judge_ring
from autograder.kit.exercise import Attempt
from autograder.kit.pieces import plural
from autograder.lessons.lesson11 import MEMORY_WORLDS, RING_CASES, ULYSSES_CASES, ZIGZAG_CASES, _runs

__all__ = ["CHECKS"]


NO_HANG_TIMEOUT = 6.0


def _part(kind: str, cases: dict, judge, worlds=None):
    def check(attempt: Attempt) -> None:
        for world, replies in _runs(attempt, kind, cases, worlds):
            judge(attempt, world, replies)

    check.__name__ = f"_{kind}_{judge.__name__.removeprefix('judge_')}"
    return check


def _ring_correct(attempt: Attempt) -> None:
    for world, replies in _runs(attempt, "ring", RING_CASES):
        judge_correct(attempt, world, replies)


def _ring_no_hang(attempt: Attempt) -> None:
    for world in (2, 3, 4):  # runs of their own, each with its own short time limit
        for _, replies in _runs(attempt, "ring", {world: ((True, "float64"),)}, timeout=NO_HANG_TIMEOUT, shared=False):
            _passed_round(attempt, world, replies)


def _passed_round(attempt: Attempt, p: int, replies: list) -> None:
    """The run that ended did the ring's communication: every rank sent its right neighbour, and received from its
    left, at least p - 1 blocks of keys and values (exactly how many is the ring part's to judge)."""
    for rank, rows in enumerate(replies):
        right, left = (rank + 1) % p, (rank - 1) % p
        for row in rows:
            sent = sum(n or 0 for op, peer, n in row["calls"] if op in ("send", "isend") and peer == right)
            got = sum(n or 0 for op, peer, n in row["calls"] if op in ("recv", "irecv") and peer == left)
            want = (p - 1) * row["kv_bytes"]
            if sent < want or got < want:
                attempt.fail(f"on {plural(p, 'rank')}, rank {rank} finished, but sent {sent} bytes to rank {right} and "
                             f"received {got} from rank {left}; a ring attention passes p - 1 = "
                             f"{plural(p - 1, 'block')} of keys and values each way ({want} bytes). This part pays for "
                             "that exchange ending promptly: an answer that exchanges nothing cannot hang, and earns "
                             "nothing here.")


def _ring_memory(attempt: Attempt) -> None:
    runs = _runs(attempt, "ring", RING_CASES, MEMORY_WORLDS)
    for world, replies in runs:
        judge_memory(attempt, world, replies)
    _memory_does_not_grow(attempt, runs)


def _memory_does_not_grow(attempt: Attempt, runs: list) -> None:
    """The most bytes the answer's tensors held at once (non-causal, float64) is the same on 4 ranks as on 3.

    A ring's step holds the block in hand, the one arriving and the running o, m and l, whatever p; an answer that
    keeps each received block, or each step's partial result, holds one more of them for every rank added.
    """
    (small, few), (large, many) = runs[0], runs[-1]

    def peak(replies: list) -> int:
        return max(row["peak_live"] for rows in replies for row in rows
                   if not row["causal"] and row["dtype"] == "float64")

    grew = peak(many) - peak(few)
    kv = next(row["kv_bytes"] for row in few[0] if row["dtype"] == "float64")
    if grew >= kv // 2:
        attempt.fail(f"not causal, float64: the tensors your function created and still held at one moment took up to "
                     f"{peak(many):,} bytes on {large} ranks and {peak(few):,} on {small}: {grew:,} bytes more for "
                     f"{plural(large - small, 'rank')} more, {grew / (kv // 2):.3g} times a key block's {kv // 2}. "
                     "A ring attention holds the same whatever p: the block in hand, the one arriving and the running "
                     "o, m and l. Merge each block as it arrives and let it go; a list of the received blocks, or of "
                     "each step's partial result, grows with every rank.")


# Each graded part's check, by exercise and part: what the hidden test cell of that part runs.
CHECKS = {
    "11.1": {"correct": _ring_correct, "ring": _part("ring", RING_CASES, judge_ring), "memory": _ring_memory, "no_hang": _ring_no_hang},
    "11.2": {"correct": _part("zigzag", ZIGZAG_CASES, judge_correct), "balanced": _part("zigzag", ZIGZAG_CASES, judge_balanced, (2, 3, 4))},
    "11.3": {"correct": _part("ulysses", ULYSSES_CASES, judge_correct), "exchange": _part("ulysses", ULYSSES_CASES, judge_exchange)},
}
