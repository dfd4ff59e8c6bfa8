"""Finding an exercise by its number: ``exercise("4.4")`` in ``autograder/lessons/lesson04.py``.

Every ``lessonNN.py`` of :mod:`autograder.lessons` declares its exercises in a tuple ``EXERCISES``;
nothing else registers them, so a new lesson adds its module there (its hidden checks in
``autograder/hidden/lessonNN.py``, its notebook in ``solutions/``) and nothing else.
Notebook cells reach an exercise through ``from autograder import exercise``.

>>> [e.number for e in exercises(3)]
['3.1', '3.2', '3.3']
"""

from __future__ import annotations

import importlib
import pkgutil
import re

from .exercise import NUMBER, Exercise

__all__ = ["exercise", "exercises", "warm_ranks"]

_LESSON_MODULE = re.compile(r"lesson(\d{2})$")
EXERCISES_PACKAGE = "autograder.lessons"  # where every lesson's declarations live


def _lesson_modules() -> dict[int, str]:
    """Lesson number -> module name, for every ``autograder/lessons/lessonNN.py``."""
    # The package's search path as Python keeps it: a folder added to its __path__ is searched too.
    package = importlib.import_module(EXERCISES_PACKAGE)
    found = {}
    for info in pkgutil.iter_modules(package.__path__):
        match = _LESSON_MODULE.match(info.name)
        if match:
            found[int(match[1])] = f"{EXERCISES_PACKAGE}.{info.name}"
    return found


def _declared(module_name: str, lesson: int) -> tuple[Exercise, ...]:
    module = importlib.import_module(module_name)
    declared = getattr(module, "EXERCISES", None)
    if not isinstance(declared, tuple) or not all(isinstance(e, Exercise) for e in declared):
        raise TypeError(f"{module_name} must declare EXERCISES, a tuple of autograder.kit.exercise.Exercise")
    for ex in declared:
        if ex.lesson != lesson:
            raise ValueError(f"{module_name} declares {ex.label}, which belongs in lesson {ex.lesson:02d}")
    return declared


def exercises(lesson: int | None = None) -> list[Exercise]:
    """Every declared exercise (of one lesson when ``lesson`` is given), in number order.

    >>> [e.number for e in exercises(3)]
    ['3.1', '3.2', '3.3']
    """
    modules = _lesson_modules()
    chosen = sorted(modules) if lesson is None else [lesson] if lesson in modules else []
    found = [ex for n in chosen for ex in _declared(modules[n], n)]
    numbers = [ex.number for ex in found]
    if len(set(numbers)) != len(numbers):
        raise ValueError(f"an exercise number is declared twice: {numbers}")
    return sorted(found, key=lambda ex: tuple(int(x) for x in ex.number.split(".")))


def exercise(number: str) -> Exercise:
    """The exercise numbered ``number`` ("4.4"), from ``autograder/lessons/lessonNN.py``.

    >>> exercise("4.4").function
    'ring_allreduce'
    """
    match = NUMBER.match(str(number))
    if not match:
        raise ValueError(f"exercise numbers look like '4.1' (lesson.exercise); got {number!r}")
    lesson = int(match[1])
    modules = _lesson_modules()
    if lesson not in modules:
        raise LookupError(f"no module autograder/lessons/lesson{lesson:02d}.py declares exercise {number}")
    for ex in _declared(modules[lesson], lesson):
        if ex.number == number:
            return ex
    known = ", ".join(e.number for e in _declared(modules[lesson], lesson))
    raise LookupError(f"autograder/lessons/lesson{lesson:02d}.py declares no exercise {number} (it has {known})")


def warm_ranks(lesson: int, where: str) -> bool:
    """Whether the ranks that ``where`` starts for this lesson import ``torch._dynamo``: "kernel"
    (the notebook's own cells, as the grader runs them) or "checks" (the clean re-grade). A lesson
    module says so with ``WARM_RANKS = ("kernel", "checks")`` or a part of it; the default is neither.

    Building an optimizer imports it, about a second of CPU per rank. Where ranks do, their
    factory imports it once ahead and every rank inherits it; where none does, that second
    would be spent for nothing in every kernel and clean re-grade the grader starts
    (``HELPERS_WARM_UP``, :mod:`autograder.grading.workfolder`). A wrong answer here costs
    time, never a score.

    >>> warm_ranks(5, "checks"), warm_ranks(9, "kernel"), warm_ranks(4, "checks")
    (True, False, False)
    """
    if where not in ("kernel", "checks"):
        raise ValueError(f"where is 'kernel' or 'checks', not {where!r}")
    modules = _lesson_modules()
    return lesson in modules and where in getattr(importlib.import_module(modules[lesson]), "WARM_RANKS", ())
