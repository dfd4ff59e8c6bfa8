"""Grade a class: collect learners' notebooks, autograde them in sandboxes, in parallel, and summarise.

Run from the repository root::

    python -m autograder grade path/to/submissions [--jobs N] [--no-sandbox] [--only-ungraded]
    make grade SUBMISSIONS=path [JOBS=N] [NO_SANDBOX=1] [ONLY_UNGRADED=1]

``path/to/submissions`` holds one folder per learner, each with the lessons they hand in
as ``<student>/<lesson>/<lesson>.ipynb`` (the layout the course's Submit button and a
download from Colab both give, once placed in a folder named after the learner).

Steps:

1. record every lesson in the gradebook (nbgrader's ``generate_assignment``, into a
   scratch folder, so course/ is left as it is);
2. copy the submissions into ``autograder/submitted/`` (collect);
3. grade every submission on its own, ``--jobs`` of them at a time (default: one per
   core), in worker processes that keep nbgrader loaded, each submission in a private work
   folder with its own copy of the gradebook (:mod:`autograder.grading.submission`: autograde in
   the grading sandbox, where the notebook runs; the clean re-grade, which decides every
   graded part in a fresh process; the feedback page). A submission that could not be
   graded for a reason that is not the learner's (the sandbox or the kernel did not start)
   is graded once more;
4. merge each finished submission into ``autograder/gradebook.db`` and its notebook and
   feedback into ``autograder/autograded/`` and ``autograder/feedback/`` (only this
   process writes the shared gradebook, one submission at a time), and keep its whole log
   in ``autograder/logs/<student>/<lesson>.log``;
5. export all grades as CSV to ``autograder/grades.csv``;
6. the class summary (:mod:`autograder.grading.summary`): per lesson and part, how many passed,
   the most common failures with a real example, the slowest submissions and those that
   could not be graded, printed and written to ``autograder/class-summary.csv`` and ``.html``;
7. a record of this run in ``autograder/grading-run.json``.

One broken submission never stops the others. ``--only-ungraded`` grades only the
submissions of the folder that have no grade yet (not graded, or failed last time), keeping
every other grade; Ctrl-C stops a run, keeps what was merged, and names what is left for it.

The record looks like this (seconds are each submission's wall time, all steps)::

    {"started": "2026-11-22T10:00:00+00:00", "seconds": 41.2, "jobs": 2, "sandbox": true,
     "grades_csv": "autograder/grades.csv",
     "submissions": [{"student": "alice", "lesson": "04-ring-all-reduce", "seconds": 9.0, "tries": 1, "retried_because": [],
                      "stages": {"setup": 0.1, "autograde": 6.1, "kernel_start": 1.9, "clean": 6.5,
                                 "clean_after_kernel": 0.9, "settle": 0.1, "feedback": 0.6},
                      "cells": {"ran": 30, "seconds": 3.2, "first": 1.4, "slowest": [...]},
                      "status": "ok", "failure": null, "error": null, "notes": [],
                      "log": "autograder/logs/alice/04-ring-all-reduce.log",
                      "score": 10.0, "max_score": 10.0,
                      "parts": [{"grade_id": "...", "exercise": "4.4", "part": "correct", "points": 4,
                                 "score": 4, "message": null, "seconds": 1.2, "launches": 6}],
                      "left_out": []}]}
"""

from __future__ import annotations

import argparse
import csv
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..course.build import ROOT, build, lessons, nbgrader_api, tool_env
from .submission import grade_submission, quiet_gradebook, warm_up
from .task import TRIES, Graded, Task

__all__ = ["collect", "grade", "main", "RECORD", "LOGS"]

WORK = ROOT / "autograder"
RECORD = WORK / "grading-run.json"  # git-ignored, like grades.csv: it holds learners' scores
#: Each submission's whole log: nbgrader's, the kernel's error output, the clean re-grade's.
LOGS = WORK / "logs"


