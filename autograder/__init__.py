"""The course's graded exercises, and the tools to check and hand them in.

Notebook cells reach an exercise by its number and run its visible self-check on fresh ranks,
with the rules the grading uses::

    from autograder import exercise
    exercise("4.4").self_check(ring_allreduce)

The package is arranged by who gets it. Learners get (``make release`` copies them whole):

- :mod:`autograder.kit`: the exercise kit (:class:`~autograder.kit.exercise.Exercise`, the harness
  that runs a learner's function on fresh ranks, the registry that finds ``"4.4"``);
- :mod:`autograder.lessons`: every lesson's declarations (``lessonNN.py``), self-checks and checkers;
- :mod:`autograder.learner`: ``make check`` and ``make handin``;
- ``paths.py``: where the course is.

Only the instructor has :mod:`autograder.hidden` (the check of every graded part, which the
notebooks' hidden test cells run), :mod:`autograder.answers` (the instructor's answers),
:mod:`autograder.grading` (``make grade``), :mod:`autograder.notebooks` (``make course``),
:mod:`autograder.release` and :mod:`autograder.site`, with ``python -m autograder`` as their
command line. Nothing learners get imports any of them.

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
        from .kit import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'autograder' has no attribute {name!r}")
