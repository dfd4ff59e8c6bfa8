"""Grade a class: collect learners' notebooks, autograde them in sandboxes, in parallel, and summarise.

Run from the repository root::

    python -m autograder grade path/to/submissions [--jobs N] [--no-sandbox]
    make grade SUBMISSIONS=path [JOBS=N] [NO_SANDBOX=1]

``path/to/submissions`` holds one folder per learner, each with the lessons they hand in
as ``<student>/<lesson>/<lesson>.ipynb`` (the layout the course's Submit button and a
download from Colab both give, once placed in a folder named after the learner).

Steps, each a standard nbgrader command underneath:

1. record every lesson in the gradebook (``generate_assignment`` into a scratch folder,
   so course/ is left as it is);
2. copy the submissions into ``autograder/submitted/`` (collect);
3. grade every submission on its own, ``--jobs`` of them at a time (default: one per
   core), each in a private work folder with its own copy of the gradebook:

   a. ``nbgrader autograde``: runs the notebook in a fresh kernel *inside the grading
      sandbox* (:mod:`autograder.sandbox`: it sees no gradebook, no other submission, no
      solutions, no home folder, and can write only its own working copy), restores
      edited or deleted test cells and scores each test cell;
   b. the clean re-grade (:mod:`autograder.clean`, in a sandbox too): every graded part
      is decided again in a fresh process holding only the learner's definitions, so
      nothing the notebook did to its own kernel counts. Where the two disagree, the
      clean score is the one recorded, and the part's cell in the feedback says why;
   c. ``nbgrader generate_feedback``: one HTML page per learner and lesson;

4. merge each finished submission into ``autograder/gradebook.db`` and its notebook and
   feedback into ``autograder/autograded/`` and ``autograder/feedback/`` (only this
   process writes the shared gradebook, one submission at a time);
5. ``nbgrader export``: all grades as CSV in ``autograder/grades.csv``;
6. the class summary (:mod:`autograder.summary`): per lesson and part, how many passed,
   the most common failures and the slowest submissions, printed and written to
   ``autograder/class-summary.csv`` and ``.html``;
7. a record of this run in ``autograder/grading-run.json``.

One broken submission never stops the others: each is graded on its own, a failure is
logged and reported at the end, and the rest carry on.

The record looks like this (seconds are each submission's wall time, all steps)::

    {"started": "2026-11-22T10:00:00+00:00", "seconds": 41.2, "jobs": 2, "sandbox": true,
     "grades_csv": "autograder/grades.csv",
     "submissions": [{"student": "alice", "lesson": "04-ring-all-reduce", "seconds": 17.0,
                      "stages": {"autograde": 11.2, "clean": 4.1, "feedback": 1.7},
                      "status": "ok", "score": 10.0, "max_score": 10.0, "error": null,
                      "parts": [{"grade_id": "...", "exercise": "4.4", "part": "correct", "points": 4,
                                 "kernel_score": 4.0, "score": 4, "message": null}],
                      "left_out": []}]}
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .course import ROOT, lessons, tool_env

__all__ = ["collect", "grade", "main", "RECORD", "CLEAN_TIMEOUT"]

WORK = ROOT / "autograder"
RECORD = WORK / "grading-run.json"  # git-ignored, like grades.csv: it holds learners' scores
#: Seconds the clean re-grade of one submission may take before its unfinished parts score 0.
CLEAN_TIMEOUT = float(os.environ.get("COURSE_CLEAN_TIMEOUT", "600"))
#: The heading of the note a part's cell gets in the feedback when the clean re-grade disagreed.
CLEAN_NOTE = "Clean re-grade"


def _nbgrader(*args: str, check: bool = True, cwd: Path = ROOT, env: dict[str, str] | None = None
              ) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "nbgrader", *args, "--log-level=WARN"]
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env or tool_env())
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


# -- one submission, in its own work folder ------------------------------------------------


class _Job:
    """One learner's lesson, graded in a private copy of the course's nbgrader setup."""

    def __init__(self, student: str, lesson: str, template: Path, sandboxed: bool) -> None:
        self.student, self.lesson, self.sandboxed = student, lesson, sandboxed
        self.folder = Path(tempfile.mkdtemp(prefix="course-grading-"))
        self.work = self.folder / "autograder"
        self.work.mkdir()
        shutil.copy2(ROOT / "nbgrader_config.py", self.folder / "nbgrader_config.py")
        (self.folder / "solutions").symlink_to(ROOT / "solutions")
        shutil.copy2(template, self.work / "gradebook.db")
        shutil.copytree(WORK / "submitted" / student / lesson, self.work / "submitted" / student / lesson)
        self.autograded = self.work / "autograded" / student / lesson
        self.feedback = self.work / "feedback" / student / lesson
        self.env = tool_env()
        self.env.pop("COURSE_ROOT", None)  # nbgrader reads this folder's nbgrader_config.py

    @property
    def notebook(self) -> Path:
        return self.autograded / f"{self.lesson}.ipynb"

    def _box(self, writable: list[Path], env: dict[str, str] | None = None):
        from .sandbox import Sandbox

        return Sandbox(writable=writable, hidden=[ROOT, self.folder], env=env or {})

    def autograde(self) -> subprocess.CompletedProcess:
        """``nbgrader autograde`` here, with the kernel in the sandbox (talking over Unix sockets)."""
        env, extra = dict(self.env), []
        if self.sandboxed:
            from .sandbox import kernel_spec

            runtime = self.folder / "runtime"
            runtime.mkdir()
            self.autograded.mkdir(parents=True)
            # The sandbox's environment is fixed when the spec is written: nbgrader's own marker
            # (set only while it runs) goes in here, so launches keep their grading timeouts.
            kernel_spec(self.folder / "jupyter", self._box([self.autograded, runtime], {"NBGRADER_EXECUTION": "autograde"}))
            env["JUPYTER_PATH"] = os.pathsep.join(p for p in (str(self.folder / "jupyter"), env.get("JUPYTER_PATH")) if p)
            # The connection file goes where the sandbox can read it (jupyter_client makes it with mkstemp).
            env["JUPYTER_RUNTIME_DIR"] = env["TMPDIR"] = str(runtime)
            extra = ["--KernelManager.transport=ipc", f"--KernelManager.ip={runtime / 'kernel'}"]
        return _nbgrader("autograde", self.lesson, "--create", "--force", f"--student={self.student}", *extra,
                         check=False, cwd=self.folder, env=env)

    def clean(self) -> tuple[list[dict[str, Any]], list[str], str | None]:
        """The clean re-grade: (one result per part, what was left out, why it stopped early or None)."""
        from .cells import lesson_number

        folder = self.folder / "clean"
        folder.mkdir()
        copy = shutil.copy2(self.notebook, folder / "submission.ipynb")
        argv = [sys.executable, "-m", "autograder.clean", str(copy), str(lesson_number(self.notebook))]
        if self.sandboxed:
            argv = self._box([folder]).wrap(argv)
        env = dict(self.env, PYTHONUNBUFFERED="1")
        try:
            done = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=CLEAN_TIMEOUT)
            out, stopped = done.stdout, None if done.returncode == 0 else (
                f"it exited with code {done.returncode}: {(done.stderr.strip().splitlines() or ['no message'])[-1]}")
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            stopped = f"it did not finish within {CLEAN_TIMEOUT:g} s and was stopped"
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        left_out = next((line["left_out"] for line in lines if "left_out" in line), [])
        return [line for line in lines if "part" in line], left_out, stopped

    def feedback_html(self) -> subprocess.CompletedProcess:
        return _nbgrader("generate_feedback", self.lesson, "--force", f"--student={self.student}",
                         check=False, cwd=self.folder, env=self.env)

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _settle(job: _Job, results: list[dict[str, Any]], left_out: list[str], stopped: str | None) -> list[dict[str, Any]]:
    """Record the clean scores in the job's gradebook; note every disagreement in the notebook's cell."""
    import nbformat
    from nbgrader.api import Gradebook

    from .cells import graded_cells

    cells = {c.grade_id: c for c in graded_cells(ROOT / "solutions" / job.lesson / f"{job.lesson}.ipynb")}
    clean = {(r["exercise"], r["part"]): r for r in results}
    nb = nbformat.read(job.notebook, as_version=4)
    by_id = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in nb.cells}
    parts = []
    with Gradebook(f"sqlite:///{job.work / 'gradebook.db'}") as gb:
        for grade_id, cell in cells.items():
            if cell.part is None:
                continue
            grade = gb.find_grade(grade_id, job.lesson, job.lesson, job.student)
            kernel = grade.auto_score
            result = clean.get((cell.number, cell.part)) or {
                "points": cell.points, "score": 0,
                "message": f"{cell.part}: the clean re-grade did not reach this part ({stopped or 'no result'})."}
            score = float(result["score"])
            parts.append({"grade_id": grade_id, "exercise": cell.number, "part": cell.part, "points": cell.points,
                          "kernel_score": kernel, "score": score, "message": result.get("message"),
                          "check_error": bool(result.get("check_error"))})
            if kernel is None or abs(kernel - score) > 1e-9:
                grade.auto_score = score
                target = by_id.get(grade_id)
                if target is not None:
                    target.outputs.append(nbformat.v4.new_output(
                        "stream", name="stdout", text=_disagreement(kernel, score, cell.points, result, left_out)))
        gb.db.commit()
    nbformat.write(nb, job.notebook)
    return parts


def _disagreement(kernel: float | None, score: float, points: float | None, result: dict, left_out: list[str]) -> str:
    """The note a part's cell gets when its clean score differs from what the kernel gave."""
    was = "passed" if kernel else "did not pass"
    text = (f"\n{CLEAN_NOTE}: {score:g} of {points:g} points. This test {was} in your notebook's kernel, but the "
            "grade comes from running it again in a fresh process that holds only your exercise code (the imports, "
            "functions, classes and constants of your cells, without anything else your cells did)")
    text += f", where it failed:\n{result['message']}\n" if result.get("message") else ", where it passed.\n"
    if left_out:
        shown = "\n".join(f"  {line}" for line in left_out[:8])
        more = f"\n  ... and {len(left_out) - 8} more" if len(left_out) > 8 else ""
        text += f"Left out of the clean run:\n{shown}{more}\n"
    return text + "The clean result is the one that counts.\n"


