"""Grade a class: collect learners' notebooks, autograde them in sandboxes, in parallel, and summarise.

Run from the repository root::

    python -m autograder grade path/to/submissions [--jobs N] [--no-sandbox] [--only-ungraded]
    python -m autograder grade path/to/submissions --scheduler tcp://host:8786   # on a running Dask cluster
    python -m autograder grade path/to/submissions --slurm jobs=4,partition=short [--dry-run]   # on SLURM jobs
    make grade SUBMISSIONS=path [JOBS=N] [SCHEDULER=tcp://host:8786] [SLURM=1|key=value,...] [NO_SANDBOX=1] [ONLY_UNGRADED=1]

``path/to/submissions`` holds one folder per learner, each with the lessons they hand in
as ``<student>/<lesson>/<lesson>.ipynb`` (the layout the course's Submit button and a
download from Colab both give, once placed in a folder named after the learner).

Steps:

1. record every lesson in the gradebook (nbgrader's ``generate_assignment``, into a
   scratch folder, so course/ is left as it is);
2. copy the submissions into ``autograder/submitted/`` (collect);
3. grade every submission on its own, on Dask workers (:mod:`autograder.grading.engine`): by
   default a ``LocalCluster`` of ``--jobs`` worker processes on this machine (default: one
   per core, at most one per submission to grade); with ``--scheduler`` the workers of a
   running Dask cluster; with ``--slurm`` workers started as SLURM jobs. Each worker keeps nbgrader loaded and grades one
   submission at a time, in a private work folder with its own copy of the gradebook
   (:mod:`autograder.grading.submission`: autograde in the grading sandbox, where the
   notebook runs; the clean re-grade, which decides every graded part in a fresh process;
   the feedback page). Each task carries what its worker needs as bytes (the lesson's
   nbgrader files and gradebook template, the learner's notebook) and its record brings
   back what the worker made, so workers need no folder of this machine. A submission
   that could not be graded for a reason that is not the learner's (the sandbox or the
   kernel did not start, its worker died) is graded once more;
4. merge each finished submission into ``autograder/gradebook.db`` and its notebook and
   feedback into ``autograder/autograded/`` and ``autograder/feedback/``
   (:mod:`autograder.grading.merge`: only this process writes the shared gradebook, one
   submission at a time), and keep its whole log in
   ``autograder/logs/<student>/<lesson>.log``;
5. export all grades as CSV to ``autograder/grades.csv``;
6. the class summary (:mod:`autograder.grading.summary`): per lesson and part, how many passed,
   the most common failures with a real example, the slowest submissions and those that
   could not be graded, printed and written to ``autograder/class-summary.csv`` and ``.html``;
7. a record of this run in ``autograder/grading-run.json``.

One broken submission never stops the others. ``--only-ungraded`` grades only the
submissions of the folder that have no grade yet (not graded, or failed last time), keeping
every other grade; Ctrl-C stops a run, keeps what was merged, and names what is left for it.

The record looks like this (seconds are each submission's wall time, all steps)::

    {"started": "2026-11-22T10:00:00+00:00", "seconds": 41.2, "jobs": 2, "workers": "this machine",
     "sandbox": true,
     "grades_csv": "autograder/grades.csv",
     "submissions": [{"student": "alice", "lesson": "04-ring-all-reduce", "seconds": 9.0, "tries": 1, "retried_because": [],
                      "stages": {"setup": 0.1, "autograde": 6.1, "kernel_start": 1.9, "clean": 6.5,
                                 "clean_after_kernel": 0.9, "settle": 0.1, "feedback": 0.6},
                      "cells": {"ran": 30, "seconds": 3.2, "first": 1.4, "slowest": [...]},
                      "status": "ok", "failure": null, "error": null, "notes": [],
                      "worker": "tcp://127.0.0.1:40233 (grader-1)",
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
import os
import shutil
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..notebooks.generate import build, lessons, nbgrader_api, tool_env
from ..notebooks.imports import alembic_head_in_process
from ..paths import ROOT
from .intake import collect
from .submission import quiet_gradebook
from .task import Files, Graded, Task, lesson_files, read_files

__all__ = ["collect", "grade", "main", "RECORD", "LOGS"]

WORK = ROOT / "autograder"
RECORD = WORK / "grading-run.json"  # git-ignored, like grades.csv: it holds learners' scores
#: Each submission's whole log: nbgrader's, the kernel's error output, the clean re-grade's.
LOGS = WORK / "logs"
#: What to install when the grading engine is missing.
ENGINE_MISSING = ("Grading runs on Dask, which is not installed in this environment: run `make venv` (it installs "
                  "the course's instructor extras), or `pip install -e '.[grading]'` from the repository root.")


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
    with path.open("a" if graded.attempt > 1 else "w") as f:
        f.write(graded.log)
    return str(path.relative_to(ROOT))


# -- the class ------------------------------------------------------------------------------


def _tasks(pairs: list[tuple[str, str]], template: Path, sandboxed: bool) -> list[Task]:
    """One task per (student, lesson), carrying its files; the lesson's files are read once and shared."""
    shared: dict[str, Files] = {}
    tasks = []
    for student, lesson in pairs:
        if lesson not in shared:
            shared[lesson] = lesson_files(ROOT, lesson, template)
        tasks.append(Task(student, lesson, shared[lesson], read_files(WORK / "submitted" / student / lesson),
                          sandboxed))
    return tasks


