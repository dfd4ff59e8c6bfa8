"""Lesson 09's hidden tests: the check of every graded part of Exercise 9.1.

The declarations, the self-checks and what they share are in :mod:`autograder.lessons.lesson09`, which learners get;
this module stays with the instructor. :func:`autograder.hidden.grade` runs one part.

Example (the instructor's answer passes)::

    >>> from autograder.hidden import grade
    >>> from autograder.answers.lesson09 import ShardedOptimizer
    >>> grade("9.1", ShardedOptimizer, "traffic")
"""

from __future__ import annotations

from autograder.lessons.lesson09 import _adamw, _sgd, _state, _traffic

__all__ = ["CHECKS"]


# Each graded part's check, by exercise and part: what the hidden test cell of that part runs.
CHECKS = {
    "9.1": {"sgd": _sgd, "adamw": _adamw, "state": _state, "traffic": _traffic},
}
