"""Grade one learner's submission of one lesson, in a work folder of its own.

:func:`grade_submission` takes a :class:`Task` (who, which lesson, where the handed-in
notebook, the lesson's nbgrader files and a gradebook template, all as bytes) and returns a
:class:`Graded` record: how it ended, the score of every graded part, seconds per stage,
the whole log, and what grading made (the graded notebook, the feedback page and the private
gradebook's rows, :mod:`autograder.grading.merge`), which the class workflow
(:mod:`autograder.grading.grade`) merges into the course. The work folder is removed before it
returns: nothing of it is needed on the machine that merges. It runs in a worker process
that grades many submissions one after another, with nbgrader already imported
(:func:`warm_up`), so no submission pays for starting nbgrader.

The steps, one function each in the module that does that work, each given what the one before
returned (:func:`grade_submission` is this list):

1. **set-up** (:func:`~autograder.grading.workfolder.open_job`): a private copy of nbgrader's
   configuration, the lesson's instructor folder and released notebook, the gradebook template
   and the submission, written from the task; a worker that cannot start the grading sandbox
   refuses here (unless the task says ``sandboxed=False``), and so does a file that is not a
   notebook of this lesson;
2. **autograde** (:func:`~autograder.grading.autograde.autograde`: nbgrader, in this process):
   deleted and edited cells are restored, then the notebook runs in a fresh kernel inside the
   grading sandbox (:mod:`autograder.grading.sandbox`), all but the cells that make nothing a graded
   cell uses (the demonstrations: :mod:`autograder.grading.unused`). What this process learns from inside
   nbgrader travels in a :class:`~autograder.grading.autograde.Watch` that nbgrader's own
   ``resources`` carry through its preprocessors. Hidden test cells run no check there
   (:func:`autograder.kit.exercise.decided_by_clean_run`): a learner's kernel can be made to say
   anything, so its verdict would not count anyway;
3. **clean re-grade** (:func:`~autograder.grading.regrade.regrade`; :mod:`autograder.grading.clean`,
   sandboxed too): every graded part is decided in a fresh process that holds only the learner's
   definitions. It starts as soon as the restored notebook exists, so it runs beside the kernel;
4. **settle** (:func:`~autograder.grading.verdicts.settle`): each part's verdict goes into the
   gradebook and, in place of the hidden test cell's output, into the graded notebook, with no path
   of the grading machine in it;
5. **feedback** (:func:`~autograder.grading.merge.feedback`, nbgrader, in this process): the
   learner's HTML page, then what grading made into the record.

Each step writes its seconds, notes and log into the record the job carries (:attr:`Job.graded`,
:attr:`Job.log`); a step that finds the submission can go no further raises
:class:`~autograder.grading.task.Unfinished`, saying whose failure it is.

Whose failure it is decides what happens next (:attr:`Graded.failure`):

- ``"infrastructure"``: the sandbox could not be set up, the kernel did not start, nbgrader
  or the clean re-grade broke. Nothing the learner did; the class workflow grades such a
  submission once more (:data:`TRIES`), and the record says why.
- ``"learner"``: the notebook file cannot be read, or it is another lesson's notebook. The learner has to hand it in again.
- A kernel that died while it ran the learner's cells (``os._exit``, a crash in C) is the
  learner's doing, but loses nothing: the clean re-grade still decides every part, and the
  feedback says the notebook stopped there (:attr:`Graded.notes`).

Example (what :mod:`autograder.grading.grade` does for each submission, in a worker)::

    task = Task(student="ana", lesson="04-ring-all-reduce",
                course=lesson_files(ROOT, "04-ring-all-reduce", template=Path("/tmp/gradebook.db")),
                submitted=read_files(Path("autograder/submitted/ana/04-ring-all-reduce")))
    graded = grade_submission(task)    # graded.status == "ok", graded.parts[0]["score"] == 1.0, ...
"""

from __future__ import annotations

import os
import socket
import time

from .autograde import autograde
from .merge import feedback
from .regrade import regrade
from .task import Graded, Task, Unfinished
from .verdicts import settle
from .workfolder import open_job, sweep

__all__ = ["grade_submission", "warm_up", "quiet_gradebook"]


def warm_up() -> None:
    """Import what grading a submission uses, once per worker process (nbgrader, nbconvert, nbclient).

    Also clears the work folders that killed grading processes on this machine left behind.
    """
    quiet_gradebook()
    sweep()
    import nbclient  # noqa: F401
    import nbgrader.apps.api  # noqa: F401
    import nbgrader.converters  # noqa: F401
    from nbconvert.exporters import HTMLExporter  # noqa: F401

    from ..notebooks import cells, preprocessors  # noqa: F401


def quiet_gradebook() -> None:
    """Hide SQLAlchemy's warnings about nbgrader's own sessions (nbgrader's commands hide them the same way)."""
    import warnings

    try:
        from sqlalchemy.exc import SAWarning
    except ImportError:
        return
    warnings.filterwarnings("ignore", category=SAWarning)


def grade_submission(task: Task) -> Graded:
    """Autograde, re-grade cleanly and write the feedback of one submission; never raises.

    What grading made comes back in the record (:attr:`Graded.files`, :attr:`Graded.gradebook`)
    when it succeeded; the work folder is gone when this returns.
    """
    began = time.monotonic()
    graded = Graded(task.student, task.lesson, attempt=task.attempt, worker=f"{socket.gethostname()} pid {os.getpid()}")
    job = None
    try:
        job = open_job(task, graded)
        sanitized = autograde(job)
        verdicts = regrade(job, sanitized)
        settle(job, verdicts)
        feedback(job)
    except Unfinished as stop:
        graded.failure, graded.error = stop.failure, stop.error
    except Exception as exc:  # noqa: BLE001 - a fault of the grading machinery: recorded, tried again
        import traceback

        graded.failure, graded.error = "infrastructure", f"{type(exc).__name__}: {exc}"
        broke = "== grading broke\n" + traceback.format_exc()
        if job is not None:
            job.log.append(broke)
    finally:  # also when the run is stopped (Ctrl-C): nothing of the work folder is kept
        if job is not None:
            job.remove()
        log = [f"== {task.name}, try {task.attempt}, on {graded.worker}", *(job.log if job is not None else ())]
        if graded.error:
            log.append(f"== {graded.failure or 'failed'}: {graded.error}")
        graded.log = "\n".join(part for part in log if part) + "\n"
        graded.seconds = round(time.monotonic() - began, 2)
    return graded
