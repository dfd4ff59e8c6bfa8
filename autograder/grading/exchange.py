"""From nbgrader's exchange to ``make grade``: collect one lesson's submissions, then grade them.

Run from the repository root as the instructor (on the course's JupyterHub: in a terminal of
the instructor's server)::

    make collect LESSON=04-ring-all-reduce [JOBS=N | SCHEDULER=... | SLURM=...] [NO_SANDBOX=1]
    python -m autograder collect 04-ring-all-reduce [any option of `python -m autograder grade`]

1. nbgrader's collect (``nbgrader collect --update LESSON``): each learner's latest submission
   in the exchange goes to ``autograder/submitted/<student>/<lesson>/``, with nbgrader's
   ``timestamp.txt`` and ``submission_secret.txt``; a learner who submitted again after an
   earlier collect gets the newer one collected; a submission still being written is left in the
   exchange for the next collect, with a line saying whose (autograder/grading/inbound.py); a
   missing exchange folder stops it with the way to recover (:func:`check_exchange`);
2. those folders of this lesson are copied into ``autograder/exchange/<lesson>/`` (a folder of
   ``<student>/<lesson>/<lesson>.ipynb``, the layout ``make grade`` takes; replaced each time);
3. ``python -m autograder grade autograder/exchange/<lesson>`` with the options given: the
   sandbox, the clean re-grade and Dask, exactly as ``make grade`` grades a folder. The
   feedback keeps the submission's timestamp and secret, so ``nbgrader release_feedback LESSON``
   (or the formgrader's button) hands each learner the feedback of what they submitted.

Steps 1-3 hold the course's grading lock (autograder/grading/onegrader.py): a second collect or
grade of the same course folder meanwhile stops, naming this one.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from contextlib import ExitStack
from pathlib import Path

from ..notebooks.generate import lessons, nbgrader_api
from ..paths import ROOT

__all__ = ["collect_from_exchange", "main"]

WORK = ROOT / "autograder"
USAGE = "usage: python -m autograder collect LESSON [options of `python -m autograder grade`]"


def check_exchange(lesson: str) -> None:
    """Stop with what to do when the shared-folder exchange, or this course's part of it, is gone."""
    api = nbgrader_api()
    root = Path(api.exchange.Collect(coursedir=api.coursedir, authenticator=api.authenticator, parent=api).root)
    course = api.coursedir.course_id
    if not root.is_dir():
        raise RuntimeError(
            f"the exchange folder {root} does not exist (deleted, or a disk not mounted): learners can neither fetch "
            f"nor submit, and nothing can be collected. Nothing of the learners' is lost: their lessons and answers "
            f"are in their homes, and each submission also in their own ~/.local/share/jupyter/nbgrader_cache. "
            f"Recover, as root: `mkdir -p {root} && chmod 0777 {root}` (the rights nbgrader needs; `make hub` does "
            f"the same at start-up, but restarting the hub stops every learner's server); then release each lesson "
            f"again (the formgrader's Release button, or `nbgrader release_assignment LESSON`) and ask the learners "
            f"who submitted since the last collect to press Submit again.")
    if not (root / course / "inbound").is_dir():
        raise RuntimeError(
            f"the exchange {root} holds no submissions folder for course {course!r} ({root / course / 'inbound'} "
            f"is missing): {lesson} was never released there, or the exchange was emptied under the hub. Release "
            f"it (the formgrader's Release button, or `nbgrader release_assignment {lesson}`); learners who "
            f"submitted before it was emptied press Submit again (their copy is in their homes).")


def collect_from_exchange(lesson: str) -> Path:
    """nbgrader's collect of ``lesson``, then its submissions copied into the folder to grade; returns that folder.

    With the shared-folder exchange, a submission still being written is left for the next collect
    (:class:`~autograder.grading.inbound.WholeCollect`, set in the course's nbgrader_config.py)."""
    if not os.environ.get("COURSE_NGSHARE_URL"):
        check_exchange(lesson)
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
    left = sum("is not whole yet" in line for line in log.splitlines())
    print(f"Collected {len(students)} submission{'s' if len(students) != 1 else ''} of {lesson} from the exchange: "
          f"{', '.join(students) or 'none'}." + (f" Left for the next collect, still being written: {left} (the "
                                                f"lines above say whose)." if left else ""))
    return target


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 2
    lesson, rest = argv[0], argv[1:]
    if lesson not in lessons():
        print(f"{lesson!r} is not a lesson of this course; the lessons are: {', '.join(lessons())}", file=sys.stderr)
        return 2
    from .onegrader import grading_lock

    with ExitStack() as held:
        try:
            held.enter_context(grading_lock(WORK, f"make collect LESSON={lesson}"))  # until grading ends
            folder = collect_from_exchange(lesson)
        except RuntimeError as exc:  # GradingBusy among them
            print(f"make collect: {exc}", file=sys.stderr)
            return 2
        if not any(folder.iterdir()):
            print(f"Nothing to grade: no learner has submitted {lesson} yet.")
            return 0
        from .grade import main as grade_main

        return grade_main([str(folder), *rest])
