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
5. ``nbgrader export``: all grades as CSV in ``autograder/grades.csv``.

One broken submission never stops the others: each learner's notebook is graded on its
own, a failure is logged and reported at the end, and the rest carry on.
"""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .course import ROOT, lessons, tool_env

__all__ = ["collect", "grade", "main"]

WORK = ROOT / "autograder"


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


def grade(source: Path) -> int:
    """The whole workflow; returns the number of submissions that could not be graded."""
    with tempfile.TemporaryDirectory() as scratch:
        for lesson in lessons():
            _nbgrader("generate_assignment", lesson, "--force", f"--CourseDirectory.release_directory={scratch}")
    found = collect(source)
    if not found:
        print(f"No submissions found under {source} (expected <student>/<lesson>/<lesson>.ipynb).")
        return 0
    failures = []
    for lesson, students in sorted(found.items()):
        for student in students:
            started = time.monotonic()
            done = _nbgrader("autograde", lesson, "--create", "--force", f"--student={student}", check=False)
            seconds = time.monotonic() - started
            status = "ok" if done.returncode == 0 else "FAILED"
            print(f"  autograded {student}/{lesson} in {seconds:.1f} s: {status}")
            if done.returncode != 0:
                failures.append(f"{student}/{lesson}: {done.stderr.strip().splitlines()[-1:] or done.stdout[-200:]}")
                continue
            _nbgrader("generate_feedback", lesson, "--force", f"--student={student}", check=False)
    grades = WORK / "grades.csv"
    _nbgrader("export", f"--to={grades}")
    print(f"\nGrades: {grades.relative_to(ROOT)}    Feedback: autograder/feedback/<student>/<lesson>/")
    with grades.open() as f:
        for row in csv.DictReader(f):
            if row.get("student_id") and row.get("assignment"):
                print(f"  {row['student_id']:<16} {row['assignment']:<24} {row['score']:>6} / {row['max_score']}")
    if failures:
        print("\nCould not grade (see nbgrader's log above):\n  " + "\n  ".join(failures))
    return len(failures)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m autograder grade <folder with <student>/<lesson>/<lesson>.ipynb>")
        return 2
    source = Path(argv[0]).resolve()
    if not source.is_dir():
        print(f"{source} is not a folder")
        return 2
    return 1 if grade(source) else 0
