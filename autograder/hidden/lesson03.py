"""Lesson 03's hidden tests: the check of every graded part of Exercises 3.1, 3.2, 3.3.

The declarations, the self-checks and what they share are in :mod:`autograder.lessons.lesson03`, which learners get;
this module stays with the instructor. :func:`autograder.hidden.grade` runs one part.
"""

from __future__ import annotations

from autograder.kit.exercise import Attempt, fresh_seed
from autograder.kit.pieces import silent_ranks
from autograder.lessons.lesson03 import (_all_gather_case, _all_gather_correct, _all_gather_worker,
                                           _broadcast_case, _broadcast_correct, _broadcast_worker,
                                           _first_failure, _hierarchy_calls, _hierarchy_correct)

__all__ = ["CHECKS"]


def _broadcast_point_to_point(attempt: Attempt) -> None:
    for world, src in ((3, 1), (4, 2), (5, 0)):
        result = attempt.run(_broadcast_worker, world, (attempt.fn, [(src, (8,), "float32")], fresh_seed()),
                             trace=True, timeout=8.0, context=f"src={src}")
        _first_failure(attempt, world, list(result), _broadcast_case)
        if silent_ranks(result, ("sent",), [src]):
            attempt.fail(f"on {world} ranks with src={src}, the source rank sent no point-to-point "
                         "message: its values must leave it by send/isend.")
        deaf = silent_ranks(result, ("received",), [r for r in range(world) if r != src])
        if deaf:
            attempt.fail(f"on {world} ranks with src={src}, rank {deaf[0][0]} received no point-to-point "
                         "message, yet its tensor came out right: every other rank must receive the values.")


def _broadcast_no_hang(attempt: Attempt) -> None:
    seed = fresh_seed()
    for world in (2, 3, 4, 5, 6):
        # Every rank takes its turn as the source, back to back on the same group.
        cases = [(src, (5,), "float32") for src in range(world)]
        result = attempt.run(_broadcast_worker, world, (attempt.fn, cases, seed), timeout=10.0,
                             context=f"{world} broadcasts in a row, src = 0 to {world - 1}")
        _first_failure(attempt, world, list(result), _broadcast_case)


def _all_gather_point_to_point(attempt: Attempt) -> None:
    for world in (2, 3, 4):
        result = attempt.run(_all_gather_worker, world, (attempt.fn, [((6,), "float32")], fresh_seed()),
                             trace=True, timeout=8.0)
        _first_failure(attempt, world, list(result), _all_gather_case)
        quiet = silent_ranks(result)
        if quiet:
            rank, what = quiet[0]
            attempt.fail(f"on {world} ranks, rank {rank} {what} no point-to-point message: every rank's "
                         "tensor must reach every other rank by send/recv (or isend/irecv).")


def _all_gather_no_hang(attempt: Attempt) -> None:
    seed = fresh_seed()
    for world in (2, 3, 4, 5, 6):
        cases = [((3,), "float32"), ((2,), "int64"), ((4,), "float64")]
        result = attempt.run(_all_gather_worker, world, (attempt.fn, cases, seed), timeout=10.0,
                             context="three calls in a row")
        _first_failure(attempt, world, list(result), _all_gather_case)


# Each graded part's check, by exercise and part: what the hidden test cell of that part runs.
CHECKS = {
    "3.1": {"correct": _broadcast_correct, "point_to_point": _broadcast_point_to_point, "no_hang": _broadcast_no_hang},
    "3.2": {"correct": _all_gather_correct, "point_to_point": _all_gather_point_to_point, "no_hang": _all_gather_no_hang},
    "3.3": {"correct": _hierarchy_correct, "hierarchy": _hierarchy_calls},
}
