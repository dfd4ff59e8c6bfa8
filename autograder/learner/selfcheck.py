"""A lesson's visible self-checks, run from the command line: ``make check LESSON=05``.

Learners run it in the learner distribution (``make check`` there; it ships with
``make release``), without opening JupyterLab: on a remote machine, or in their own CI.
For each lesson notebook it:

1. reads the notebook's definitions the way the clean re-grade does
   (:func:`autograder.learner.definitions.exercise_code` and :func:`~autograder.learner.definitions.define`):
   imports, functions, classes and constants; nothing else of the notebook runs, so what
   passes here is judged on the same code that grading judges, and the statements left
   out of an answer cell are listed;
2. finds the notebook's self-check calls, ``exercise("5.1").self_check(average_gradients)``
   with their options (``nnodes=2``), plus a plain call for every exercise of the lesson
   whose self-check cell is gone;
3. reports an exercise whose answer still holds its ``raise NotImplementedError("Exercise
   5.1: ...")`` stub as not done yet, without running it, and runs every other self-check
   on fresh ranks, printing what the notebook prints: the passing message, or the failure
   as the notebook shows it (``GradingFailure: Exercise 5.1, part "self-check": ...``).

The exit status is 0 when every self-check passed, 1 when one failed or is not done yet,
2 when the command was used wrongly.

Usage (from the course's folder)::

    python -m autograder.learner.selfcheck              # every lesson in course/
    python -m autograder.learner.selfcheck 05 7         # lessons 05 and 07
    python -m autograder.learner.selfcheck path/to/05-data-parallel-sgd.ipynb

Example (reading a notebook's self-check calls, running nothing)::

    >>> [(c.number, c.function, c.options) for c in self_check_calls(
    ...     ['from autograder import exercise\\nexercise("1.1").self_check(rank_report, nnodes=2)'])]
    [('1.1', 'rank_report', (('nnodes', 2),))]
"""

from __future__ import annotations

import ast
import json
import os
import re
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ..paths import ROOT
from .definitions import Kept, define, exercise_code

__all__ = ["Call", "self_check_calls", "stub_line", "find_notebooks", "check_notebook", "main"]

#: nbgrader's own stub, for an answer cell whose stub does not name its exercise.
PLAIN_STUB = "Replace this line with your code"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
USAGE = ("usage: python -m autograder.learner.selfcheck [LESSON | NOTEBOOK ...]\n"
         "  LESSON: a lesson's number (05 or 5) or folder name (05-data-parallel-sgd); none: every lesson in course/")


@dataclass(frozen=True)
class Call:
    """One self-check call of a notebook: ``exercise(number).self_check(function, **options)``."""

    number: str
    function: str
    options: tuple[tuple[str, Any], ...] = ()

    def __str__(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in self.options)
        return f'exercise("{self.number}").self_check({self.function}{extra})'


def _call(node: ast.AST) -> Call | None:
    """The :class:`Call` that ``node`` is, when it is one with a literal number and literal options."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "self_check"):
        return None
    target = node.func.value
    named = getattr(target, "func", None)
    if not (isinstance(target, ast.Call) and getattr(named, "id", getattr(named, "attr", None)) == "exercise"
            and len(target.args) == 1 and isinstance(target.args[0], ast.Constant)):
        return None
    if len(node.args) != 1 or not isinstance(node.args[0], ast.Name) or any(k.arg is None for k in node.keywords):
        return None
    try:
        options = tuple((k.arg, ast.literal_eval(k.value)) for k in node.keywords)
    except ValueError:
        return None
    return Call(str(target.args[0].value), node.args[0].id, options)


def self_check_calls(sources: Iterable[str]) -> list[Call]:
    """Every self-check call in the cells ``sources``, in order, each once."""
    found: list[Call] = []
    for source in sources:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            call = _call(node)
            if call is not None and call not in found:
                found.append(call)
    return found


def _is_stub(node: ast.AST, number: str) -> bool:
    """``raise NotImplementedError("Exercise 5.1: ...")`` (or nbgrader's plain stub)."""
    if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
            and getattr(node.exc.func, "id", None) == "NotImplementedError" and node.exc.args):
        return False
    text = node.exc.args[0].value if isinstance(node.exc.args[0], ast.Constant) else None
    return isinstance(text, str) and (text.startswith(f"Exercise {number}:") or text == PLAIN_STUB)


def stub_line(code: list[Kept], number: str, function: str) -> str | None:
    """Where exercise ``number``'s answer still raises its stub (``your cell "...", line 5``), or None.

    A stub counts when it names the exercise, anywhere in the definitions; nbgrader's plain
    stub counts in the cell that defines ``function``.

    >>> from autograder.learner.definitions import exercise_code_from_cells
    >>> code, _ = exercise_code_from_cells(['def f():\\n    raise NotImplementedError("Exercise 9.1: t")'])
    >>> stub_line(code, "9.1", "f"), stub_line(code, "9.2", "f")
    ('cell 1, line 2', None)
    """
    for cell in code:
        defines = any(getattr(n, "name", None) == function for n in cell.nodes)
        for top in cell.nodes:
            for node in ast.walk(top):
                if _is_stub(node, number) and (defines or node.exc.args[0].value != PLAIN_STUB):
                    return f"{cell.label or f'cell {cell.number}'}, line {node.lineno}"
    return None


