"""What the lesson grading tests (tests/test_grading_e2e_05.py to _08.py) share.

Each of those modules declares what its learners hand in (``HANDED_IN``, lesson ->
learner -> answer cells); tests/conftest.py grades every learner of the session in one
class and gives each test its lesson as a :class:`GradedLesson` (the ``graded_lesson`` fixture).

- :func:`variant`: the instructor's answer cell with a few lines changed, the way a
  learner's realistic mistake differs from it; :func:`with_mistakes` hands the answer in
  for ``amy`` and one variant for every other learner.
- :class:`GradedLesson`: one lesson of the graded class: each learner's points per part,
  their feedback page, and the run record's entries, with the checks the modules share.
- :class:`Regraded`: one learner's notebook decided by the clean re-grade alone
  (:mod:`autograder.grading.clean`, the process whose verdicts are the only ones `make grade`
  counts), without nbgrader or a kernel: the same points per part, and the same verdict text
  per part as the graded cell shows (:func:`autograder.grading.verdicts.verdict_outputs`). The
  tests/test_regrade_NN.py modules decide this way the learners whose point is the verdict
  itself, not the grade command's path (issue 47).

Example (reading no notebook)::

    >>> lesson = GradedLesson(Path("course"), "06-ddp", ("amy",), {"test-ex6_2-broadcast": "6.2/broadcast"},
    ...                       {"6.2/broadcast": 2})
    >>> lesson.full_marks
    2
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from devtools import scratch

__all__ = ["variant", "with_mistakes", "GradedLesson", "Regraded", "regrade"]


def variant(lesson: str, grade_id: str, *changes: tuple[str, str]) -> str:
    """The instructor's source of cell ``grade_id`` with each ``(old, new)`` of ``changes`` replaced.

    Raises AssertionError when the solution no longer contains an ``old``: the test's
    mistakes then need updating, or the learner would hand in the right answer.
    """
    source = scratch.solution_source(lesson, grade_id)
    for old, new in changes:
        assert old in source, f"the solution of {lesson} ({grade_id}) no longer contains {old!r}: update this test's mistakes"
        source = source.replace(old, new)
    return source


def with_mistakes(lesson: str, grade_id: str, mistakes: dict[str, tuple[tuple[str, str], ...]]) -> dict[str, dict[str, str]]:
    """What each learner hands in: ``amy`` the instructor's answer, every learner of ``mistakes`` their :func:`variant`."""
    return {"amy": {grade_id: scratch.solution_source(lesson, grade_id)},
            **{who: {grade_id: variant(lesson, grade_id, *changes)} for who, changes in mistakes.items()}}


@dataclass(frozen=True)
class GradedLesson:
    """One lesson of a graded course copy at ``root``, handed in by ``learners``: ``cells``
    maps each graded cell's grade_id to its part, ``points`` each part to its points (see
    :func:`devtools.scratch.layout`)."""

    root: Path
    lesson: str
    learners: tuple[str, ...]
    cells: dict[str, str]
    points: dict[str, float]

    @property
    def full_marks(self) -> float:
        """Every part's points added up."""
        return sum(self.points.values())

    def scores(self, student: str) -> dict[str, float]:
        """The points ``student`` earned for each part."""
        return scratch.scores(self.root, self.lesson, self.cells, student)

    def feedback(self, student: str) -> str:
        """The HTML feedback page ``student`` received."""
        return scratch.feedback(self.root, self.lesson, student)

    def check_feedback(self, student: str, *phrases: str) -> None:
        """Assert that ``student``'s feedback page says every one of ``phrases``."""
        text = self.feedback(student)
        missing = [phrase for phrase in phrases if phrase not in text]
        assert not missing, f"{student}'s feedback on {self.lesson} lacks {missing}; it reads:\n{text}"

    def check_verdicts(self, student: str, failing: set[str]) -> None:
        """Assert that ``student``'s feedback page shows each part of ``failing`` (names as in ``points``) as
        ``Exercise N.M, part "p": 0 of k points.`` and shows no frame of the course's grading code."""
        import html
        import re

        text = html.unescape(re.sub(r"<[^>]+>", "", self.feedback(student)))
        lesson_module = f"lesson{self.lesson[:2]}.py"
        frames = [name for name in ("exercise.py", "harness.py", "gradcheck.py", "ringcheck.py", lesson_module) if name in text]
        # A traceback shown for an error: IPython's header ("GradingFailure    Traceback (most recent call last)")
        # or Python's own at the start of a line. A docstring's doctest that a lesson cell prints (indented) is not one.
        frames += re.findall(r"(?m)^(?:\w+[ \t]+)?Traceback \(most recent call last\)", text)
        assert not frames, f"{student}'s feedback on {self.lesson} shows the grading code's frames {frames}:\n{text}"
        for grade_id, part in self.cells.items():
            if part not in failing:
                continue
            number = grade_id.split("-")[1][len("ex"):].replace("_", ".")
            points = self.points[part]
            verdict = (rf'Exercise {re.escape(number)}, part "{part.split("/")[-1]}"[^:\n]*: 0 of {points:g} '
                       rf'points?\.\s*\S')
            assert re.search(verdict, text), f"{student}'s feedback lacks the verdict of {part} ({verdict}):\n{text}"

    def runs(self) -> dict[str, dict]:
        """This lesson's entries of the grading run's record (autograder/grading-run.json), by student."""
        record = json.loads((self.root / "autograder" / "grading-run.json").read_text())
        return {run["student"]: run for run in record["submissions"] if run["lesson"] == self.lesson}

    def check_every_learner_graded(self, full_marks_by: str = "amy") -> None:
        """Assert that the run record holds exactly this lesson's learners, each graded without
        an error, and that ``full_marks_by`` (who handed in the instructor's answer) scored every point."""
        runs = self.runs()
        assert set(runs) == set(self.learners)
        assert all(run["status"] == "ok" for run in runs.values()), runs
        assert runs[full_marks_by]["score"] == pytest.approx(self.full_marks)


