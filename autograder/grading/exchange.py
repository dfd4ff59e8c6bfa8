"""From nbgrader's exchange to ``make grade``: collect one lesson's submissions, then grade them.

Run from the repository root as the instructor (on the course's JupyterHub: in a terminal of
the instructor's server)::

    make collect LESSON=04-ring-all-reduce [JOBS=N | SCHEDULER=... | SLURM=...] [NO_SANDBOX=1]
    python -m autograder collect 04-ring-all-reduce [any option of `python -m autograder grade`]

1. nbgrader's collect (``nbgrader collect --update LESSON``): each learner's latest submission
   in the exchange goes to ``autograder/submitted/<student>/<lesson>/``, with nbgrader's
   ``timestamp.txt`` and ``submission_secret.txt``; a learner who submitted again after an
   earlier collect gets the newer one collected;
2. those folders of this lesson are copied into ``autograder/exchange/<lesson>/`` (a folder of
   ``<student>/<lesson>/<lesson>.ipynb``, the layout ``make grade`` takes; replaced each time);
3. ``python -m autograder grade autograder/exchange/<lesson>`` with the options given: the
   sandbox, the clean re-grade and Dask, exactly as ``make grade`` grades a folder. The
   feedback keeps the submission's timestamp and secret, so ``nbgrader release_feedback LESSON``
   (or the formgrader's button) hands each learner the feedback of what they submitted.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from pathlib import Path

from ..course.build import ROOT, lessons, nbgrader_api

__all__ = ["collect", "collect_from_exchange", "main"]

WORK = ROOT / "autograder"
USAGE = "usage: python -m autograder collect LESSON [options of `python -m autograder grade`]"


#: What nbgrader's exchange puts beside a collected notebook, kept with it: when it was submitted
#: (late penalties read it), and the secret under which its feedback is released to the learner.
EXCHANGE_FILES = ("timestamp.txt", "submission_secret.txt")


def collect(source: Path) -> dict[str, list[str]]:
    """Copy ``source/<student>/<lesson>/<lesson>.ipynb`` into autograder/submitted/; returns lesson -> students.

    nbgrader's own ``timestamp.txt`` and ``submission_secret.txt`` travel with the notebook (a
    submission from the exchange keeps its time, and its feedback can be released to the learner);
    a notebook without them is stamped now. ``source`` may be autograder/submitted/ itself (where
    nbgrader's collect and the formgrader's Collect button put submissions): it is graded in place.
    """
    known = set(lessons())
    found: dict[str, list[str]] = {}
    in_place = source.resolve() == (WORK / "submitted").resolve()
    for student_dir in sorted(p for p in source.iterdir() if p.is_dir()):
        for lesson_dir in sorted(p for p in student_dir.iterdir() if p.is_dir()):
            notebook = lesson_dir / f"{lesson_dir.name}.ipynb"
            if lesson_dir.name not in known or not notebook.is_file():
                print(f"  skipped {lesson_dir.relative_to(source)}: not a lesson notebook of this course")
                continue
            target = WORK / "submitted" / student_dir.name / lesson_dir.name
            if not in_place:
                if target.exists():
                    shutil.rmtree(target)
                target.mkdir(parents=True)
                shutil.copy2(notebook, target / notebook.name)
                for name in EXCHANGE_FILES:
                    if (lesson_dir / name).is_file():
                        shutil.copy2(lesson_dir / name, target / name)
            if not (target / "timestamp.txt").is_file():
                (target / "timestamp.txt").write_text(time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
            found.setdefault(lesson_dir.name, []).append(student_dir.name)
    return found


def collect_from_exchange(lesson: str) -> Path:
    """nbgrader's collect of ``lesson``, then its submissions copied into the folder to grade; returns that folder."""
    api = nbgrader_api()
    result = api.collect(lesson, update=True)
    log = (result.get("log") or "").strip()
    if log:
        print(log)
    if not result.get("success"):
        lines = [line for line in (result.get("error") or "").splitlines() if line.strip()]
        telling = re.sub(r"^[\w.]+(Error|Exception): ", "", lines[-1]) if lines else "no reason given"
        exchange = os.environ.get("COURSE_EXCHANGE") or "nbgrader's exchange folder"
        raise RuntimeError(f"nbgrader could not collect {lesson} from the exchange ({exchange}): {telling}. "
                           f"Is that the hub's exchange folder (COURSE_EXCHANGE, set in the instructor's hub "
                           f"server), and was the lesson released (the formgrader's Release button, or "
                           f"`nbgrader release_assignment {lesson}`)?")
    target = WORK / "exchange" / lesson
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    submitted = WORK / "submitted"
    students = sorted(p.name for p in submitted.iterdir() if (p / lesson).is_dir()) if submitted.is_dir() else []
    for student in students:
        shutil.copytree(submitted / student / lesson, target / student / lesson)
    print(f"Collected {len(students)} submission{'s' if len(students) != 1 else ''} of {lesson} from the exchange: "
          f"{', '.join(students) or 'none'}.")
    return target


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 2
    lesson, rest = argv[0], argv[1:]
    if lesson not in lessons():
        print(f"{lesson!r} is not a lesson of this course; the lessons are: {', '.join(lessons())}", file=sys.stderr)
        return 2
    try:
        folder = collect_from_exchange(lesson)
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 2
    if not any(folder.iterdir()):
        print(f"Nothing to grade: no learner has submitted {lesson} yet.")
        return 0
    from .grade import main as grade_main

    return grade_main([str(folder), *rest])
