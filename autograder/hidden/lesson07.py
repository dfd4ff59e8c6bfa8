"""Lesson 07's hidden tests: the check of every graded part of Exercises 7.1, 7.2.

The declarations, the self-checks and what they share are in :mod:`autograder.lessons.lesson07`, which learners get;
this module stays with the instructor. :func:`autograder.hidden.grade` runs one part.
"""

from __future__ import annotations

from autograder.hidden import faultparts
from autograder.kit.exercise import Attempt
from autograder.lessons.lesson07 import _clean_exit, _job, _judge_result, _rank_zero_only, _runs

__all__ = ["CHECKS"]


def _runs_part(attempt: Attempt) -> None:
    _runs(attempt)


def _same_result(attempt: Attempt) -> None:
    _judge_result(attempt, _job(attempt, 2, 2))


def _any_topology(attempt: Attempt) -> None:
    run = _job(attempt, 1, 3)
    _judge_result(attempt, run)
    _rank_zero_only(attempt, run)


# Each graded part's check, by exercise and part: what the hidden test cell of that part runs.
CHECKS = {
    "7.1": {"runs": _runs_part, "same_result": _same_result, "rank_zero_only": _rank_zero_only,
            "clean_exit": _clean_exit, "any_topology": _any_topology},
    # Exercise 7.2's checks, with the faults they plant, are in autograder.hidden.faultparts.
    "7.2": {"resumes": faultparts.resumes, "no_repeat": faultparts.no_repeat, "atomic": faultparts.atomic,
            "reshard": faultparts.reshard, "clean_exit": faultparts.clean_exit},
}
