"""Lesson 00's hidden tests: the check of every graded part of Exercise 0.1.

The declarations, the self-checks and what they share are in :mod:`autograder.lessons.lesson00`, which learners get;
this module stays with the instructor. :func:`autograder.hidden.grade` runs one part.

Example::

    >>> from autograder.hidden import grade
    >>> grade("0.1", lambda rank, world_size: f"rank {rank} of {world_size}", "hello")
"""

from __future__ import annotations

from autograder.lessons.lesson00 import _hello

__all__ = ["CHECKS"]


# Each graded part's check, by exercise and part: what the hidden test cell of that part runs.
CHECKS = {
    "0.1": {"hello": _hello},
}
