"""Scratch copies of the course for trying the grading workflow (used by tests and benchmarks).

Not part of the shipped packages: tests/ and bench/ import it from the repository root
(``from devtools.scratch import course_copy``).

Nothing here isolates or restricts code: these are plain folders and files, meant to be
thrown away, so that grading trials never touch the repository's gradebook and work
folders.

- ``course_copy(folder)`` copies nbgrader_config.py, solutions/ and course/ into
  ``folder``; ``run_instructor_command(folder, ...)`` then runs ``python -m autograder
  ...`` there (with ``COURSE_ROOT=folder``).
- ``solution_source(lesson, grade_id)`` is the instructor's code of one exercise cell.
- ``submission(release, target, answers, drop, edit)`` writes a learner's notebook from a
  released one, with chosen exercise cells filled in, cells deleted or cells edited.
- ``hand_in(root, submissions, lesson, answers)`` writes one notebook per learner, and
  ``layout(lesson)`` names its exercises' graded cells and points (tests/conftest.py's
  ``graded_class`` grades a session's learners together, as an instructor would).
- ``scores(root, lesson, cells, student)`` and ``feedback(root, lesson, student)`` read back
  what grading gave a learner: points per part from the gradebook, and the HTML feedback.
- ``RING_ANSWERS``: answers to Exercise 4.4 that learners really hand in, each wrong in its
  own way (the tests and the grading benchmarks share them), and ``GRADER_PATCH``: lines a
  cheating learner adds after an answer to make every hidden test pass in their own kernel.

Example::

    >>> import tempfile, pathlib
    >>> root = course_copy(pathlib.Path(tempfile.mkdtemp()) / "course", lessons=["00-getting-started"])
    >>> sorted(p.name for p in root.iterdir())
    ['autograder', 'course', 'nbgrader_config.py', 'solutions']
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from autograder.notebooks.generate import tool_env
from autograder.paths import ROOT

__all__ = ["course_copy", "submission", "run_instructor_command", "sandbox_flags", "solution_source", "hand_in", "layout", "scores", "feedback",
           "RING_ANSWERS", "GRADER_PATCH"]

#: Exercise 4.4 (``ring_allreduce``) as learners get it wrong, by kind.
RING_ANSWERS = {
    # The tutorial's ring: right sums, but the whole running sum goes round p-1 times.
    "whole_tensor": '''def ring_allreduce(tensor):
    # The tutorial's ring: pass the whole running sum round p-1 times.
    rank, p = dist.get_rank(), dist.get_world_size()
    total, outgoing, incoming = tensor.clone(), tensor.clone(), torch.empty_like(tensor)
    for _ in range(p - 1):
        request = dist.isend(outgoing, (rank + 1) % p)
        dist.recv(incoming, (rank - 1) % p)
        request.wait()
        total += incoming
        outgoing = incoming.clone()
    tensor.copy_(total)
    return tensor
''',
    # Every rank receives first: nobody sends, every check waits out its timeout.
    "receive_first": '''def ring_allreduce(tensor):
    rank, p = dist.get_rank(), dist.get_world_size()
    incoming = torch.empty_like(tensor)
    for _ in range(p - 1):
        dist.recv(incoming, (rank - 1) % p)   # everybody waits, nobody sends
        dist.send(tensor, (rank + 1) % p)
        tensor += incoming
''',
    # Indexes one chunk too far on the last rank: it crashes, the others are left waiting.
    "crash": '''def ring_allreduce(tensor):
    rank, p = dist.get_rank(), dist.get_world_size()
    chunks = list(tensor.view(-1).chunk(p))
    mine = chunks[rank + 1] if rank == p - 1 else chunks[rank]
    dist.send(mine.clone(), (rank + 1) % p)
''',
    # The built-in collective, which the exercise switches off.
    "built_in": '''def ring_allreduce(tensor):
    dist.all_reduce(tensor)
''',
}
#: Appended to an answer cell: replaces the course's grading in the learner's own kernel, so
#: every hidden test cell after it passes there. The clean re-grade must not be fooled.
GRADER_PATCH = '''

import autograder.kit.exercise
autograder.kit.exercise.Exercise.grade = lambda self, fn, part: None          # every hidden test now "passes" here,
autograder.kit.exercise.Exercise.self_check = lambda self, fn, **options: None  # and so does every self-check
'''


def course_copy(folder: Path, lessons: list[str] | None = None) -> Path:
    """Copy the course's nbgrader setup into ``folder``; returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy2(ROOT / "nbgrader_config.py", folder / "nbgrader_config.py")
    for part in ("solutions", "course"):
        for lesson_dir in sorted((ROOT / part).iterdir()):
            if lesson_dir.is_dir() and (lessons is None or lesson_dir.name in lessons):
                shutil.copytree(lesson_dir, folder / part / lesson_dir.name, dirs_exist_ok=True)
    (folder / "autograder").mkdir(exist_ok=True)
    return folder


