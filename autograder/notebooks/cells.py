"""The graded cells of a lesson notebook, and whether they match the declared exercises.

Every graded part has exactly one hidden test cell, and every such cell has one shape,
written by :func:`hidden_test_source` from the exercise's declaration::

    # Exercise 4.4, part "correct" (4 points): the right sums on 1-8 ranks, ...
    from autograder import exercise
    exercise("4.4").self_check(ring_allreduce)          <- optional: the visible self-check
    ### BEGIN HIDDEN TESTS
    from autograder.hidden import grade
    grade("4.4", ring_allreduce, "correct")
    ### END HIDDEN TESTS

The hidden region imports :mod:`autograder.hidden`, which holds every part's check: nbgrader
keeps it out of the learners' notebooks, and the package never ships to them.

A visible self-check may also sit in a cell of its own (not graded)::

    from autograder import exercise
    exercise("4.4").self_check(ring_allreduce)

:func:`problems` lists every way a notebook departs from this: a graded cell that names
no declared part or has other points, a declared part without a cell or with two, a
cell of another shape, an exercise without its answer cell. ``tests/test_exercises.py`` runs it on every solution notebook.

Example::

    >>> from autograder import exercise
    >>> print(hidden_test_source(exercise("0.1"), "hello", self_check=""))
    # Exercise 0.1, part "hello" (1 point): `hello` returns "rank R of W" on 1, 2, 3 and 5 ranks.
    from autograder import exercise
    exercise("0.1").self_check(hello)
    ### BEGIN HIDDEN TESTS
    from autograder.hidden import grade
    grade("0.1", hello, "hello")
    ### END HIDDEN TESTS
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from ..kit.exercise import Exercise
from ..kit.registry import exercises

__all__ = ["GradedCell", "graded_cells", "hidden_test_source", "self_check_source", "problems", "lesson_number",
           "answer_id", "self_check_id", "test_id"]

IMPORT = "from autograder import exercise"
HIDDEN_IMPORT = "from autograder.hidden import grade"
_GRADE = re.compile(r'^grade\("(?P<number>[\d.]+)", (?P<function>\w+), "(?P<part>\w+)"\)$', re.M)
_SELF_CHECK = re.compile(r'^exercise\("(?P<number>[\d.]+)"\)\.self_check\((?P<function>\w+)(?:, (?P<options>[^)]*))?\)$',
                         re.M)


def _exercise_key(ex: Exercise) -> str:
    return "ex" + ex.number.replace(".", "_")


def answer_id(ex: Exercise) -> str:
    """The nbgrader id of an exercise's answer cell: ``ex4_4-ring-allreduce``.

    >>> from autograder import exercise
    >>> answer_id(exercise("6.2")), self_check_id(exercise("6.2")), test_id(exercise("6.2"), "gradients")
    ('ex6_2-miniddp', 'self-check-ex6_2', 'test-ex6_2-gradients')
    """
    return f"{_exercise_key(ex)}-{ex.function.lower().replace('_', '-')}"


def self_check_id(ex: Exercise) -> str:
    """The nbgrader id of an exercise's stand-alone self-check cell: ``self-check-ex4_4``."""
    return f"self-check-{_exercise_key(ex)}"


def test_id(ex: Exercise, part: str) -> str:
    """The nbgrader id of the hidden test cell of ``part``: ``test-ex4_4-no-hang``."""
    return f"test-{_exercise_key(ex)}-{ex.part(part).name.replace('_', '-')}"


def hidden_test_source(ex: Exercise, part: str, self_check: str | None = None) -> str:
    """The source of the hidden test cell of ``part``; ``self_check`` adds the visible self-check line.

    ``self_check`` is None for no self-check, ``""`` for ``self_check(fn)``, or keyword
    options such as ``"nnodes=2"``.
    """
    lines = [ex.heading(part), IMPORT]
    if self_check is not None:
        lines.append(self_check_source(ex, self_check).splitlines()[-1])
    lines += ["### BEGIN HIDDEN TESTS", HIDDEN_IMPORT, f'grade("{ex.number}", {ex.function}, "{ex.part(part).name}")',
              "### END HIDDEN TESTS"]
    return "\n".join(lines)


def self_check_source(ex: Exercise, options: str = "") -> str:
    """The source of a stand-alone self-check cell: the import and one ``self_check`` call."""
    return f'{IMPORT}\nexercise("{ex.number}").self_check({ex.function}{", " + options if options else ""})'


@dataclass(frozen=True)
class GradedCell:
    """A graded cell of a notebook: its nbgrader id and points, and the part its hidden test grades."""

    index: int
    grade_id: str
    points: float | None
    source: str
    number: str | None  # the exercise and part named by the grade call, None without one
    function: str | None
    part: str | None


def _source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def lesson_number(notebook: Path) -> int:
    """The lesson number of ``.../04-ring-all-reduce.ipynb``: 4."""
    match = re.match(r"(\d+)-", notebook.name)
    if not match:
        raise ValueError(f"{notebook.name}: lesson notebooks are named NN-title.ipynb")
    return int(match[1])


