"""Grading a class in parallel: does `--jobs N` give every learner the score a serial run gives?

A small class of lesson 00 (a right answer, a wrong one, the untouched stub, and a wrong
answer that patches the course's grading in its own kernel) is graded twice with the
instructor's command, in two fresh copies of the course: once one submission at a time,
once all at the same time. The scores, the gradebook's parts and the class summary must
agree. (``make bench-class`` measures the same at the size of a class; this test keeps it
true on every run.)
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
    """Do --jobs 1 and --jobs 4 give every learner the same score, part by part, and the same class summary?"""
    serial, serial_record, serial_summary = _grade(tmp_path / "serial", 1)
    parallel, parallel_record, parallel_summary = _grade(tmp_path / "parallel", 4)
    assert serial == {"right": 1.0, "wrong": 0.0, "stub": 0.0, "patched": 0.0}, serial
    assert parallel == serial
    parts = lambda record: {r["student"]: [(p["part"], p["score"]) for p in r["parts"]]  # noqa: E731
                            for r in record["submissions"]}
    assert parts(parallel_record) == parts(serial_record)
    assert (serial_record["jobs"], parallel_record["jobs"]) == (1, 4)
    assert serial_record["workers"] == parallel_record["workers"] == "this machine"
    assert [(r["part"], r["graded"], r["passed"]) for r in parallel_summary] == \
        [(r["part"], r["graded"], r["passed"]) for r in serial_summary] == [("hello", "4", "1")]
    patched = next(r for r in parallel_record["submissions"] if r["student"] == "patched")
    # Its patch of the grading ran in its own kernel; the fresh process that decided left it out.
    assert patched["parts"][0]["score"] == 0.0 and any("autograder.kit.exercise.Exercise.grade" in line
                                                       for line in patched["left_out"]), patched