def solution_source(lesson: str, grade_id: str) -> str:
    """The instructor's source of one exercise cell (markup lines removed)."""
    nb = json.loads((ROOT / "solutions" / lesson / f"{lesson}.ipynb").read_text())
    for cell in nb["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id:
            src = "".join(cell["source"])
            return "\n".join(line for line in src.splitlines() if "### BEGIN SOLUTION" not in line and "### END SOLUTION" not in line)
    raise KeyError(f"{lesson} has no cell with grade_id {grade_id!r}")


def submission(release: Path, target: Path, answers: dict[str, str] | None = None, drop: tuple[str, ...] = (), edit: dict[str, str] | None = None) -> Path:
    """Write a learner's notebook: ``answers`` fill exercise cells (by grade_id), ``drop``
    deletes cells, ``edit`` overwrites other cells (say, a learner tampering with a test)."""
    nb = json.loads(release.read_text())
    cells = []
    for cell in nb["cells"]:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in drop:
            continue
        if answers and gid in answers:
            cell["source"] = answers[gid]
        elif edit and gid in edit:
            cell["source"] = edit[gid]
        cells.append(cell)
    nb["cells"] = cells
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(nb, indent=1))
    return target


def sandbox_flags() -> list[str]:
    """``["--no-sandbox"]`` where bubblewrap cannot run and no one asked for it, else ``[]``.

    Grading trials on a machine without bubblewrap then still run, unsandboxed;
    ``COURSE_REQUIRE_SANDBOX=1`` (set by ``.ci/run`` once it has installed bubblewrap)
    makes them run sandboxed or fail.
    """
    from autograder.grading.sandbox import problem

    return ["--no-sandbox"] if problem() is not None and not os.environ.get("COURSE_REQUIRE_SANDBOX") else []


def run_instructor_command(root: Path, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    """``python -m autograder ARGS`` with ``COURSE_ROOT=root`` (``grade`` gets :func:`sandbox_flags`)."""
    if args[:1] == ("grade",) and "--no-sandbox" not in args:
        args = (*args, *sandbox_flags())
    env = tool_env()
    env["COURSE_ROOT"] = str(root)
    return subprocess.run(
        [sys.executable, "-m", "autograder", *args], cwd=root, env=env, capture_output=True, text=True, timeout=timeout
    )


def hand_in(root: Path, submissions: Path, lesson: str, answers: dict[str, dict[str, str] | None]) -> None:
    """Write one notebook of ``lesson`` per learner into ``submissions``, from the course copy at ``root``.

    ``answers`` maps each learner to the exercise cells they filled in (grade_id -> source;
    None hands the notebook in untouched). A learner who already handed this lesson in is
    an error: two tests would then read one learner's grade as theirs.
    """
    release = root / "course" / lesson / f"{lesson}.ipynb"
    for who, cells_of in answers.items():
        target = submissions / who / lesson / f"{lesson}.ipynb"
        if target.exists():
            raise ValueError(f"{who} already handed in {lesson}: give each learner of a class a name of their own")
        submission(release, target, cells_of)


def layout(lesson: str, *numbers: str) -> tuple[dict[str, str], dict[str, float]]:
    """The graded cells of exercises ``numbers`` of ``lesson`` (all of its exercises when none
    is given): grade_id -> part name, and part name -> points, ready for :func:`scores`.

    A part is named as its exercise declares it (``"broadcast"``); where the lesson has more
    than one exercise, after its exercise's number (``"5.1/correct"``). Raises AssertionError
    when the notebook's graded cells and the declared parts disagree.
    """
    from autograder import exercise, exercises
    from autograder.notebooks.cells import graded_cells, lesson_number

    notebook = ROOT / "solutions" / lesson / f"{lesson}.ipynb"
    numbers = numbers or tuple(ex.number for ex in exercises(lesson_number(notebook)))

    def name(number: str, part: str) -> str:
        return part if len(numbers) == 1 else f"{number}/{part}"

    cells = {c.grade_id: name(c.number, c.part) for c in graded_cells(notebook) if c.number in numbers}
    points = {name(number, part.name): part.points for number in numbers for part in exercise(number).parts}
    assert set(cells.values()) == set(points), cells
    return cells, points


def scores(root: Path, lesson: str, cells: dict[str, str], student: str) -> dict[str, float]:
    """The points nbgrader gave ``student`` for each part of ``lesson``, in the course copy at ``root``.

    ``cells`` maps each graded cell's grade_id to its part's name (see
    :func:`autograder.notebooks.cells.graded_cells`); the result maps part names to scores.
    """
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{root / 'autograder' / 'gradebook.db'}") as gb:
        grades = gb.find_submission_notebook(lesson, lesson, student).grades
        return {cells[g.name]: g.score for g in grades if g.name in cells}


def feedback(root: Path, lesson: str, student: str) -> str:
    """The HTML feedback ``student`` received for ``lesson``, in the course copy at ``root``."""
    return (root / "autograder" / "feedback" / student / lesson / f"{lesson}.html").read_text()
