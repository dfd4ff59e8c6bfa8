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

The steps:

1. **set-up**: a private copy of nbgrader's configuration, the lesson's instructor folder,
   the gradebook template and the submission, written from the task; a worker that cannot
   start the grading sandbox refuses here (unless the task says ``sandboxed=False``);
2. **autograde** (nbgrader, in this process): deleted and edited cells are restored, then the
   notebook runs in a fresh kernel inside the grading sandbox (:mod:`autograder.grading.sandbox`).
   Hidden test cells run no check there (:func:`autograder.lessons.kit.decided_by_clean_run`): a
   learner's kernel can be made to say anything, so its verdict would not count anyway;
3. **clean re-grade** (:mod:`autograder.grading.clean`, sandboxed too): every graded part is
   decided in a fresh process that holds only the learner's definitions. It starts as soon
   as the restored notebook exists, so it runs beside the kernel;
4. **settle**: each part's verdict goes into the gradebook and, in place of the hidden test
   cell's output, into the graded notebook, with no path of the grading machine in it;
5. **feedback** (nbgrader, in this process): the learner's HTML page.

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

import json
import os
import shutil
import socket
import time
from pathlib import Path

from .merge import rows, take
from .task import Graded, Task
from .verdicts import cell_times, settle
from .workfolder import Job, Tail, sweep

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

    from ..course import cells, preprocessors  # noqa: F401


def quiet_gradebook() -> None:
    """Hide SQLAlchemy's warnings about nbgrader's own sessions (nbgrader's commands hide them the same way)."""
    import warnings

    try:
        from sqlalchemy.exc import SAWarning
    except ImportError:
        return
    warnings.filterwarnings("ignore", category=SAWarning)


# -- one submission ------------------------------------------------------------------------------


def _readable(path: Path) -> str | None:
    """None when ``path`` is a notebook nbformat can read; else why not, for the learner."""
    import nbformat

    try:
        nbformat.read(path, as_version=4)
        return None
    except Exception as exc:  # noqa: BLE001 - any way a file can fail to be a notebook
        return f"the notebook file cannot be read ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"


def _graded_ids(path: Path) -> set[str]:
    """The nbgrader grade_ids of a notebook's cells."""
    import nbformat

    cells = nbformat.read(path, as_version=4).cells
    return {c.metadata["nbgrader"]["grade_id"] for c in cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id")}


def _another_lesson(path: Path, solution: Path, lesson: str) -> str | None:
    """Why the notebook at ``path`` is not a submission of ``lesson`` (its nbgrader cells all belong to another
    lesson: a learner handed in the wrong notebook under this one's name), or None."""
    theirs, ours = _graded_ids(path), _graded_ids(solution)
    if not theirs or theirs & ours:
        return None  # a notebook of this lesson, or one whose cells grading puts back as they were released
    shown = ", ".join(sorted(theirs)[:4]) + (", ..." if len(theirs) > 4 else "")
    return (f"the notebook handed in as {lesson} is another lesson's: none of its nbgrader cells ({shown}) belongs "
            f"to {lesson}. The learner should hand in {lesson}/{lesson}.ipynb")


def _telling_line(kernel: str, error: BaseException | None, nbgrader_error: str) -> str:
    """The one line that says what went wrong: bubblewrap's message, the kernel's last words, the error."""
    lines = [line.strip() for line in kernel.splitlines() if line.strip()]
    bwrap = [line for line in lines if line.startswith("bwrap:")]
    if bwrap:
        return bwrap[-1]
    said = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}" if error else ""
    if lines and error is not None:
        return f"{said} (the kernel's last words: {lines[-1][:300]})"
    if said:
        return said
    found = [line for line in nbgrader_error.strip().splitlines() if line.strip() and "above traceback" not in line]
    return found[-1].strip() if found else "nbgrader failed without a message"


def _refusal(task: Task) -> str | None:
    """Why this process must not grade ``task``: it asks for the sandbox, and no sandbox starts here."""
    if not task.sandboxed:
        return None
    from .sandbox import install_hint, problem

    reason = problem()
    if reason is None:
        return None
    return (f"{socket.gethostname()} cannot sandbox learners' code: {reason}. {install_hint()} "
            "(--no-sandbox grades without it, with your rights.)")