def find_notebooks(args: list[str], course: Path) -> list[tuple[int, Path]]:
    """``(lesson number, notebook)`` for each argument (all of ``course/`` when none); ValueError if one is unknown."""
    lessons = {}
    for folder in sorted(p for p in course.iterdir() if p.is_dir()) if course.is_dir() else []:
        match = re.match(r"(\d+)-", folder.name)
        if match and (folder / f"{folder.name}.ipynb").is_file():
            lessons[int(match[1])] = folder / f"{folder.name}.ipynb"
    chosen = []
    for arg in args or [str(n) for n in sorted(lessons)]:
        if arg.endswith(".ipynb"):
            path = Path(arg)
            match = re.match(r"(\d+)-", path.parent.name) or re.match(r"(\d+)-", path.name)
            if not path.is_file() or not match:
                raise ValueError(f"{arg} is not a lesson notebook (course/<NN-name>/<NN-name>.ipynb), or it does not "
                                 "exist.")
            chosen.append((int(match[1]), path))
            continue
        match = re.match(r"(\d+)(-|$)", arg)
        if not match or int(match[1]) not in lessons:
            known = ", ".join(p.parent.name for p in lessons.values()) or "none"
            raise ValueError(f"no lesson {arg!r} in {course} (the lessons there: {known}). Give a lesson's number, "
                             "for example 05.")
        chosen.append((int(match[1]), lessons[int(match[1])]))
    return chosen


def _shown(lines: list[str]) -> str:
    text = "\n".join(lines)
    return text if sys.stdout.isatty() else _ANSI.sub("", text)


def _run_one(ex: Any, call: Call, namespace: dict[str, Any]) -> str:
    """Run one self-check as the notebook's cell does; print what it shows; return passed or failed."""
    from ..kit.harness import CheckError, GradingFailure

    try:
        ex.self_check(namespace[call.function], **dict(call.options))
    except GradingFailure as failure:
        print(_shown(failure._render_traceback_()))
        return "failed"
    except CheckError as error:
        print(f"CheckError: {error}")
        return "failed"
    except Exception as exc:  # noqa: BLE001 - what the notebook would show as an error of the cell
        print("".join(traceback.format_exception_only(type(exc), exc)).rstrip())
        return "failed"
    return "passed"


def check_notebook(lesson: int, notebook: Path) -> dict[str, int]:
    """Run lesson ``lesson``'s self-checks on ``notebook``'s definitions; print each outcome; count them."""
    from ..kit.registry import exercises

    print(f"Lesson {lesson:02d}: {notebook}", flush=True)
    try:
        code, left_out = exercise_code(notebook)
        sources = [c["source"] if isinstance(c["source"], str) else "".join(c["source"])
                   for c in json.loads(notebook.read_text())["cells"] if c.get("cell_type") == "code"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        print(f"  cannot read {notebook} as a notebook ({type(err).__name__}: {err}). Save it from JupyterLab, or "
              "take a fresh copy from the course's archive.")
        return {"failed": 1}
    declared = {ex.number: ex for ex in exercises(lesson) if ex.visible_check is not None}
    calls = [c for c in self_check_calls(sources) if c.number in declared]
    calls += [Call(n, ex.function) for n, ex in declared.items() if n not in {c.number for c in calls}]
    here = os.getcwd()
    os.chdir(notebook.parent)  # where the notebook's kernel runs
    try:
        namespace, skipped = define(code)
    finally:
        os.chdir(here)
    if left_out + skipped:
        print("  Only the notebook's imports, functions, classes and constants are used, as when it is graded; "
              "left out of your answer cells:")
        print("\n".join(f"    {line}" for line in left_out + skipped))
    counts = {"passed": 0, "failed": 0, "not done yet": 0}
    for call in calls:
        ex = declared[call.number]
        print(f"\n{ex.label}: {call}", flush=True)
        stub = stub_line(code, call.number, call.function)
        if call.function not in namespace:
            print(f"  not done yet: no `{call.function}` is defined by a function or class definition in the "
                  "notebook. Define it in the exercise's cell, save the notebook and run this again.")
            counts["not done yet"] += 1
        elif stub:
            print(f"  not done yet: `{call.function}` still raises the exercise's NotImplementedError ({stub}). "
                  "Write your code in place of that line, save the notebook and run this again.")
            counts["not done yet"] += 1
        else:
            os.chdir(notebook.parent)
            try:
                counts[_run_one(ex, call, namespace)] += 1
            finally:
                os.chdir(here)
    summary = ", ".join(f"{n} {what}" for what, n in counts.items())
    print(f"\nLesson {lesson:02d}: {len(calls)} self-check{'s' if len(calls) != 1 else ''}: {summary}.\n", flush=True)
    return counts


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    try:
        chosen = find_notebooks(argv, ROOT / "course")
    except ValueError as err:
        print(f"{err}\n{USAGE}", file=sys.stderr)
        return 2
    if not chosen:
        print(f"no lesson notebooks in {ROOT / 'course'}.\n{USAGE}", file=sys.stderr)
        return 2
    from ..kit import harness

    harness.reuse_ranks()  # the checks of one run share warm ranks, as the clean re-grade's do
    totals: dict[str, int] = {}
    try:
        for lesson, notebook in chosen:
            for what, n in check_notebook(lesson, notebook).items():
                totals[what] = totals.get(what, 0) + n
    finally:
        harness.reuse_ranks(False)
    if len(chosen) > 1:
        print("All lessons: " + ", ".join(f"{n} {what}" for what, n in totals.items()) + ".")
    return 0 if not totals.get("failed") and not totals.get("not done yet") else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
