"""Seconds to grade one learner's submission of each lesson, all stages, with the real nbgrader.

Run: ``make bench-grading`` or ``.venv/bin/python bench/grading_bench.py [--kinds solution,stubs,deadlock,crash]
[--lessons 04-ring-all-reduce,...] [--repeats N] [--json PATH]``

For every lesson, in a throw-away copy of the course (devtools.scratch), this grades
one learner's notebook per kind (``--repeats`` of each) with ``python -m autograder grade
--jobs 1``, the instructor's command, and reads back from the run's record
(``autograder/grading-run.json`` in that copy) the seconds each submission took in all and
per stage: the kernel's start, the notebook's first cell (its imports), all its cells, the
clean re-grade (its start-up, then its checks, with how many rank launches they made),
the feedback page; and the score:

- ``solution``: the instructor's notebook handed in as a learner's (full marks);
- ``stubs``: the learner notebook untouched (every exercise raises NotImplementedError);
- ``deadlock`` and ``crash``: lesson 04 only, the solution except for a ring all-reduce
  (Exercise 4.4) where every rank receives first, or where the last rank crashes.

Targets on 2 cores (issue 24): the median of a lesson's submissions, all stages, at most
12 s (30 s for lesson 07, whose checks run seven real ``torchrun`` jobs: 7.1's two agents of two
processes and one agent of three, and 7.2's five, each one agent whose processes are forked from it:
4 processes without a fault, 4 with one killed at a step, 4 with one killed while writing a checkpoint,
and the first one's checkpoint resumed on 2 and on 3); the deadlock and crash
kinds at most twice the solution's; no cell near nbgrader's per-cell timeout (90 s here).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _common import machine_line  # noqa: E402

from autograder.notebooks.generate import lessons  # noqa: E402
from devtools.scratch import RING_ANSWERS, course_copy, run_instructor_command, solution_source, submission  # noqa: E402

CELL_TIMEOUT = 90.0
WRONG_RINGS = {"deadlock": RING_ANSWERS["receive_first"], "crash": RING_ANSWERS["crash"]}
LIMITS = {"07-launching-at-scale": 30.0}  # seconds per submission, median, all stages
LIMIT = 12.0


def _solution_answers(lesson: str, release: Path) -> dict[str, str]:
    nb = json.loads(release.read_text())
    ids = [c["metadata"]["nbgrader"]["grade_id"] for c in nb["cells"]
           if c.get("metadata", {}).get("nbgrader", {}).get("solution")]
    return {gid: solution_source(lesson, gid) for gid in ids}


def _longest_cell(notebook: Path) -> float:
    longest = 0.0
    for cell in json.loads(notebook.read_text())["cells"]:
        timing = cell.get("metadata", {}).get("execution", {})
        start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
        if start and end:
            seconds = (datetime.fromisoformat(end.replace("Z", "+00:00")) -
                       datetime.fromisoformat(start.replace("Z", "+00:00"))).total_seconds()
            longest = max(longest, seconds)
    return longest


def _median(values: list[float]) -> float:
    values = sorted(values)
    n = len(values)
    return (values[n // 2] + values[(n - 1) // 2]) / 2 if values else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default="solution,stubs,deadlock,crash")
    parser.add_argument("--lessons", default=",".join(lessons()))
    parser.add_argument("--repeats", type=int, default=1, help="submissions of each kind (the median is judged)")
    parser.add_argument("--json", help="write the numbers to this file")
    args = parser.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    chosen = [name for name in args.lessons.split(",") if name]

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = course_copy(Path(tmp) / "course", lessons=chosen)
        subs = Path(tmp) / "submissions"
        for lesson in chosen:
            release = root / "course" / lesson / f"{lesson}.ipynb"
            for kind in kinds:
                if kind in WRONG_RINGS and lesson != "04-ring-all-reduce":
                    continue
                answers = {} if kind == "stubs" else _solution_answers(lesson, release)
                if kind in WRONG_RINGS:
                    gid = next(g for g, src in answers.items() if "def ring_allreduce" in src)
                    answers = {**answers, gid: WRONG_RINGS[kind]}  # the other exercises answered correctly
                for n in range(args.repeats):
                    submission(release, subs / f"{kind}-{n + 1}" / lesson / f"{lesson}.ipynb", answers)
        started = time.monotonic()
        done = run_instructor_command(root, "grade", str(subs), "--jobs", "1")
        total = time.monotonic() - started
        record = json.loads((root / "autograder" / "grading-run.json").read_text())
        if not record["submissions"]:
            print(done.stdout, done.stderr)
            return 1
        for run in sorted(record["submissions"], key=lambda r: (r["lesson"], r["student"])):
            kind, lesson = run["student"].rsplit("-", 1)[0], run["lesson"]
            graded = root / "autograder" / "autograded" / run["student"] / lesson / f"{lesson}.ipynb"
            score = (run["score"], run["max_score"]) if run["score"] is not None else None
            parts = run.get("parts", [])
            rows.append({"lesson": lesson, "kind": kind, "student": run["student"], "seconds": run["seconds"],
                         "status": run["status"], "error": run.get("error"), "stages": run.get("stages", {}),
                         "cells": run.get("cells", {}), "checks": round(sum(p.get("seconds") or 0 for p in parts), 2),
                         "launches": sum(p.get("launches") or 0 for p in parts), "parts": parts,
                         "longest_cell": _longest_cell(graded) if graded.is_file() else None, "score": score})

    print(f"Grading one submission, all stages, real nbgrader, --jobs 1; machine: {machine_line()}\n")
    print(f"{'lesson':<24} {'submission':<12} {'seconds':>7} {'kernel':>7} {'imports':>7} {'cells':>6} {'clean':>6} "
          f"{'checks':>7} {'runs':>5} {'feedback':>8} {'longest cell':>12} {'score':>9}")
    for row in rows:
        score = f"{row['score'][0]:g} / {row['score'][1]:g}" if row["score"] else row["status"]
        cell = f"{row['longest_cell']:.1f} s" if row["longest_cell"] is not None else "-"
        st = row["stages"]
        print(f"{row['lesson']:<24} {row['student']:<12} {row['seconds']:>7.1f} {st.get('kernel_start', 0):>7.1f} "
              f"{row['cells'].get('imports') or 0:>7.1f} {row['cells'].get('seconds', 0):>6.1f} {st.get('clean', 0):>6.1f} "
              f"{row['checks']:>7.1f} {row['launches']:>5} {st.get('feedback', 0):>8.1f} {cell:>12} {score:>9}")
    print("\n(kernel: from nbgrader's start to the kernel's answer; imports: the notebook's imports cell; cells: all its "
          "cells in the kernel; clean: the clean re-grade, which runs beside the kernel; checks: its graded parts, "
          "with the rank runs they made; feedback: the HTML page)")
    print(f"\nthe grade command took {total:.1f} s in all for {len(rows)} submissions")
    checks = []
    by_lesson: dict[str, dict[str, list[float]]] = {}
    for row in rows:
        by_lesson.setdefault(row["lesson"], {}).setdefault(row["kind"], []).append(row["seconds"])
    for lesson, kinds_of in by_lesson.items():
        limit = LIMITS.get(lesson, LIMIT)
        for kind in ("solution", "stubs"):
            if kind in kinds_of:
                median = _median(kinds_of[kind])
                checks.append((median <= limit, f"{lesson} {kind}: median {median:.1f} s per submission (at most {limit:g} s)"))
        for kind in WRONG_RINGS:
            if kind in kinds_of and "solution" in kinds_of:
                ratio = _median(kinds_of[kind]) / _median(kinds_of["solution"])
                checks.append((ratio <= 2.0, f"{lesson} {kind}: {ratio:.2f}x the solution's time (at most 2x)"))
    worst_cell = max((r["longest_cell"] or 0 for r in rows), default=0)
    checks.append((worst_cell <= CELL_TIMEOUT * 0.5, f"no cell near the {CELL_TIMEOUT:g} s cell timeout "
                   f"(longest {worst_cell:.1f} s)"))
    checks.append((all(r["status"] == "ok" for r in rows), "every submission graded"))
    for ok, text in checks:
        print(f"  {'PASS' if ok else 'FAIL'}  {text}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "total": total}, indent=2))
    return 0 if all(ok for ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