def _record_lessons(names: list[str]) -> None:
    """Every lesson into the gradebook (generated into a scratch folder: course/ stays as it is)."""
    with tempfile.TemporaryDirectory() as scratch:
        build(names, release_dir=Path(scratch))


def _export(grades: Path) -> None:
    """All grades of the gradebook as nbgrader's CSV."""
    from nbgrader.api import Gradebook
    from nbgrader.plugins import CsvExportPlugin

    api = nbgrader_api()
    with Gradebook(api.coursedir.db_url, api.coursedir.course_id) as gb:
        CsvExportPlugin(to=str(grades)).export(gb)


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


# -- merging one graded submission into the course -------------------------------------------


def _merge(graded: Graded) -> None:
    """Copy a graded submission into the course: gradebook rows, autograded notebook, feedback."""
    from nbgrader.api import Gradebook, MissingEntry

    work = Path(graded.folder) / "autograder"
    with Gradebook(f"sqlite:///{WORK / 'gradebook.db'}") as gb:  # an earlier grading of it goes first
        gb.update_or_create_student(graded.student)
        try:
            gb.remove_submission(graded.lesson, graded.student)
        except MissingEntry:
            pass
    with Gradebook(f"sqlite:///{work / 'gradebook.db'}") as source, \
            Gradebook(f"sqlite:///{WORK / 'gradebook.db'}") as gb:
        sub = source.find_submission(graded.lesson, graded.student)
        gb.add_submission(graded.lesson, graded.student, timestamp=sub.timestamp, extension=sub.extension)
        for nb in sub.notebooks:
            target = gb.find_submission_notebook(nb.name, graded.lesson, graded.student)
            target.flagged, target.late_submission_penalty = nb.flagged, nb.late_submission_penalty
            for g in nb.grades:
                row = gb.find_grade(g.name, nb.name, graded.lesson, graded.student)
                row.auto_score, row.manual_score = g.auto_score, g.manual_score
                row.extra_credit, row.needs_manual_grade = g.extra_credit, g.needs_manual_grade
            for c in nb.comments:
                row = gb.find_comment(c.name, nb.name, graded.lesson, graded.student)
                row.auto_comment, row.manual_comment = c.auto_comment, c.manual_comment
        gb.db.commit()
    for kind in ("autograded", "feedback"):
        made = work / kind / graded.student / graded.lesson
        target = WORK / kind / graded.student / graded.lesson
        if target.exists():
            shutil.rmtree(target)
        if made.exists():
            shutil.copytree(made, target)


def _previous() -> dict[tuple[str, str], dict[str, Any]]:
    """The last run's record of each submission, by (student, lesson)."""
    try:
        record = json.loads(RECORD.read_text())
    except (OSError, ValueError):
        return {}
    return {(r["student"], r["lesson"]): r for r in record.get("submissions", [])}


def _graded_already(tasks: list[tuple[str, str]]) -> set[tuple[str, str]]:
    """Which of ``tasks`` the gradebook holds a graded submission of, that the last run did not mark failed."""
    from nbgrader.api import Gradebook, MissingEntry

    before = _previous()
    done = set()
    with Gradebook(f"sqlite:///{WORK / 'gradebook.db'}") as gb:
        for student, lesson in tasks:
            try:
                sub = gb.find_submission(lesson, student)
            except MissingEntry:
                continue
            last = before.get((student, lesson))
            if (last is None or last.get("status") == "ok") and all(
                    g.auto_score is not None for nb in sub.notebooks for g in nb.grades):
                done.add((student, lesson))
    return done


def _write_log(graded: Graded) -> str:
    path = LOGS / graded.student / f"{graded.lesson}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = "a" if graded.attempt > 1 else "w"
    with path.open(mode) as f:
        f.write(graded.log)
    return str(path.relative_to(ROOT))


def _pool(jobs: int) -> ProcessPoolExecutor:
    # Fresh interpreters (spawn), not forks of this process, with nbgrader imported once each.
    return ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"), initializer=warm_up)