def _grade_one(student: str, lesson: str, template: Path, sandboxed: bool) -> tuple[dict[str, Any], _Job]:
    """Autograde, re-grade cleanly and write the feedback of one submission, in its own folder."""
    job = _Job(student, lesson, template, sandboxed)
    began = time.monotonic()
    run: dict[str, Any] = {"student": student, "lesson": lesson, "seconds": 0.0, "status": "failed",
                           "score": None, "max_score": None, "error": None, "parts": [], "left_out": []}
    stages = run["stages"] = {}
    try:
        done = job.autograde()
        stages["autograde"] = round(time.monotonic() - began, 2)
        if done.returncode != 0 or not job.notebook.is_file():
            run["error"] = (done.stderr.strip().splitlines()[-1:] or [done.stdout[-200:] or "no message"])[0]
            return run, job
        results, left_out, stopped = job.clean()
        stages["clean"] = round(time.monotonic() - began - stages["autograde"], 2)
        run["parts"], run["left_out"] = _settle(job, results, left_out, stopped), left_out
        made = job.feedback_html()
        stages["feedback"] = round(time.monotonic() - began - stages["autograde"] - stages["clean"], 2)
        run["status"] = "ok"
        if made.returncode != 0:
            run["error"] = "feedback: " + (made.stderr.strip().splitlines()[-1:] or ["failed"])[0]
    except Exception as exc:  # noqa: BLE001 - one broken submission must not stop the class
        run["error"] = f"{type(exc).__name__}: {exc}"
        run["status"] = "failed"
    finally:
        run["seconds"] = round(time.monotonic() - began, 2)
    return run, job