def grade_submission(task: Task) -> Graded:
    """Autograde, re-grade cleanly and write the feedback of one submission; never raises.

    What grading made comes back in the record (:attr:`Graded.files`, :attr:`Graded.gradebook`)
    when it succeeded; the work folder is gone when this returns.
    """
    from ..course import preprocessors

    began = time.monotonic()
    graded = Graded(task.student, task.lesson, attempt=task.attempt, worker=f"{socket.gethostname()} pid {os.getpid()}")
    refused = _refusal(task)
    if refused:
        graded.failure, graded.error = "infrastructure", refused
        graded.log = f"== {task.name}, try {task.attempt}: refused\n== infrastructure: {refused}\n"
        return graded
    try:
        job = Job(task)
    except Exception as exc:  # noqa: BLE001 - a disk that is full, a task that would write outside its folder
        graded.failure, graded.error = "infrastructure", f"setting up the work folder: {type(exc).__name__}: {exc}"
        graded.log = f"== {task.name}, try {task.attempt}\n== infrastructure: {graded.error}\n"
        return graded
    stages = graded.stages
    log: list[str] = [f"== {task.name}, try {task.attempt}, on {graded.worker}, work folder {job.folder}"]
    watch = preprocessors.WATCH = preprocessors.Watch(on_sanitized=job.start_clean)
    kernel = Tail()
    try:
        unreadable = _readable(job.submitted / f"{task.lesson}.ipynb") or _another_lesson(
            job.submitted / f"{task.lesson}.ipynb", job.solution, task.lesson)
        if unreadable:
            graded.failure, graded.error = "learner", unreadable
            return graded
        stages["setup"] = round(time.monotonic() - began, 2)
        mark = time.time()
        api = job.api(kernel.path)
        # The kernel spec is looked up on JUPYTER_PATH when the kernel starts (this worker grades one
        # submission at a time, so its environment is this submission's meanwhile).
        saved = os.environ.get("JUPYTER_PATH")
        os.environ["JUPYTER_PATH"] = os.pathsep.join(p for p in (str(job.folder / "jupyter"), saved) if p)
        try:
            done = api.autograde(task.lesson, task.student, force=True, create=True)
        finally:
            if saved is None:
                os.environ.pop("JUPYTER_PATH", None)
            else:
                os.environ["JUPYTER_PATH"] = saved
        stages["autograde"] = round(time.monotonic() - began - stages["setup"], 2)
        if watch.kernel_started:
            stages["kernel_start"] = round(watch.kernel_started - mark, 2)
        kernel_text = kernel.close()
        log += ["== nbgrader autograde", done.get("log", "").rstrip(), done.get("error", "").rstrip()]
        log += ["== the kernel's error output", kernel_text.rstrip()]
        if not done["success"]:
            if watch.kernel_died and watch.sanitized is not None:
                graded.notes.append(f"Your notebook's kernel died while it ran ({watch.cells_started} code cells had "
                                    "started): the outputs below stop there. Every graded part was still decided in "
                                    "a fresh process from your code.")
                import nbformat

                # nbgrader removed the failed run's folder: the notebook as it was about to run stands in for it.
                shutil.copytree(job.submitted, job.autograded, dirs_exist_ok=True)
                os.chmod(job.notebook, 0o644)
                nbformat.write(watch.sanitized, job.notebook)
            else:
                graded.failure = "learner" if watch.kernel_died else "infrastructure"
                graded.error = _telling_line(kernel_text, watch.error, done.get("error", ""))
                return graded
        if job.clean_process is None:  # no restored copy was seen: now, from the notebook as it was to run
            import nbformat

            job.start_clean(watch.sanitized if watch.sanitized is not None else
                            nbformat.read(job.notebook, as_version=4))
        waited = time.monotonic()
        results, head, stopped, clean_errors = job.finish_clean()
        stages["clean"] = round(time.monotonic() - (job.clean_started or waited), 2)
        stages["clean_after_kernel"] = round(time.monotonic() - waited, 2)
        if "ready" in head:
            stages["clean_ready"] = head["ready"]
        log += ["== clean re-grade" + (f" (stopped: {stopped})" if stopped else ""),
                *(json.dumps(r) for r in results), clean_errors.rstrip()]
        if stopped and not results:
            graded.failure, graded.error = "infrastructure", f"the clean re-grade failed: {stopped}"
            return graded
        settled = time.monotonic()
        graded.left_out = head.get("left_out", [])
        graded.parts = settle(job, results, graded.left_out, stopped, graded.notes)
        import nbformat

        graded.cells = cell_times(nbformat.read(job.notebook, as_version=4))
        stages["settle"] = round(time.monotonic() - settled, 2)
        made = job.api().generate_feedback(task.lesson, task.student, force=True)
        stages["feedback"] = round(time.monotonic() - settled - stages["settle"], 2)
        log += ["== nbgrader generate_feedback", made.get("log", "").rstrip(), made.get("error", "").rstrip()]
        if not made["success"]:
            graded.failure = "infrastructure"
            graded.error = "feedback: " + _telling_line("", None, made.get("error", ""))
            return graded
        graded.files = take(job.work, task.student, task.lesson)
        graded.gradebook = rows(job.work / "gradebook.db", task.lesson, task.student)
        graded.status = "ok"
        return graded
    except Exception as exc:  # noqa: BLE001 - a fault of the grading machinery: recorded, tried again
        import traceback

        log.append("== grading broke\n" + traceback.format_exc())
        graded.failure, graded.error = "infrastructure", f"{type(exc).__name__}: {exc}"
        return graded
    finally:  # also when the run is stopped (Ctrl-C): nothing of the work folder is kept
        kernel.close()
        job.remove()
        graded.seconds = round(time.monotonic() - began, 2)
        if graded.error:
            log.append(f"== {graded.failure or 'failed'}: {graded.error}")
        graded.log = "\n".join(part for part in log if part) + "\n"
