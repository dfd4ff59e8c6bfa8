"""Lesson 02's hidden tests: the check of every graded part of Exercise 2.1.

The declarations, the self-checks and what they share are in :mod:`autograder.lessons.lesson02`, which learners get;
this module stays with the instructor. :func:`autograder.hidden.grade` runs one part.

Example (an answer that returns its own value is right on one rank only)::

    >>> from autograder.hidden import grade
    >>> from autograder.kit.exercise import GradingFailure
    >>> try:
    ...     grade("2.1", lambda rank, world_size, value: value, "correct")
    ... except GradingFailure as err:
    ...     print(err)
    correct: on 2 ranks the values were ...; rank 0 returned ..., but every rank should return their sum, ...
    Each rank knows only its own value: the others' values must reach it by messages round the ring.
"""

from __future__ import annotations

from autograder.kit.exercise import Attempt, fresh_seed
from autograder.lessons.lesson02 import _judge, _point_to_point, _worker, draw_values

__all__ = ["CHECKS"]


def _correct(attempt: Attempt, worlds: tuple[int, ...] = (1, 2, 3, 4, 5, 6)) -> None:
    seed = fresh_seed()
    for world in worlds:
        values = [draw_values(seed, world)]
        result = attempt.run(_worker, world, (attempt.fn, values), timeout=10.0)
        _judge(attempt, world, values, list(result))


def _no_hang(attempt: Attempt) -> None:
    seed = fresh_seed()
    for world in (2, 3, 4, 5, 6):
        # Three calls in a row, each with new values: a message left unreceived by one call
        # would be picked up by the next one (or block it), and an isend that is never
        # waited on may be lost.
        values = [draw_values(seed, world, call) for call in range(3)]
        result = attempt.run(_worker, world, (attempt.fn, values), timeout=6.0, context="three calls in a row")
        _judge(attempt, world, values, list(result))


# Each graded part's check, by exercise and part: what the hidden test cell of that part runs.
CHECKS = {
    "2.1": {"correct": _correct, "point_to_point": _point_to_point, "no_hang": _no_hang},
}