def grade(source: Path, jobs: int | None = None, sandboxed: bool = True, only_ungraded: bool = False,
          workers: Any = None) -> dict[str, Any]:
    """The whole workflow; returns the run's record, also written to autograder/grading-run.json.

    ``workers`` (:class:`autograder.grading.engine.Workers`) says where submissions are graded:
    by default ``jobs`` worker processes on this machine (default: the number of cores); or a
    Dask scheduler's workers, or SLURM jobs. ``sandboxed`` False runs learners' code without
    the sandbox (the summary then says so); ``only_ungraded`` grades only what has no grade
    yet. Raises :class:`autograder.grading.sandbox.SandboxUnavailable` when a sandbox is asked
    for and cannot run here, and :class:`autograder.grading.cluster.ClusterUnavailable` when a
    cluster cannot be reached or its workers must not grade.
    """
    try:
        from .engine import Connection, Workers
    except ImportError as exc:
        raise RuntimeError(f"{ENGINE_MISSING} ({exc})") from exc

    workers = workers or Workers()
    if workers.local:
        workers = Workers(jobs=max(1, workers.jobs or jobs or os.cpu_count() or 1))
    os.environ.update(tool_env())  # nbgrader runs `alembic` by name: the venv's bin folder goes on PATH
    alembic_head_in_process()  # ... but not to create a gradebook (autograder.notebooks.imports)
    quiet_gradebook()
    if sandboxed and workers.local:  # a cluster's workers are checked once they are connected
        from .bytecode import prepare
        from .sandbox import require

        require()
        prepare()  # the sandbox shows the packages read-only: their bytecode must be there before it starts
    started = time.monotonic()
    grades = WORK / "grades.csv"
    found = collect(source)
    pairs = [(student, lesson) for lesson, students in sorted(found.items()) for student in students]
    kept: dict[tuple[str, str], dict[str, Any]] = {}
    if only_ungraded and pairs:
        already = _graded_already(pairs)
        before = _previous()
        kept = {key: before[key] for key in already if key in before}
        pairs = [key for key in pairs if key not in already]
        print(f"{len(already)} submission{'s' if len(already) != 1 else ''} already graded, kept as "
              f"{'they are' if len(already) != 1 else 'it is'}.")
    if workers.local:  # no more worker processes than submissions to grade (each costs seconds to start)
        workers = Workers(jobs=max(1, min(workers.jobs, len(pairs))))
    record: dict[str, Any] = {"started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "seconds": 0.0,
                              "source": str(source), "jobs": workers.jobs, "workers": workers.describe(),
                              "sandbox": sandboxed, "grades_csv": str(grades.relative_to(ROOT)), "submissions": []}
    if not pairs:  # nothing to grade: no workers to start
        _record_lessons(lessons())
        if not found:
            print(f"No submissions found under {source} (expected <student>/<lesson>/<lesson>.ipynb).")
            RECORD.write_text(json.dumps(record, indent=2) + "\n")
            return record
        left: list[Task] = []
    else:
        with Connection(workers) as connection:  # the workers start while the lessons are recorded
            _record_lessons(lessons())
            left = _grade_pairs(pairs, record, workers, connection)
    record["submissions"].extend(r for key, r in kept.items())
    return _finish(record, left, started)