@dataclass(frozen=True)
class Regraded:
    """One learner's notebook of ``lesson`` as the clean re-grade decided it: ``results`` holds one line of
    :mod:`autograder.grading.clean` per part, ``left_out`` what it left out of the notebook; ``cells`` and
    ``points`` as in :class:`GradedLesson`."""

    lesson: str
    student: str
    results: tuple[dict, ...]
    left_out: tuple[str, ...]
    cells: dict[str, str]
    points: dict[str, float]

    @property
    def full_marks(self) -> float:
        """Every part's points added up."""
        return sum(self.points.values())

    def _name(self, result: dict) -> str:
        """A part's name as :func:`devtools.scratch.layout` gives it: after its exercise where the lesson has more than one."""
        several = any("/" in part for part in self.points)
        return f"{result['exercise']}/{result['part']}" if several else result["part"]

    def scores(self) -> dict[str, float]:
        """The points the clean re-grade gave each part (named as in ``points``), as the gradebook would hold them."""
        return {self._name(r): float(r["score"]) for r in self.results}

    def verdicts(self) -> str:
        """What the graded cells would show, one after another: each part's verdict as `make grade` writes it
        in place of the hidden test's output (:func:`autograder.grading.verdicts.verdict_outputs`)."""
        from autograder.grading.verdicts import verdict_outputs

        shown = []
        for result in self.results:
            for output in verdict_outputs({}, dict(result), list(self.left_out), None):
                shown.append("".join(output.get("text", "")) + "\n".join(output.get("traceback", [])))
        return re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(shown))

    def check_feedback(self, *phrases: str) -> None:
        """Assert that the parts' verdicts say every one of ``phrases``, and that no check of the course failed."""
        text = self.verdicts()
        missing = [phrase for phrase in phrases if phrase not in text]
        assert not missing, f"{self.student}'s verdicts on {self.lesson} lack {missing}; they read:\n{text}"
        errors = [r for r in self.results if r.get("check_error")]
        assert not errors, f"a check of the course itself failed on {self.student}'s {self.lesson}: {errors}"


def regrade(folder: Path, lesson: str, student: str, answers: dict[str, str] | None, timeout: float = 600) -> Regraded:
    """Hand in ``answers`` (grade_id -> source; None: the notebook untouched) as :func:`devtools.scratch.hand_in`
    writes it into a class's submissions, and decide it with ``python -m autograder.grading.clean`` as `make
    grade`'s clean re-grade does (the same rank warm-up; no nbgrader, no kernel, no sandbox), in ``folder``.

    Raises AssertionError when the process fails or decides a part twice or not at all.
    """
    from autograder.grading.workfolder import warm_up

    folder = folder / student / lesson
    notebook = scratch.submission(scratch.ROOT / "course" / lesson / f"{lesson}.ipynb", folder / f"{lesson}.ipynb",
                                  answers)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **warm_up(lesson, clean=True)}
    env.pop("COURSE_CLEAN_RUN_DECIDES", None)
    done = subprocess.run([sys.executable, "-m", "autograder.grading.clean", str(notebook), str(int(lesson[:2]))],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"the clean re-grade of {student}'s {lesson} exited with {done.returncode}:\n" \
                                 f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    head = next(line for line in lines if "left_out" in line)
    results = tuple(line for line in lines if "part" in line)
    cells, points = scratch.layout(lesson)
    graded = Regraded(lesson, student, results, tuple(head["left_out"]), cells, points)
    named = [graded._name(r) for r in results]
    assert sorted(named) == sorted(points), f"the clean re-grade decided {named}, the lesson declares {sorted(points)}"
    return graded
