"""Grading a whole class: 30 mixed submissions of lesson 04, one at a time and in parallel.

Run: ``make bench-class`` or ``.venv/bin/python bench/class_bench.py [--learners 30] [--jobs 1,2] [--scheduler ADDRESS] [--json PATH]``

A throw-away copy of the course (devtools.scratch) receives ``--learners`` submissions
of lesson 04 (the ring all-reduce lesson), in equal shares of five kinds, all with the
instructor's answers to Exercises 4.1-4.3 and a different answer to Exercise 4.4:

- ``correct``: the instructor's ring;
- ``whole_tensor``: the tutorial ring that passes the whole tensor (right sums, too many bytes);
- ``deadlock``: every rank receives first;
- ``crash``: the last rank indexes past its chunks;
- ``cheat``: ``dist.all_reduce`` followed by lines that replace the course's grading
  functions in the learner's own kernel (``devtools.scratch.GRADER_PATCH``).

The class is graded with ``python -m autograder grade --jobs N``, the instructor's command
(sandboxed, with the clean re-grade, on a Dask ``LocalCluster`` of N worker processes), once
for every N in ``--jobs``, each time in a fresh copy; with ``--scheduler ADDRESS``, once more
on the workers of that running Dask cluster (``grade --scheduler ADDRESS``). A local one on
this machine, from the course's virtual environment::

    .venv/bin/dask scheduler --host 127.0.0.1 --port 8786 &
    .venv/bin/dask worker tcp://127.0.0.1:8786 --nthreads 1 --nworkers 2 &
    .venv/bin/python bench/class_bench.py --jobs 2 --scheduler tcp://127.0.0.1:8786

It prints the wall time of each run, the speed-up, the score of each kind, whether
every learner got the same score in every run, and what the cheat earned (its patch runs
in its own kernel, where no part is decided; the fresh process that decides leaves it out).
Last, a projection for 100 learners and all nine lessons on a 16-core machine, from this
run's seconds per submission and the per-lesson seconds of ``bench/grading_bench.py``
(the table under "Autograding one learner's submission" in bench/README.md), stated with its assumptions.

Target on 2 cores (issue 24): the 30 learners in at most 5 minutes with ``--jobs 2``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _common import machine_line  # noqa: E402
from grading_bench import _solution_answers  # noqa: E402

from devtools.scratch import GRADER_PATCH, RING_ANSWERS, course_copy, run_instructor_command, submission  # noqa: E402

LESSON = "04-ring-all-reduce"
KINDS = ("correct", "whole_tensor", "deadlock", "crash", "cheat")
#: Seconds one solution submission of each lesson takes to grade, all stages, alone (--jobs 1) on the
#: course's 2-core reference machine, for the projection (bench/README.md, "Autograding one learner's submission").
LESSON_SECONDS = {"00": 4.8, "01": 8.8, "02": 11.1, "03": 10.4, "04": 9.9, "05": 10.9, "06": 10.6, "07": 17.6,
                  "08": 5.4}
#: The most a class of 30 may take with --jobs 2, in seconds.
TARGET = 300.0


def _answers(kind: str, solution: dict[str, str]) -> dict[str, str]:
    ring = next(g for g, src in solution.items() if "def ring_allreduce" in src)
    if kind == "correct":
        return solution
    source = {"deadlock": RING_ANSWERS["receive_first"], "cheat": RING_ANSWERS["built_in"] + GRADER_PATCH}.get(
        kind) or RING_ANSWERS[kind]
    return {**solution, ring: source}


def _grade(learners: int, where: list[str], tmp: Path) -> dict:
    """Grade the class in a fresh copy of the course, on ``where`` (``["--jobs", "2"]``, ``["--scheduler", ADDRESS]``)."""
    label = " ".join(where)
    name = "".join(c if c.isalnum() else "-" for c in label)
    root = course_copy(tmp / f"course{name}", lessons=[LESSON])
    subs = tmp / f"submissions{name}"
    release = root / "course" / LESSON / f"{LESSON}.ipynb"
    solution = _solution_answers(LESSON, release)
    for i in range(learners):
        kind = KINDS[i % len(KINDS)]
        submission(release, subs / f"{kind}-{i:02d}" / LESSON / f"{LESSON}.ipynb", _answers(kind, solution))
    began = time.monotonic()
    done = run_instructor_command(root, "grade", str(subs), *where, timeout=4 * 3600)
    seconds = time.monotonic() - began
    if done.returncode != 0:
        raise SystemExit(f"grading with {label} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    record = json.loads((root / "autograder" / "grading-run.json").read_text())
    with (root / "autograder" / "grades.csv").open() as f:
        scores = {row["student_id"]: float(row["score"]) for row in csv.DictReader(f)}
    # "jobs": submissions graded at a time (a cluster's: its worker threads, as the run's record says).
    return {"label": label, "jobs": int(record["jobs"]), "workers": record["workers"], "seconds": seconds,
            "scores": scores, "record": record}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learners", type=int, default=30)
    parser.add_argument("--jobs", default="1,2", help="comma-separated --jobs values to compare ('' for none)")
    parser.add_argument("--scheduler", metavar="ADDRESS",
                        help="also grade the class on the workers of this running Dask cluster, e.g. tcp://127.0.0.1:8786")
    parser.add_argument("--json", help="write the numbers to this file")
    args = parser.parse_args()
    places = [["--jobs", j.strip()] for j in args.jobs.split(",") if j.strip()]
    places += [["--scheduler", args.scheduler]] if args.scheduler else []
    if not places:
        parser.error("nothing to grade on: give --jobs values, --scheduler, or both")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for where in places:
            runs.append(_grade(args.learners, where, Path(tmp)))
            print(f"graded {args.learners} submissions with {runs[-1]['label']} in {runs[-1]['seconds']:.0f} s",
                  flush=True)

    print(f"\nGrading a class of {args.learners} lesson-04 submissions; machine: {machine_line()}\n")
    base = runs[0]
    width = max(len(run["label"]) for run in runs)
    for run in runs:
        per = run["seconds"] / args.learners
        print(f"  {run['label']:<{width}}: {run['seconds']:7.1f} s in all, {per:5.1f} s per submission, "
              f"{run['jobs']} at a time, speed-up {base['seconds'] / run['seconds']:.2f}x over {base['label']}")
    same = all(run["scores"] == base["scores"] for run in runs)
    print(f"\n  same score for every learner in every run: {'yes' if same else 'NO'}")
    by_kind: dict[str, set] = defaultdict(set)
    seconds_by_kind: dict[str, list] = defaultdict(list)
    for student, score in base["scores"].items():
        by_kind[student.split("-")[0]].add(score)
    for sub in base["record"]["submissions"]:
        seconds_by_kind[sub["student"].split("-")[0]].append(sub["seconds"])
    top = base["record"]["submissions"][0]["max_score"]
    print(f"\n  {'kind':<14} {'score (of ' + format(top, 'g') + ')':>14} {'seconds each (' + base['label'] + ')':>26}")
    for kind in KINDS:
        secs = seconds_by_kind[kind]
        print(f"  {kind:<14} {', '.join(f'{s:g}' for s in sorted(by_kind[kind])):>14} "
              f"{sum(secs) / max(1, len(secs)):>26.1f}")
    cheat = next((s for s in base["record"]["submissions"] if s["student"].startswith("cheat")), None)
    if cheat is not None:  # the fifth learner: a smaller class has none
        patched = any("autograder.kit.exercise" in line for line in cheat["left_out"])
        print(f"\n  the cheat earned {cheat['score']:g}: its patch of the grading ran in its own kernel, where no part "
              f"is decided, and was {'left out of' if patched else 'KEPT IN'} the fresh process that decided (the "
              f"honest built-in all_reduce answer earns the same: the cheat gains nothing)")
    two = next((run for run in runs if run["label"] == "--jobs 2"), None)
    if two is not None and args.learners == 30:
        ok = two["seconds"] <= TARGET
        print(f"\n  {'PASS' if ok else 'FAIL'}  30 learners with --jobs 2 in {two['seconds']:.0f} s (at most {TARGET:g} s)")

    fastest = min(runs, key=lambda r: r["seconds"])
    here = os.cpu_count() or 1
    # Core-seconds per lesson-04 submission, taking every core as busy for the whole run (an upper bound).
    per_core = fastest["seconds"] * min(fastest["jobs"], here) / args.learners
    ratio = per_core / LESSON_SECONDS["04"]
    whole = sum(LESSON_SECONDS.values()) * ratio  # core-seconds for one learner's nine lessons
    cores = 16
    projected = 100 * whole / cores
    print(f"\n  Projection for 100 learners x 9 lessons on a {cores}-core machine (--jobs {cores}): "
          f"{projected / 60:.0f} min.")
    print(f"    One lesson-04 submission cost {per_core:.1f} core-seconds here ({fastest['label']} on {here} cores), "
          f"{ratio:.2f}x its grading time alone ({LESSON_SECONDS['04']} s, all stages, --jobs 1); the other lessons are "
          f"scaled by the "
          f"same factor from their grading times ({sum(LESSON_SECONDS.values()):.0f} s for all nine), and the "
          f"work is assumed to spread evenly over {cores} cores. This class is one fifth deadlocks, the slowest kind.")
    if args.json:
        Path(args.json).write_text(json.dumps({"learners": args.learners, "same_scores": same, "runs": [
            {k: v for k, v in run.items() if k != "record"} for run in runs], "projection_minutes": projected / 60},
            indent=2))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
