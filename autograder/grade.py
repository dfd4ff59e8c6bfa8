"""Grade a class: collect learners' notebooks, autograde them, write feedback, export grades.

Run from the repository root::

    python -m autograder grade path/to/submissions        # or: make grade SUBMISSIONS=path

``path/to/submissions`` holds one folder per learner, each with the lessons they hand in
as ``<student>/<lesson>/<lesson>.ipynb`` (the layout the course's Submit button and a
download from Colab both give, once placed in a folder named after the learner).

Steps, each a standard nbgrader command underneath:

1. record every lesson in the gradebook (``generate_assignment`` into a scratch folder,
   so course/ is left as it is);
2. copy the submissions into ``autograder/submitted/`` (collect);
3. ``nbgrader autograde <lesson>``: runs each notebook in a fresh kernel, restores
   edited or deleted test cells, scores each test cell;
4. ``nbgrader generate_feedback <lesson>``: one HTML page per learner and lesson in
   ``autograder/feedback/<student>/<lesson>/``;
5. ``nbgrader export``: all grades as CSV in ``autograder/grades.csv``;
6. a record of this run in ``autograder/grading-run.json`` (see :func:`grade`), for
   scripts and benchmarks; the printed table is the same information for people.

One broken submission never stops the others: each learner's notebook is graded on its
own, a failure is logged and reported at the end, and the rest carry on.

The record looks like this (seconds are each ``nbgrader autograde`` run's wall time)::

    {"started": "2026-11-22T10:00:00+00:00", "seconds": 41.2, "grades_csv": "autograder/grades.csv",
     "submissions": [{"student": "alice", "lesson": "04-ring-all-reduce", "seconds": 17.0,
                      "status": "ok", "score": 10.0, "max_score": 10.0, "error": null}]}
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .course import ROOT, lessons, tool_env

__all__ = ["collect", "grade", "main", "RECORD"]

WORK = ROOT / "autograder"
RECORD = WORK / "grading-run.json"  # git-ignored, like grades.csv: it holds learners' scores


def _nbgrader(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "nbgrader", *args, "--log-level=WARN"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=tool_env())
    if check and done.returncode != 0:
        raise RuntimeError(f"`nbgrader {' '.join(args)}` failed:\n{done.stdout}\n{done.stderr}")
    return done


def collect(source: Path) -> dict[str, list[str]]:
    """Copy ``source/<student>/<lesson>/<lesson>.ipynb`` into autograder/submitted/; returns lesson -> students."""
    known = set(lessons())
    found: dict[str, list[str]] = {}
    for student_dir in sorted(p for p in source.iterdir() if p.is_dir()):
        for lesson_dir in sorted(p for p in student_dir.iterdir() if p.is_dir()):
            notebook = lesson_dir / f"{lesson_dir.name}.ipynb"
            if lesson_dir.name not in known or not notebook.is_file():
                print(f"  skipped {lesson_dir.relative_to(source)}: not a lesson notebook of this course")
                continue
            target = WORK / "submitted" / student_dir.name / lesson_dir.name
            if target.exists():
                shutil.rmtree(target)
            target.mkdir(parents=True)
            shutil.copy2(notebook, target / notebook.name)
            (target / "timestamp.txt").write_text(time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
            found.setdefault(lesson_dir.name, []).append(student_dir.name)
    return found


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "") else None
    except ValueError:
        return None


def _scores(grades: Path) -> dict[tuple[str, str], tuple[float | None, float | None]]:
    """(student, lesson) -> (score, max score), from nbgrader's CSV export."""
    if not grades.is_file():
        return {}
    with grades.open() as f:
        return {(row["student_id"], row["assignment"]): (_number(row.get("score")), _number(row.get("max_score")))
                for row in csv.DictReader(f) if row.get("student_id") and row.get("assignment")}


def grade(source: Path) -> dict[str, Any]:
    """The whole workflow; returns the run's record, also written to autograder/grading-run.json.

    The record holds, for every submission graded in this run, the student, the lesson,
    the seconds ``nbgrader autograde`` took, its status (``"ok"`` or ``"failed"``, with the
    ``error``), and the score and max score from the export (None when it has none).
    """
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        for lesson in lessons():
            _nbgrader("generate_assignment", lesson, "--force", f"--CourseDirectory.release_directory={scratch}")
    found = collect(source)
    grades = WORK / "grades.csv"
    record: dict[str, Any] = {"started": started_at, "seconds": 0.0, "source": str(source),
                              "grades_csv": str(grades.relative_to(ROOT)), "submissions": []}
    if not found:
        print(f"No submissions found under {source} (expected <student>/<lesson>/<lesson>.ipynb).")
        RECORD.write_text(json.dumps(record, indent=2) + "\n")
        return record
    runs = record["submissions"]
    for lesson, students in sorted(found.items()):
        for student in students:
            began = time.monotonic()
            done = _nbgrader("autograde", lesson, "--create", "--force", f"--student={student}", check=False)
            seconds = time.monotonic() - began
            ok = done.returncode == 0
            print(f"  autograded {student}/{lesson} in {seconds:.1f} s: {'ok' if ok else 'FAILED'}")
            error = None if ok else (done.stderr.strip().splitlines()[-1:] or [done.stdout[-200:]])[0]
            if ok:
                _nbgrader("generate_feedback", lesson, "--force", f"--student={student}", check=False)
            runs.append({"student": student, "lesson": lesson, "seconds": round(seconds, 2),
                         "status": "ok" if ok else "failed",
                         "score": None, "max_score": None, "error": error})
    _nbgrader("export", f"--to={grades}")
    scores = _scores(grades)
    for run in runs:
        if run["status"] == "ok" and (run["student"], run["lesson"]) in scores:
            run["score"], run["max_score"] = scores[(run["student"], run["lesson"])]
    record["seconds"] = round(time.monotonic() - started, 2)
    RECORD.write_text(json.dumps(record, indent=2) + "\n")

    print(f"\nGrades: {grades.relative_to(ROOT)}    Feedback: autograder/feedback/<student>/<lesson>/    "
          f"This run: {RECORD.relative_to(ROOT)}")
    for (student, lesson), (score, max_score) in scores.items():
        print(f"  {student:<16} {lesson:<24} {score if score is not None else '-':>6} / "
              f"{max_score if max_score is not None else '-'}")
    failures = [f"{r['student']}/{r['lesson']}: {r['error']}" for r in runs if r["status"] != "ok"]
    if failures:
        print("\nCould not grade (see nbgrader's log above):\n  " + "\n  ".join(failures))
    return record


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m autograder grade <folder with <student>/<lesson>/<lesson>.ipynb>")
        return 2
    source = Path(argv[0]).resolve()
    if not source.is_dir():
        print(f"{source} is not a folder")
        return 2
    record = grade(source)
    return 1 if any(run["status"] != "ok" for run in record["submissions"]) else 0