def _run(tasks: list[Task], jobs: int, done: Any) -> list[Task]:
    """Grade ``tasks`` on ``jobs`` worker processes; ``done(graded, retried)`` gets each final result.

    A submission whose grading failed for a reason that is not the learner's is graded
    again, up to :data:`~autograder.grading.task.TRIES` times; a worker that died costs the
    submissions it held one try each. Returns the tasks left unfinished by Ctrl-C.
    """
    queue, retried = list(tasks), {}
    pool = _pool(jobs)
    running: dict[Future, Task] = {}
    try:
        while queue or running:
            while queue and len(running) < jobs * 2:  # a few ahead, so no worker waits for the next
                task = queue.pop(0)
                running[pool.submit(grade_submission, task)] = task
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            broken = False
            for future in finished:
                task = running.pop(future)
                try:
                    graded = future.result()
                except BrokenProcessPool:
                    broken = True
                    graded = Graded(task.student, task.lesson, "", attempt=task.attempt, failure="infrastructure",
                                    error="the grading worker process died", log="== the grading worker process died\n")
                if graded.failure == "infrastructure" and task.attempt < TRIES:
                    retried.setdefault((task.student, task.lesson), []).append(graded.error)
                    _write_log(graded)
                    if graded.folder:
                        shutil.rmtree(graded.folder, ignore_errors=True)
                    print(f"  {task.student}/{task.lesson}: grading failed ({graded.error}); trying once more",
                          flush=True)
                    queue.append(replace(task, attempt=task.attempt + 1))
                    continue
                done(graded, retried.get((task.student, task.lesson), []))
            if broken:  # every submission it held has been answered above; start afresh
                pool.shutdown(wait=False, cancel_futures=True)
                pool = _pool(jobs)
        return []
    except KeyboardInterrupt:
        left = list(running.values()) + queue
        for future in running:
            future.cancel()
        return left
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


# -- the class ------------------------------------------------------------------------------


