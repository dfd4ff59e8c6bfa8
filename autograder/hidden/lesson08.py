"""Lesson 08's hidden tests: the check of every graded part of Exercise 8.1.

The declarations, the self-checks and what they share are in :mod:`autograder.lessons.lesson08`, which learners get;
this module stays with the instructor. :func:`autograder.hidden.grade` runs one part.
"""

from __future__ import annotations

from autograder.kit.exercise import Attempt
from autograder.lessons.lesson08 import PROGRAMS, _run_program

__all__ = ["CHECKS"]


def _hang(attempt: Attempt) -> None:
    _run_program(attempt, PROGRAMS["hang"])


def _wrong_result(attempt: Attempt) -> None:
    _run_program(attempt, PROGRAMS["wrong_result"])


def _crash(attempt: Attempt) -> None:
    _run_program(attempt, PROGRAMS["crash"])


# Each graded part's check, by exercise and part: what the hidden test cell of that part runs.
CHECKS = {
    "8.1": {"hang": _hang, "wrong_result": _wrong_result, "crash": _crash},
}
