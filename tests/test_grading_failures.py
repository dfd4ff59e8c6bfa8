"""When grading a submission fails: is it graded anyway, tried again, or reported with its reason?

Each test grades a small class of lesson 00 (the cheapest lesson) with the instructor's
command in a throw-away copy of the course, and makes one thing go wrong on purpose:

- the sandbox cannot be set up for one learner's kernel, once (a stand-in for bubblewrap
  that fails the first time, with bubblewrap's own words) or every time;
- a learner's notebook kills its own kernel halfway through;
- a learner hands in a file that is not a notebook, or another lesson's notebook under this one's name.
"""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.scratch import course_copy, sandbox_flags, solution_source, submission
from autograder.notebooks.generate import tool_env

LESSON = "00-getting-started"
ROOT = Path(__file__).resolve().parent.parent
SOLUTION = "the instructor's answer"
needs_sandbox = pytest.mark.skipif(bool(sandbox_flags()), reason="bubblewrap cannot run here: these tests stand in for it")


def _class(folder: Path, learners: dict[str, str | None]) -> Path:
    """A course copy at folder/course and one lesson-00 notebook per learner: the answer's source, SOLUTION for
    the instructor's, or None for the untouched stub."""
    root = course_copy(folder / "course", lessons=[LESSON])
    release = root / "course" / LESSON / f"{LESSON}.ipynb"
    cells = json.loads(release.read_text())["cells"]
    answer = next(c["metadata"]["nbgrader"]["grade_id"] for c in cells
                  if c.get("metadata", {}).get("nbgrader", {}).get("solution"))
    for who, source in learners.items():
        source = solution_source(LESSON, answer) if source is SOLUTION else source
        submission(release, folder / "submissions" / who / LESSON / f"{LESSON}.ipynb",
                   {answer: source} if source is not None else None)
    return root


def _grade(root: Path, submissions: Path, *extra: str, env: dict[str, str] | None = None
           ) -> tuple[subprocess.CompletedProcess, dict]:
    run_env = {**tool_env(), "COURSE_ROOT": str(root), **(env or {})}
    done = subprocess.run([sys.executable, "-m", "autograder", "grade", str(submissions), "--jobs", "2", *extra,
                           *sandbox_flags()], cwd=root, env=run_env, capture_output=True, text=True, timeout=900)
    record = json.loads((root / "autograder" / "grading-run.json").read_text())
    return done, record


