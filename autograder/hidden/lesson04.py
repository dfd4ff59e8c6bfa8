"""Lesson 04's hidden tests: the check of every graded part of Exercises 4.1, 4.2, 4.3, 4.4.

The declarations, the self-checks and what they share are in :mod:`autograder.lessons.lesson04`, which learners get;
this module stays with the instructor. :func:`autograder.hidden.grade` runs one part.

Example (the instructor's ring passes; a schedule that always sends chunk 0 fails)::

    >>> from autograder.hidden import grade
    >>> from autograder.kit.exercise import GradingFailure
    >>> from autograder.answers.lesson04 import ring_allreduce
    >>> grade("4.4", ring_allreduce, "no_hang")
    >>> try:
    ...     grade("4.1", lambda phase, step, rank, world_size: (0, 0), "reduce_scatter")
    ... except GradingFailure as err:
    ...     print(str(err).splitlines()[0])
    reduce_scatter: after the reduce-scatter on 2 ranks, rank 1's chunk 1 holds the sum of ranks [1] only; it should hold the sum over all 2 ranks. Its chunk 0 is complete instead: ...
"""

from __future__ import annotations

from autograder.kit.exercise import Attempt, fresh_seed
from autograder.kit.pieces import silent_ranks
from autograder.lessons.ringcheck import all_gather_worker, all_reduce_worker, reduce_scatter_worker, ring_traffic, traced
from autograder.lessons.lesson04 import _bandwidth, _correct, _schedule

__all__ = ["CHECKS"]


TIMEOUT_NO_HANG = 6.0


# The stepping stones (4.2, 4.3) try fewer world sizes: one launch each.
STEP_CASES = [
    (1, (5,), "float32"),
    (2, (1,), "float32"),
    (2, (6,), "int64"),
    (3, (10,), "float64"),
    (3, (2,), "float32"),
    (4, (17,), "float32"),
    (4, (3, 5), "int64"),
    (5, (2, 3, 4), "float32"),
    (8, (9,), "float32"),
    (8, (1000,), "float64"),
]


def _reduce_scatter_schedule(attempt: Attempt) -> None:
    _schedule(attempt, "reduce-scatter")


def _all_gather_schedule(attempt: Attempt) -> None:
    _schedule(attempt, "all-gather")


def _reduce_scatter_correct(attempt: Attempt) -> None:
    _correct(attempt, reduce_scatter_worker, STEP_CASES)


def _reduce_scatter_ring(attempt: Attempt) -> None:
    ring_traffic(attempt, reduce_scatter_worker, "reduce-scatter")


def _all_gather_correct(attempt: Attempt) -> None:
    _correct(attempt, all_gather_worker, STEP_CASES)


def _all_gather_ring(attempt: Attempt) -> None:
    ring_traffic(attempt, all_gather_worker, "all-gather")


def _point_to_point(attempt: Attempt) -> None:
    for world, n in ((3, 10), (4, 16)):
        result = traced(attempt, all_reduce_worker, world, n)
        idle = silent_ranks(result, ("sent",))
        if idle:
            attempt.fail(f"on {world} ranks, rank {idle[0][0]} sent no message with send/isend, yet the sum "
                         "came out right: the data must travel by point-to-point calls.")


def _no_hang(attempt: Attempt) -> None:
    """Finishes in time on odd and even world sizes, every rank having sent and received: a ring that exchanges
    nothing cannot deadlock, so finishing would prove nothing. (Whether the sums are right is "correct"'s question.)"""
    seed = fresh_seed()
    for world in (2, 3, 4, 5):
        result = attempt.run(all_reduce_worker, world, (attempt.fn, [((7,), "float32")], seed),
                             timeout=TIMEOUT_NO_HANG, trace=True, context="7 float32 elements")
        for rank, word in silent_ranks(result)[:1]:
            attempt.fail(f"on {world} ranks with 7 elements, rank {rank} finished, but it {word} no point-to-point "
                         "message. This part pays for a ring that finishes on odd and even world sizes; one that "
                         "exchanges nothing cannot deadlock, so it proves nothing. Move the chunks between neighbours "
                         "with send/recv (or isend/irecv).")


# Each graded part's check, by exercise and part: what the hidden test cell of that part runs.
CHECKS = {
    "4.1": {"reduce_scatter": _reduce_scatter_schedule, "all_gather": _all_gather_schedule},
    "4.2": {"correct": _reduce_scatter_correct, "ring": _reduce_scatter_ring},
    "4.3": {"correct": _all_gather_correct, "ring": _all_gather_ring},
    "4.4": {"correct": _correct, "point_to_point": _point_to_point, "bandwidth": _bandwidth, "no_hang": _no_hang},
}