def _merge(job: _Job) -> None:
    """Copy a graded submission into the course: gradebook rows, autograded notebook, feedback."""
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(f"sqlite:///{WORK / 'gradebook.db'}") as gb:  # an earlier grading of it goes first
        gb.update_or_create_student(job.student)
        try:
            gb.remove_submission(job.lesson, job.student)
        except MissingEntry:
            pass
    with Gradebook(f"sqlite:///{job.work / 'gradebook.db'}") as source, \
            Gradebook(f"sqlite:///{WORK / 'gradebook.db'}") as gb:
        sub = source.find_submission(job.lesson, job.student)
        gb.add_submission(job.lesson, job.student, timestamp=sub.timestamp, extension=sub.extension)
        for nb in sub.notebooks:
            target = gb.find_submission_notebook(nb.name, job.lesson, job.student)
            target.flagged, target.late_submission_penalty = nb.flagged, nb.late_submission_penalty
            for g in nb.grades:
                row = gb.find_grade(g.name, nb.name, job.lesson, job.student)
                row.auto_score, row.manual_score = g.auto_score, g.manual_score
                row.extra_credit, row.needs_manual_grade = g.extra_credit, g.needs_manual_grade
            for c in nb.comments:
                row = gb.find_comment(c.name, nb.name, job.lesson, job.student)
                row.auto_comment, row.manual_comment = c.auto_comment, c.manual_comment
        gb.db.commit()
    for kind in ("autograded", "feedback"):
        made = job.work / kind / job.student / job.lesson
        target = WORK / kind / job.student / job.lesson
        if target.exists():
            shutil.rmtree(target)
        if made.exists():
            shutil.copytree(made, target)


