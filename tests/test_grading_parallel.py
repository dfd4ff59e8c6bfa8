"""Grading a class in parallel: does `--jobs 4` give every learner the score their answer earns?

A small class of lesson 00 (a right answer, a wrong one, the untouched stub, and a wrong
answer that patches the course's grading in its own kernel) is graded with the instructor's
command, all four at the same time, in a fresh copy of the course. Each score, each part and
the class summary must be the ones a one-at-a-time run gives: those are written out below
(a one-at-a-time run, `--jobs 1`, is graded in tests/test_grading_dask.py and by the hub's
round trip, with the same scores for the same answers). ``make bench-class`` measures the
same at the size of a class; this test keeps it true on every run.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from devtools.scratch import GRADER_PATCH, course_copy, run_instructor_command, solution_source, submission
from autograder.grading.summary import CSV_NAME

LESSON = "00-getting-started"
WRONG = 'def hello(rank, world_size):\n    return "hello"\n'


def _grade(folder: Path, jobs: int) -> tuple[dict[str, float], dict, list[dict]]:
    root = course_copy(folder / "course", lessons=[LESSON])
    release = root / "course" / LESSON / f"{LESSON}.ipynb"
    cells = json.loads(release.read_text())["cells"]
    answer = next(c["metadata"]["nbgrader"]["grade_id"] for c in cells
                  if c.get("metadata", {}).get("nbgrader", {}).get("solution"))
    learners = {"right": {answer: solution_source(LESSON, answer)}, "wrong": {answer: WRONG},
                "stub": None, "patched": {answer: WRONG + GRADER_PATCH}}
    for who, answers in learners.items():
        submission(release, folder / "submissions" / who / LESSON / f"{LESSON}.ipynb", answers)
    done = run_instructor_command(root, "grade", str(folder / "submissions"), "--jobs", str(jobs))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with (root / "autograder" / "grades.csv").open() as f:
        scores = {row["student_id"]: float(row["score"]) for row in csv.DictReader(f)}
    record = json.loads((root / "autograder" / "grading-run.json").read_text())
    with (root / "autograder" / CSV_NAME).open() as f:
        summary = list(csv.DictReader(f))
    return scores, record, summary


@pytest.mark.slow
def test_parallel_grading_gives_the_serial_scores(tmp_path):
    """Does --jobs 4 give every learner the score, the parts and the class summary a serial run gives?"""
    scores, record, summary = _grade(tmp_path, 4)
    assert scores == {"right": 1.0, "wrong": 0.0, "stub": 0.0, "patched": 0.0}, scores
    parts = {r["student"]: [(p["part"], p["score"]) for p in r["parts"]] for r in record["submissions"]}
    assert parts == {"right": [("hello", 1.0)], "wrong": [("hello", 0.0)], "stub": [("hello", 0.0)],
                     "patched": [("hello", 0.0)]}, parts
    assert record["jobs"] == 4 and record["workers"] == "this machine", record
    # Four at the same time: the run took less than its submissions' times one after the other.
    assert record["seconds"] < sum(r["seconds"] for r in record["submissions"]), record
    assert [(r["part"], r["graded"], r["passed"]) for r in summary] == [("hello", "4", "1")], summary
    patched = next(r for r in record["submissions"] if r["student"] == "patched")
    # Its patch of the grading ran in its own kernel; the fresh process that decided left it out.
    assert any("autograder.kit.exercise.Exercise.grade" in line for line in patched["left_out"]), patched
