"""Lesson 06's hidden tests: the check of every graded part of Exercises 6.1, 6.2.

The declarations, the self-checks and what they share are in :mod:`autograder.lessons.lesson06`, which learners get;
this module stays with the instructor. :func:`autograder.hidden.grade` runs one part.

Example (the instructor's answer passes)::

    >>> from autograder.hidden import grade
    >>> from autograder.answers.lesson06 import MiniDDP
    >>> grade("6.2", MiniDDP, "buckets")
"""

from __future__ import annotations

from autograder.lessons.lesson06 import (_broadcast, _buckets, _gradients, _gradients_6_1, _overlap,
                                           _per_parameter, _unused, _waits)

__all__ = ["CHECKS"]


# Each graded part's check, by exercise and part: what the hidden test cell of that part runs.
CHECKS = {
    "6.1": {"broadcast": _broadcast, "gradients": _gradients_6_1, "per_parameter": _per_parameter, "unused": _unused},
    "6.2": {"broadcast": _broadcast, "gradients": _gradients, "waits": _waits, "buckets": _buckets, "overlap": _overlap, "unused": _unused},
}