# -- the class ------------------------------------------------------------------------------


def grade(source: Path, jobs: int | None = None, sandboxed: bool = True) -> dict[str, Any]:
    """The whole workflow; returns the run's record, also written to autograder/grading-run.json.

    ``jobs`` submissions are graded at a time (default: the number of cores); ``sandboxed``
    False runs learners' code without the sandbox (the summary then says so). Raises
    :class:`autograder.sandbox.SandboxUnavailable` when a sandbox is asked for and cannot run.
    """
    if sandboxed:
        from .sandbox import require

        require()
    jobs = max(1, jobs or os.cpu_count() or 1)
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        for lesson in lessons():
            _nbgrader("generate_assignment", lesson, "--force", f"--CourseDirectory.release_directory={scratch}")
    found = collect(source)
    grades = WORK / "grades.csv"
    record: dict[str, Any] = {"started": started_at, "seconds": 0.0, "source": str(source), "jobs": jobs,
                              "sandbox": sandboxed, "grades_csv": str(grades.relative_to(ROOT)), "submissions": []}
    if not found:
        print(f"No submissions found under {source} (expected <student>/<lesson>/<lesson>.ipynb).")
        RECORD.write_text(json.dumps(record, indent=2) + "\n")
        return record
    tasks = [(student, lesson) for lesson, students in sorted(found.items()) for student in students]
    print(f"Grading {len(tasks)} submission{'s' if len(tasks) != 1 else ''}, {jobs} at a time, "
          + ("each in a sandbox." if sandboxed else "WITHOUT a sandbox (--no-sandbox): learners' code runs with your rights."))
    runs = record["submissions"]
    with tempfile.TemporaryDirectory() as scratch:
        template = Path(scratch) / "gradebook.db"
        shutil.copy2(WORK / "gradebook.db", template)
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(_grade_one, student, lesson, template, sandboxed) for student, lesson in tasks]
            for future in as_completed(futures):
                run, job = future.result()
                try:
                    if run["status"] == "ok":
                        _merge(job)
                except Exception as exc:  # noqa: BLE001 - report, carry on with the class
                    run["status"], run["error"] = "failed", f"merging into the gradebook: {type(exc).__name__}: {exc}"
                finally:
                    job.remove()
                runs.append(run)
                changed = sum(1 for p in run["parts"] if p["kernel_score"] is None or p["kernel_score"] != p["score"])
                note = f", the clean re-grade changed {changed} part{'s' if changed != 1 else ''}" if changed else ""
                print(f"  autograded {run['student']}/{run['lesson']} in {run['seconds']:.1f} s: "
                      f"{'ok' if run['status'] == 'ok' else 'FAILED'}{note}", flush=True)
    runs.sort(key=lambda r: (r["lesson"], r["student"]))
    _nbgrader("export", f"--to={grades}")
    scores = _scores(grades)
    for run in runs:
        if run["status"] == "ok" and (run["student"], run["lesson"]) in scores:
            run["score"], run["max_score"] = scores[(run["student"], run["lesson"])]
    record["seconds"] = round(time.monotonic() - started, 2)
    RECORD.write_text(json.dumps(record, indent=2) + "\n")

    from .summary import summarise

    summary = summarise(record, WORK)
    print(f"\nGrades: {grades.relative_to(ROOT)}    Feedback: autograder/feedback/<student>/<lesson>/    "
          f"This run: {RECORD.relative_to(ROOT)}")
    for (student, lesson), (score, max_score) in scores.items():
        print(f"  {student:<16} {lesson:<24} {score if score is not None else '-':>6} / "
              f"{max_score if max_score is not None else '-'}")
    print("\n" + summary)
    failures = [f"{r['student']}/{r['lesson']}: {r['error']}" for r in runs if r["status"] != "ok"]
    if failures:
        print("\nCould not grade (see nbgrader's log above):\n  " + "\n  ".join(failures))
    return record


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder grade",
                                     description="Autograde every <student>/<lesson>/<lesson>.ipynb in FOLDER.")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--jobs", type=int, default=None,
                        help="submissions graded at a time (default: the number of cores)")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="run learners' code without the bubblewrap sandbox (it then runs with your rights)")
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
        record = grade(source, jobs=args.jobs, sandboxed=not args.no_sandbox)
    except SandboxUnavailable as exc:
        print(exc, file=sys.stderr)
        return 2
    return 1 if any(run["status"] != "ok" for run in record["submissions"]) else 0