def grade(source: Path, jobs: int | None = None, sandboxed: bool = True, only_ungraded: bool = False) -> dict[str, Any]:
    """The whole workflow; returns the run's record, also written to autograder/grading-run.json.

    ``jobs`` submissions are graded at a time (default: the number of cores); ``sandboxed``
    False runs learners' code without the sandbox (the summary then says so);
    ``only_ungraded`` grades only what has no grade yet. Raises
    :class:`autograder.grading.sandbox.SandboxUnavailable` when a sandbox is asked for and cannot run.
    """
    os.environ["HELPERS_PRESTART"] = "0"  # this process starts no ranks
    os.environ.update(tool_env())  # nbgrader runs `alembic` by name: the venv's bin folder goes on PATH
    quiet_gradebook()
    if sandboxed:
        from .sandbox import require

        require()
    jobs = max(1, jobs or os.cpu_count() or 1)
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    started = time.monotonic()
    _record_lessons(lessons())
    found = collect(source)
    grades = WORK / "grades.csv"
    record: dict[str, Any] = {"started": started_at, "seconds": 0.0, "source": str(source), "jobs": jobs,
                              "sandbox": sandboxed, "grades_csv": str(grades.relative_to(ROOT)), "submissions": []}
    if not found:
        print(f"No submissions found under {source} (expected <student>/<lesson>/<lesson>.ipynb).")
        RECORD.write_text(json.dumps(record, indent=2) + "\n")
        return record
    pairs = [(student, lesson) for lesson, students in sorted(found.items()) for student in students]
    kept: dict[tuple[str, str], dict[str, Any]] = {}
    if only_ungraded:
        already = _graded_already(pairs)
        before = _previous()
        kept = {key: before[key] for key in already if key in before}
        pairs = [key for key in pairs if key not in already]
        print(f"{len(already)} submission{'s' if len(already) != 1 else ''} already graded, kept as they are.")
    print(f"Grading {len(pairs)} submission{'s' if len(pairs) != 1 else ''}, {jobs} at a time, "
          + ("each in a sandbox." if sandboxed else "WITHOUT a sandbox (--no-sandbox): learners' code runs with your rights."),
          flush=True)
    runs = record["submissions"]
    with tempfile.TemporaryDirectory() as scratch:
        template = Path(scratch) / "gradebook.db"
        shutil.copy2(WORK / "gradebook.db", template)
        tasks = [Task(student, lesson, WORK / "submitted" / student / lesson, ROOT, template, sandboxed)
                 for student, lesson in pairs]

        def done(graded: Graded, retried: list[str]) -> None:
            run = graded.record()
            run["retried_because"] = retried
            try:
                if graded.status == "ok":
                    _merge(graded)
            except Exception as exc:  # noqa: BLE001 - report, carry on with the class
                run["status"], run["failure"] = "failed", "infrastructure"
                run["error"] = f"merging into the gradebook: {type(exc).__name__}: {exc}"
                graded.log += f"== {run['error']}\n"
            finally:
                run["log"] = _write_log(graded)
                if graded.folder:
                    shutil.rmtree(graded.folder, ignore_errors=True)
            runs.append(run)
            note = f" after {graded.attempt} tries" if graded.attempt > 1 else ""
            state = "ok" if run["status"] == "ok" else f"FAILED ({run['failure']}: {run['error']})"
            print(f"  autograded {run['student']}/{run['lesson']} in {run['seconds']:.1f} s{note}: {state}", flush=True)

        left = _run(tasks, jobs, done)
    runs.extend(r for key, r in kept.items())
    runs.sort(key=lambda r: (r["lesson"], r["student"]))
    _export(grades)
    scores = _scores(grades)
    for run in runs:
        if run["status"] == "ok" and (run["student"], run["lesson"]) in scores:
            run["score"], run["max_score"] = scores[(run["student"], run["lesson"])]
    record["seconds"] = round(time.monotonic() - started, 2)
    record["not_graded"] = [f"{t.student}/{t.lesson}" for t in left]
    RECORD.write_text(json.dumps(record, indent=2) + "\n")

    from .summary import summarise

    summary = summarise(record, WORK)
    print(f"\nGrades: {grades.relative_to(ROOT)}    Feedback: autograder/feedback/<student>/<lesson>/    "
          f"Logs: {LOGS.relative_to(ROOT)}/<student>/<lesson>.log    This run: {RECORD.relative_to(ROOT)}")
    for (student, lesson), (score, max_score) in scores.items():
        print(f"  {student:<16} {lesson:<24} {score if score is not None else '-':>6} / "
              f"{max_score if max_score is not None else '-'}")
    print("\n" + summary)
    if left:
        were = "submissions were" if len(left) != 1 else "submission was"
        print(f"\nStopped before {len(left)} {were} graded: " + ", ".join(record["not_graded"]) + ".\n"
              "To grade only those, run the same command with --only-ungraded (make grade ... ONLY_UNGRADED=1).")
    return record


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder grade",
                                     description="Autograde every <student>/<lesson>/<lesson>.ipynb in FOLDER.")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--jobs", type=int, default=None,
                        help="submissions graded at a time (default: the number of cores)")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="run learners' code without the bubblewrap sandbox (it then runs with your rights)")
    parser.add_argument("--only-ungraded", action="store_true",
                        help="grade only the submissions that have no grade yet (never graded, or failed last "
                             "time); keep every other grade as it is")
    args = parser.parse_args(argv)
    source = args.folder.resolve()
    if not source.is_dir():
        print(f"{source} is not a folder")
        return 2
    if args.jobs is not None and args.jobs < 1:
        print(f"--jobs must be 1 or more (got {args.jobs})")
        return 2
    from .sandbox import SandboxUnavailable

    try:
        record = grade(source, jobs=args.jobs, sandboxed=not args.no_sandbox, only_ungraded=args.only_ungraded)
    except SandboxUnavailable as exc:
        print(exc, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    if record.get("not_graded"):
        return 130
    return 1 if any(run["status"] != "ok" for run in record["submissions"]) else 0