def _grade_pairs(pairs: list[tuple[str, str]], record: dict[str, Any], workers: Any, connection: Any) -> list[Task]:
    """Grade each (student, lesson) on the connection's workers, merging each into the course as it comes back;
    returns the tasks a Ctrl-C left."""
    from .cluster import check
    from .engine import run, start_line
    from .merge import merge
    from .progress import Progress

    runs = record["submissions"]

    def retry(graded: Graded) -> None:
        _write_log(graded)
        print(f"  {graded.student}/{graded.lesson}: grading failed ({graded.error}); trying once more", flush=True)

    def done(graded: Graded, retried: list[str]) -> None:
        run = graded.record()
        run["retried_because"] = retried
        try:
            if graded.status == "ok":
                merge(graded, WORK)
        except Exception as exc:  # noqa: BLE001 - report, carry on with the class
            run["status"], run["failure"] = "failed", "infrastructure"
            run["error"] = f"merging into the gradebook: {type(exc).__name__}: {exc}"
            graded.log += f"== {run['error']}\n"
        finally:
            run["log"] = _write_log(graded)
        runs.append(run)
        note = f" after {graded.attempt} tries" if graded.attempt > 1 else ""
        state = "ok" if run["status"] == "ok" else f"FAILED ({run['failure']}: {run['error']})"
        print(f"  autograded {run['student']}/{run['lesson']} in {run['seconds']:.1f} s{note}: {state}", flush=True)

    with tempfile.TemporaryDirectory() as scratch:
        template = Path(scratch) / "gradebook.db"
        shutil.copy2(WORK / "gradebook.db", template)
        tasks = _tasks(pairs, template, record["sandbox"])
    client = connection.client()
    if not workers.local:
        check(client, record["sandbox"], wait=workers.slurm is None)
    print(start_line(len(tasks), workers, client, record["sandbox"]), flush=True)
    progress = Progress(len(tasks))
    left = run(client, tasks, uuid.uuid4().hex, on_final=done, on_retry=retry, progress=progress)
    recorded = {(r["student"], r["lesson"]) for r in runs}  # a Ctrl-C just after one was merged: it is graded
    left = [task for task in left if (task.student, task.lesson) not in recorded]
    if not workers.local:
        record["jobs"] = progress.most_threads
    return left


def _finish(record: dict[str, Any], left: list[Task], started: float) -> dict[str, Any]:
    """Export the grades, write the run's record and the class summary, and print them."""
    from .summary import summarise

    grades = ROOT / record["grades_csv"]
    runs = record["submissions"]
    runs.sort(key=lambda r: (r["lesson"], r["student"]))
    _export(grades)
    scores = _scores(grades)
    for run in runs:
        if run["status"] == "ok" and (run["student"], run["lesson"]) in scores:
            run["score"], run["max_score"] = scores[(run["student"], run["lesson"])]
    record["seconds"] = round(time.monotonic() - started, 2)
    record["not_graded"] = [t.name for t in left]
    RECORD.write_text(json.dumps(record, indent=2) + "\n")
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
                        help="on this machine: submissions graded at a time (default: the number of cores)")
    parser.add_argument("--scheduler", metavar="ADDRESS",
                        help="grade on the workers of a running Dask cluster, e.g. tcp://host:8786")
    parser.add_argument("--slurm", nargs="?", const="", metavar="KEY=VALUE,...",
                        help="grade on Dask workers started as SLURM jobs (dask-jobqueue); settings: jobs=N, cores=N, "
                             "memory=16GB, walltime=01:00:00, partition=NAME, account=NAME, directive=OPTION")
    parser.add_argument("--dry-run", action="store_true",
                        help="with --slurm: print the job script it would submit, and stop")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="run learners' code without the bubblewrap sandbox (it then runs with your rights)")
    parser.add_argument("--only-ungraded", action="store_true",
                        help="grade only the submissions that have no grade yet (never graded, or failed last "
                             "time); keep every other grade as it is")
    args = parser.parse_args(argv)
    try:
        from .cluster import ClusterUnavailable
        from .engine import Workers
        from .slurm import Slurm, SlurmSettingsError
    except ImportError as exc:
        print(f"{ENGINE_MISSING} ({exc})", file=sys.stderr)
        return 2
    chosen = [flag for flag, value in (("--jobs", args.jobs), ("--scheduler", args.scheduler),
                                       ("--slurm", args.slurm)) if value is not None]
    if len(chosen) > 1:
        print(f"{' and '.join(chosen)} each say where to grade: give one of them", file=sys.stderr)
        return 2
    if args.jobs is not None and args.jobs < 1:
        print(f"--jobs must be 1 or more (got {args.jobs})", file=sys.stderr)
        return 2
    try:
        slurm = Slurm.parse(args.slurm) if args.slurm is not None else None
    except SlurmSettingsError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.dry_run:
        if slurm is None:
            print("--dry-run goes with --slurm: it prints the SLURM job script that would be submitted", file=sys.stderr)
            return 2
        print(f"# {slurm.describe()}; each job runs this script:\n{slurm.job_script()}")
        return 0
    source = args.folder.resolve()
    if not source.is_dir():
        print(f"{source} is not a folder")
        return 2
    from .onegrader import GradingBusy, grading_lock
    from .sandbox import SandboxUnavailable

    try:
        with grading_lock(WORK):  # one collect or grade of the course at a time (taken once with collect's)
            record = grade(source, sandboxed=not args.no_sandbox, only_ungraded=args.only_ungraded,
                           workers=Workers(jobs=args.jobs, scheduler=args.scheduler, slurm=slurm))
    except (SandboxUnavailable, ClusterUnavailable, GradingBusy) as exc:
        print(exc, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    if record.get("not_graded"):
        return 130
    return 1 if any(run["status"] != "ok" for run in record["submissions"]) else 0
