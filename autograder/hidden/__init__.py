"""The hidden tests: the check of every graded part, by lesson. The instructor's alone: it never ships.

``autograder/hidden/lessonNN.py`` holds lesson NN's checks in a table ``CHECKS`` (exercise number ->
part name -> check), built on what :mod:`autograder.lessons` declares and shares with the
visible self-checks. A notebook's hidden test cell runs one part::

    from autograder.hidden import grade
    grade("4.4", ring_allreduce, "correct")

Example::

    >>> from autograder.answers.lesson04 import ring_allreduce
    >>> grade("4.4", ring_allreduce, "no_hang")     # passes silently
    >>> sorted(checks("4.4"))
    ['bandwidth', 'correct', 'no_hang', 'point_to_point']
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from autograder.kit.exercise import NUMBER
from autograder.kit.registry import exercise

__all__ = ["grade", "checks"]


def checks(number: str) -> dict[str, Callable[..., None]]:
    """Every graded part's check of exercise ``number``, from ``autograder/hidden/lessonNN.py``."""
    match = NUMBER.match(str(number))
    if not match:
        raise ValueError(f"exercise numbers look like '4.1' (lesson.exercise); got {number!r}")
    module = importlib.import_module(f"{__name__}.lesson{int(match[1]):02d}")
    try:
        return dict(module.CHECKS[number])
    except KeyError:
        raise LookupError(f"{module.__name__} holds no checks of exercise {number} (it has "
                          f"{', '.join(module.CHECKS)})") from None


def grade(number: str, fn: Any, part: str) -> None:
    """The hidden test of one part: returns when ``fn`` passes, raises GradingFailure when not."""
    ex = exercise(number)
    found = checks(number)
    if part not in found:
        ex.part(part)  # names the declared parts when ``part`` is not one of them
        raise LookupError(f"{ex.label} declares part {part!r} but autograder/hidden holds no check for it")
    ex.grade(fn, part, found[part])