def _failing_bwrap(folder: Path, times: int, who: str = "") -> Path:
    """A stand-in for bwrap that refuses to start the sandbox of a kernel (of learner ``who`` only, when given)
    ``times`` times per learner (-1: always), saying what bubblewrap says when a file it must bind has gone;
    every other call runs the real bwrap."""
    real = shutil.which("bwrap")
    folder.mkdir(exist_ok=True)
    script = folder / "bwrap"
    script.write_text(f"""#!/bin/sh
case "$*" in
  *autograded/{who}*ipykernel_launcher*)
    work=$(printf '%s\\n' "$@" | grep -m1 -o '/tmp/course-grading-[^/]*' || true)
    count="{folder}/count-$(printf '%s' "$*" | grep -o 'autograded/[^/]*' | head -n1 | cut -d/ -f2)"
    n=$(cat "$count" 2>/dev/null || echo 0); echo $((n + 1)) > "$count"
    if [ {times} -lt 0 ] || [ "$n" -lt {times} ]; then
      echo "bwrap: Can't create file at $work/autograder/gradebook.db-journal: Read-only file system" >&2
      exit 1
    fi ;;
esac
exec {real} "$@"
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


@pytest.mark.slow
@needs_sandbox
def test_a_sandbox_that_fails_once_is_tried_again_and_one_that_always_fails_is_reported(tmp_path):
    """Is a learner whose sandbox could not be set up once graded on the second try, with the reason kept; is
    one whose sandbox never starts reported as the grading machinery's failure with bubblewrap's own line and
    a log, not the learner's; and does --only-ungraded then grade only that one, keeping the other grades?"""
    root = _class(tmp_path, {"ana": None, "bo": SOLUTION})
    flaky = _failing_bwrap(tmp_path / "once", 1)
    done, record = _grade(root, tmp_path / "submissions", env={"COURSE_BWRAP": str(flaky)})
    runs = {r["student"]: r for r in record["submissions"]}
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for who in ("ana", "bo"):
        assert runs[who]["status"] == "ok" and runs[who]["tries"] == 2, runs[who]
        assert "Read-only file system" in runs[who]["retried_because"][0], runs[who]
    assert (runs["ana"]["score"], runs["bo"]["score"]) == (0.0, 1.0)
    log = (root / runs["ana"]["log"]).read_text()
    assert "try 1" in log and "try 2" in log and "bwrap: Can't create file" in log, log[-2000:]

    # Graded again, bo's sandbox never starts: the run says so, with bwrap's line and the log; the others are graded.
    broken = _failing_bwrap(tmp_path / "always", -1, who="bo")
    done, record = _grade(root, tmp_path / "submissions", env={"COURSE_BWRAP": str(broken)})
    assert done.returncode == 1, done.stdout[-3000:]
    runs = {r["student"]: r for r in record["submissions"]}
    bo = runs["bo"]
    assert (bo["status"], bo["failure"], bo["tries"]) == ("failed", "infrastructure", 2), bo
    assert bo["error"].startswith("bwrap: Can't create file at") and "gradebook.db-journal" in bo["error"], bo
    assert "the grading machinery's failure after 2 tries: bwrap: Can't create file" in done.stdout, done.stdout[-3000:]
    assert (root / bo["log"]).is_file() and runs["ana"]["status"] == "ok"

    # The same command with --only-ungraded and a working sandbox grades bo alone (the instructor's answer: full
    # marks, so graded, not merely listed); ana keeps her grade.
    done, record = _grade(root, tmp_path / "submissions", "--only-ungraded")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1 submission already graded, kept as it is" in done.stdout and "Grading 1 submission," in done.stdout
    runs = {r["student"]: r for r in record["submissions"]}
    assert (runs["ana"]["score"], runs["bo"]["score"]) == (0.0, 1.0), runs
    assert runs["bo"]["status"] == "ok" and runs["bo"]["tries"] == 1
    # One submission to grade starts one worker process, not the two asked for (each costs seconds to start).
    assert record["jobs"] == 1 and "1 at a time" in done.stdout, (record["jobs"], done.stdout[-3000:])


KILLS_ITS_KERNEL = '''def hello(rank, world_size):
    return f"rank {rank} of {world_size}"

import os
os._exit(3)   # the notebook's own kernel ends here
'''


@pytest.mark.slow
def test_a_kernel_that_dies_midway_is_graded_from_its_code_and_an_unreadable_file_is_named(tmp_path):
    """Does a notebook that kills its own kernel still get its graded part decided (from its code, in a fresh
    process), with a note saying the kernel died; and is a file that is not a notebook reported as the
    learner's failure, once, without a second try; and so is another lesson's notebook handed in under this one's
    name?"""
    root = _class(tmp_path, {"dee": KILLS_ITS_KERNEL, "eve": None, "fay": None})
    (tmp_path / "submissions" / "eve" / LESSON / f"{LESSON}.ipynb").write_text("{ this is not JSON")
    other = "01-processes-and-ranks"
    shutil.copy(ROOT / "course" / other / f"{other}.ipynb", tmp_path / "submissions" / "fay" / LESSON / f"{LESSON}.ipynb")
    # --only-ungraded on a course never graded (no gradebook yet) grades every submission.
    done, record = _grade(root, tmp_path / "submissions", "--only-ungraded")
    assert "0 submissions already graded" in done.stdout, done.stdout[-3000:]
    runs = {r["student"]: r for r in record["submissions"]}
    dee, eve = runs["dee"], runs["eve"]
    assert dee["status"] == "ok" and dee["score"] == 1.0 and dee["tries"] == 1, dee
    assert "kernel died" in dee["notes"][0], dee
    feedback = (root / "autograder" / "feedback" / "dee" / LESSON / f"{LESSON}.html").read_text()
    assert "kernel died" in feedback and "passed (1 of 1 point)" in feedback
    assert (eve["status"], eve["failure"], eve["tries"]) == ("failed", "learner", 1), eve
    assert "the notebook file cannot be read" in eve["error"], eve
    fay = runs["fay"]
    assert (fay["status"], fay["failure"], fay["tries"]) == ("failed", "learner", 1), fay
    assert f"the notebook handed in as {LESSON} is another lesson's" in fay["error"] and "ex1_" in fay["error"], fay
    assert "the learner's failure after 1 try" in done.stdout and done.returncode == 1, done.stdout[-3000:]