def graded_cells(notebook: Path) -> list[GradedCell]:
    """Every cell of ``notebook`` that nbgrader grades, with the part its hidden test names."""
    found = []
    for index, cell in enumerate(json.loads(Path(notebook).read_text())["cells"]):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if not meta.get("grade"):
            continue
        source = _source(cell)
        calls = list(_GRADE.finditer(source))
        call = calls[0] if len(calls) == 1 else None
        found.append(GradedCell(index, meta.get("grade_id", ""), meta.get("points"), source,
                                call["number"] if call else None, call["function"] if call else None,
                                call["part"] if call else None))
    return found


def problems(notebook: Path) -> list[str]:
    """Every way the graded cells of ``notebook`` depart from the declared exercises; [] when none."""
    notebook = Path(notebook)
    lesson = lesson_number(notebook)
    declared = {ex.number: ex for ex in exercises(lesson)}
    found: list[str] = []
    seen: dict[tuple[str, str], list[str]] = {}
    for cell in graded_cells(notebook):
        where = f"{notebook.name}, cell {cell.index} ({cell.grade_id})"
        if cell.part is None:
            found.append(f"{where}: a graded cell must make exactly one call "
                         f'grade("N.M", function, "part") in its hidden tests')
            continue
        if cell.number not in declared:
            found.append(f"{where}: exercise {cell.number} is not declared in autograder/lessons/lesson{lesson:02d}.py")
            continue
        ex = declared[cell.number]
        if cell.part not in {p.name for p in ex.parts}:
            found.append(f"{where}: {ex.label} has no part {cell.part!r} (its parts: "
                         f"{', '.join(p.name for p in ex.parts)})")
            continue
        seen.setdefault((ex.number, cell.part), []).append(cell.grade_id)
        if cell.grade_id != test_id(ex, cell.part):
            found.append(f"{where}: name it {test_id(ex, cell.part)!r} in its nbgrader metadata (grade_id), as "
                         "every hidden test cell is named")
        points = ex.part(cell.part).points
        if cell.points != points:
            found.append(f"{where}: nbgrader gives it {cell.points} points, {ex.label} declares "
                         f"{points} for part {cell.part!r}")
        checks = list(_SELF_CHECK.finditer(cell.source))
        options = (checks[0]["options"] or "") if len(checks) == 1 else None
        want = hidden_test_source(ex, cell.part, options)
        if cell.source != want:
            found.append(f"{where}: the cell should read exactly\n{want}\n--- but reads\n{cell.source}")
    for ex in declared.values():
        for part in ex.parts:
            cells = seen.get((ex.number, part.name), [])
            if len(cells) != 1:
                found.append(f"{notebook.name}: {ex.label} part {part.name!r} has {len(cells)} graded cells "
                             f"({', '.join(cells) or 'none'}); it needs exactly one")
    found.extend(_answer_cell_problems(notebook, declared))
    found.extend(_self_check_problems(notebook, declared))
    return found


def _answer_cell_problems(notebook: Path, declared: dict[str, Exercise]) -> list[str]:
    """Each exercise needs its answer cell: headed ``# Exercise N: title``, defining the function, named by :func:`answer_id`."""
    answers = [c for c in json.loads(notebook.read_text())["cells"]
               if c["cell_type"] == "code" and c.get("metadata", {}).get("nbgrader", {}).get("solution")]
    found = []
    for ex in declared.values():
        heading = f"# Exercise {ex.number}: {ex.title}"
        defines = (f"def {ex.function}(", f"class {ex.function}(", f"class {ex.function}:")
        cell = next((c for c in answers if _source(c).startswith(heading + "\n")
                     and any(d in _source(c) for d in defines)), None)
        if cell is None:
            found.append(f"{notebook.name}: no answer cell starts with {heading!r} and defines `{ex.function}`")
        elif cell["metadata"]["nbgrader"].get("grade_id") != answer_id(ex):
            found.append(f"{notebook.name}: the answer cell of {ex.label} is named "
                         f"{cell['metadata']['nbgrader'].get('grade_id')!r}; name it {answer_id(ex)!r}")
    return found


def _self_check_problems(notebook: Path, declared: dict[str, Exercise]) -> list[str]:
    """Stand-alone self-check cells must be the import and one call naming a declared exercise."""
    found = []
    for index, cell in enumerate(json.loads(notebook.read_text())["cells"]):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        source = _source(cell)
        if cell["cell_type"] != "code" or meta.get("grade") or "autograder" not in source:
            continue
        checks = list(_SELF_CHECK.finditer(source))
        match = checks[0] if len(checks) == 1 else None
        ex = declared.get(match["number"]) if match else None
        if ex is not None and source == self_check_source(ex, match["options"] or ""):
            if meta and meta.get("grade_id") != self_check_id(ex):
                found.append(f"{notebook.name}, cell {index}: name the self-check cell of {ex.label} "
                             f"{self_check_id(ex)!r} (it is {meta.get('grade_id')!r})")
            continue
        if ex is None or source != self_check_source(ex, match["options"] or ""):
            found.append(f"{notebook.name}, cell {index}: a cell that uses the autograder outside the graded "
                         "cells must read exactly\n" + (self_check_source(ex, match["options"] or "") if ex else
                                                         'from autograder import exercise\nexercise("N.M").self_check(function)')
                         + f"\n--- but reads\n{source}")
    return found
