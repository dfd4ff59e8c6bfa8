"""Lesson 12's hidden tests: the check of every graded part of Exercises 12.1, 12.2, 12.3.

The declarations, the self-checks and what they share are in :mod:`autograder.lessons.lesson12` and
:mod:`autograder.lessons.plancheck`, which learners get; the checks themselves are in
:mod:`autograder.hidden.planparts`, which compares with the course's planner (the instructor's answers,
handed to the sandboxed clean re-grade sealed: :mod:`autograder.hidden.sealed`). :func:`autograder.hidden.grade`
runs one part.

Example (the instructor's answers pass)::

    >>> from autograder.hidden import grade
    >>> from autograder.answers.lesson12 import plan_memory
    >>> grade("12.1", plan_memory, "large")
"""

from __future__ import annotations

from autograder.hidden import planparts

__all__ = ["CHECKS", "SEALED"]

# Each graded part's check, by exercise and part: what the hidden test cell of that part runs.
CHECKS = {
    "12.1": {"small": planparts.memory_small, "large": planparts.memory_large,
             "recompute": planparts.memory_recompute},
    "12.2": {"small": planparts.traffic_small, "large": planparts.traffic_large},
    "12.3": {"fits": planparts.layout_fits, "fast": planparts.layout_fast},
}
#: The answers modules these checks compare with, handed to the sandboxed clean re-grade sealed.
SEALED = ("lesson12",)
