"""A graded submission's way into the course: taken from its work folder as data, merged by one process.

On the worker, :func:`feedback` is the last step of grading a submission
(:mod:`autograder.grading.submission`): nbgrader writes the learner's page, then :func:`take`
reads what grading made in the work folder (the graded notebook and the feedback page, as
bytes) and :func:`rows` the private gradebook's rows of the submission, as plain data, into its
record. On the instructor's machine, :func:`merge` writes them into the course's
``autograder/gradebook.db``, ``autograded/`` and ``feedback/``. Only that one process writes the
shared gradebook, one submission at a time, so it is written safely and every learner's grade is
the same with any number of workers, wherever they run.

Example (what :mod:`autograder.grading.grade` does with each record that comes back)::

    graded = grade_submission(task)        # on a worker: graded.files, graded.gradebook filled in
    merge(graded, ROOT / "autograder")     # here: the gradebook's rows, the notebook, the feedback
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from .task import Files, Graded, Unfinished, read_files, write_files
from .workfolder import Job

__all__ = ["feedback", "take", "rows", "merge", "KINDS", "account_name"]

#: What grading makes per submission, as folders <kind>/<student>/<lesson>/ under autograder/.
KINDS = ("autograded", "feedback")


def feedback(job: Job) -> None:
    """*feedback*: nbgrader's page for the learner; then what grading made goes into the record, which is done."""
    from ..notebooks.generate import nbgrader_api

    task, started, graded = job.task, time.monotonic(), job.graded
    made = nbgrader_api(job.folder).generate_feedback(task.lesson, task.student, force=True)
    graded.stages["feedback"] = round(time.monotonic() - started, 2)
    job.log += ["== nbgrader generate_feedback", made.get("log", "").rstrip(), made.get("error", "").rstrip()]
    if not made["success"]:
        said = [line.strip() for line in made.get("error", "").splitlines() if line.strip()
                and "above traceback" not in line]
        raise Unfinished("infrastructure", "feedback: " + (said[-1] if said else "nbgrader failed without a message"))
    graded.files = take(job.work, task.student, task.lesson)
    graded.gradebook = rows(job.work / "gradebook.db", task.lesson, task.student)
    graded.status = "ok"


def take(work: Path, student: str, lesson: str) -> Files:
    """The graded notebook and the feedback of one submission, as files relative to ``work`` (autograder/)."""
    files: Files = {}
    for kind in KINDS:
        made = work / kind / student / lesson
        if made.is_dir():
            files.update({f"{kind}/{student}/{lesson}/{name}": data for name, data in read_files(made).items()})
    return files


def rows(db: Path, lesson: str, student: str) -> dict[str, Any]:
    """The gradebook's rows of one submission as plain data: the submission, its notebooks, their grades and comments."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{db}") as gb:
        sub = gb.find_submission(lesson, student)
        return {"timestamp": sub.timestamp, "extension": sub.extension, "notebooks": [
            {"name": nb.name, "flagged": nb.flagged, "late_submission_penalty": nb.late_submission_penalty,
             "grades": [{"name": g.name, "auto_score": g.auto_score, "manual_score": g.manual_score,
                         "extra_credit": g.extra_credit, "needs_manual_grade": g.needs_manual_grade}
                        for g in nb.grades],
             "comments": [{"name": c.name, "auto_comment": c.auto_comment, "manual_comment": c.manual_comment}
                          for c in nb.comments]}
            for nb in sub.notebooks]}


def account_name(student: str) -> tuple[str, str]:
    """(first name, last name) for the formgrader: the Unix account's full name (the passwd GECOS field), else
    the student id, the name the learner logs in to the hub with (their account has no full name, or they
    are not a user of this machine, as on Kubernetes or with handed-in archives).

    >>> account_name("no-such-account-here")
    ('', 'no-such-account-here')
    """
    import pwd

    try:
        full = pwd.getpwnam(student).pw_gecos.split(",")[0].strip()
    except KeyError:
        full = ""
    first, _, last = full.rpartition(" ")
    return (first.strip(), last) if last else ("", student)


def merge(graded: Graded, work: Path) -> None:
    """Write a graded submission into the course at ``work`` (autograder/): gradebook rows, notebook, feedback.

    An earlier grading of the same submission is replaced, not added to.
    """
    from nbgrader.api import Gradebook, MissingEntry

    student, lesson, made = graded.student, graded.lesson, graded.gradebook
    with Gradebook(f"sqlite:///{work / 'gradebook.db'}") as gb:
        known = gb.update_or_create_student(student)
        if known.first_name is None and known.last_name is None:  # never a name an instructor typed in
            known.first_name, known.last_name = account_name(student)
            gb.db.commit()
        try:
            gb.remove_submission(lesson, student)
        except MissingEntry:
            pass
        gb.add_submission(lesson, student, timestamp=made["timestamp"], extension=made["extension"])
        for nb in made["notebooks"]:
            target = gb.find_submission_notebook(nb["name"], lesson, student)
            target.flagged, target.late_submission_penalty = nb["flagged"], nb["late_submission_penalty"]
            for g in nb["grades"]:
                row = gb.find_grade(g["name"], nb["name"], lesson, student)
                row.auto_score, row.manual_score = g["auto_score"], g["manual_score"]
                row.extra_credit, row.needs_manual_grade = g["extra_credit"], g["needs_manual_grade"]
            for c in nb["comments"]:
                row = gb.find_comment(c["name"], nb["name"], lesson, student)
                row.auto_comment, row.manual_comment = c["auto_comment"], c["manual_comment"]
        gb.db.commit()
    for kind in KINDS:
        target = work / kind / student / lesson
        if target.exists():
            shutil.rmtree(target)
    write_files(work, graded.files)
