"""Instructor-side tools: the graded exercises, nbgrader preprocessors and the grading workflow.

- :mod:`autograder.lessons.kit` declares every graded exercise as one object (number, function,
  parts with their points, switched-off calls, self-check); notebook cells reach one with
  ``from autograder import exercise`` and ``exercise("4.4").grade(ring_allreduce, "correct")``.
- ``autograder.lessons.lessonNN`` holds each lesson's exercises (a tuple ``EXERCISES``).
- :mod:`autograder.lessons.harness` runs a learner's function on fresh ranks and tells a wrong
  answer (:class:`~autograder.lessons.harness.GradingFailure`) from a broken check
  (:class:`~autograder.lessons.harness.CheckError`).
- :mod:`autograder.course.preprocessors` adds what nbgrader lacks (stubs that name their exercise,
  deleted cells put back).
- ``python -m autograder`` (see :mod:`autograder.__main__`) runs the instructor workflow:
  :mod:`autograder.grading.grade` grades a class, each submission in the bubblewrap sandbox of
  :mod:`autograder.grading.sandbox` and re-graded from its definitions alone by
  :mod:`autograder.grading.clean`, then :mod:`autograder.grading.summary` sums the class up;
  :mod:`autograder.release` builds the learner distribution.

Importing this package is cheap: ``exercise`` and ``exercises`` load the kit (and torch)
on first use, so nbgrader's preprocessors can import it without starting ranks.

Example::

    >>> from autograder import exercise
    >>> [part.name for part in exercise("4.4").parts]
    ['correct', 'point_to_point', 'bandwidth', 'no_hang']
"""

from __future__ import annotations

from typing import Any

__all__ = ["exercise", "exercises"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from .lessons import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'autograder' has no attribute {name!r}")
