"""*autograde*: nbgrader's autograde of one submission, run in this process and watched from inside.

:func:`autograde` is the step (:mod:`autograder.grading.submission`): nbgrader restores the
notebook's deleted and edited cells, then runs it in a fresh kernel inside the grading sandbox
(:mod:`autograder.grading.sandbox`), whose error output a :class:`Tail` keeps.

nbgrader grades a notebook in two passes of preprocessors, each handed the notebook and a
``resources`` dict that travels with it: the sanitising pass (cells restored, outputs cleared)
and the pass that runs it in a kernel. :func:`run_nbgrader` runs nbgrader's own converter with a
:class:`Watch` in the resources of every notebook (:class:`WatchedAutograde`), and two
preprocessors added to the passes write into it what grading needs to know:
:class:`KeepSanitized`, the last of the sanitising pass, keeps the notebook as it is about to
run and hands it at once to the watch's callback (the clean re-grade starts from it, beside the
kernel: :func:`autograder.grading.regrade.start`); :class:`WatchedExecute`, nbgrader's
``Execute``, notes when the kernel answered, how many code cells started and what ended the run,
and leaves out the cells that make nothing a graded cell uses (the lesson's demonstrations:
:mod:`autograder.grading.unused`), which are most of a run's time and none of its use, since
the clean re-grade decides every part.
Typed facts, so that how a run ended is never guessed from log text; and nothing global, so each
submission's watch is its own.

Example (with nbgrader's API over a work folder)::

    watch = Watch(on_sanitized=print)
    done = run_nbgrader(api, "04-ring-all-reduce", "ana", watch)
    done["success"], watch.kernel_died, watch.cells_started     # (True, False, 31)
"""

from __future__ import annotations

import copy
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import nbformat
from nbgrader.converters import Autograde
from nbgrader.preprocessors import Execute, NbGraderPreprocessor

from ..kit.torchrun_programs import clip
from . import regrade
from .task import Unfinished
from .unused import NOT_RUN, cells_to_leave_out
from .workfolder import Job, Tail, warm_up

__all__ = ["autograde", "run_nbgrader", "telling_line", "Watch", "WatchedAutograde", "KeepSanitized", "WatchedExecute"]


@dataclass
class Watch:
    """What :class:`KeepSanitized` and :class:`WatchedExecute` saw of one autograde."""

    sanitized: Any = None  # the notebook as it was about to run: cells restored, outputs cleared
    on_sanitized: Callable[[Any], None] | None = None  # called with it, before the kernel starts
    kernel_started: float | None = None  # time.time() when the kernel answered
    cells_started: int = 0  # code cells sent to the kernel
    left_out: int = 0  # code cells not run: they make nothing a graded cell uses (autograder/grading/unused.py)
    error: BaseException | None = None  # what ended the run early, if anything did

    def __deepcopy__(self, memo: dict) -> Watch:
        """Itself: nbconvert deep-copies a notebook's resources before its preprocessors run, and what they note
        must reach this watch, not a copy."""
        return self

    @property
    def kernel_died(self) -> bool:
        """The kernel started, ran cells and then died (a learner's ``os._exit``, a crash in C)."""
        from nbclient.exceptions import DeadKernelError

        return isinstance(self.error, DeadKernelError) and self.cells_started > 0


def _watch(resources: Any) -> Watch:
    """The watch in a notebook's resources; a throw-away one where nbgrader runs these preprocessors unwatched."""
    found = resources.get("watch") if resources else None
    return found if isinstance(found, Watch) else Watch()


class KeepSanitized(NbGraderPreprocessor):
    """The last sanitising step: keep a copy of the notebook as it is about to run, and hand it on."""

    def preprocess(self, nb, resources):
        watch = _watch(resources)
        watch.sanitized = copy.deepcopy(nb)
        if watch.on_sanitized is not None:
            watch.on_sanitized(watch.sanitized)
        return nb, resources


class WatchedExecute(Execute):
    """nbgrader's Execute, noting in the watch when the kernel answered, how many cells ran, and what stopped it;
    a cell that makes nothing a graded cell uses (a demonstration: :mod:`autograder.grading.unused`) is not run, and
    says so in its output."""

    left_out: set[int] = set()

    def start_new_kernel_client(self):
        client = super().start_new_kernel_client()
        _watch(self.resources).kernel_started = time.time()  # nbconvert keeps the notebook's resources there
        return client

    def preprocess_cell(self, cell, resources, index):
        if index in self.left_out:  # it makes nothing a graded cell uses (autograder/grading/unused.py)
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=NOT_RUN)]
            cell.execution_count = None
            return cell, resources
        if cell.cell_type == "code" and cell.source.strip():
            _watch(resources).cells_started += 1
        return super().preprocess_cell(cell, resources, index)

    def preprocess(self, nb, resources=None, km=None):
        self.left_out = cells_to_leave_out(nb)
        _watch(resources).left_out = len(self.left_out)
        try:
            return super().preprocess(nb, resources, km=km)
        except BaseException as exc:
            _watch(resources).error = exc
            raise


class WatchedAutograde(Autograde):
    """nbgrader's Autograde with ``watch`` in every notebook's resources, and the two watching preprocessors added
    to the course's passes (:class:`KeepSanitized` last of the sanitising one, :class:`WatchedExecute` in place of
    ``Execute``)."""

    def __init__(self, watch: Watch, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.watch = watch
        self.sanitize_preprocessors = [*self.sanitize_preprocessors, KeepSanitized]
        self.autograde_preprocessors = [WatchedExecute if p in (Execute, "nbgrader.preprocessors.Execute") else p
                                        for p in self.autograde_preprocessors]

    def init_single_notebook_resources(self, notebook_filename: str) -> dict[str, Any]:
        resources = super().init_single_notebook_resources(notebook_filename)
        resources["watch"] = self.watch
        return resources


def autograde(job: Job) -> Any:
    """*autograde*: nbgrader restores the job's notebook and runs it in a fresh kernel in the sandbox (the clean
    re-grade starts from inside, once the restored notebook exists); returns that notebook as it was about to run
    (None if nbgrader never got so far). :class:`Unfinished` when the run failed, unless the learner's kernel died:
    then every part is still decided from their code, and the record says so."""
    task, started = job.task, time.monotonic()
    watch, kernel, wall = Watch(on_sanitized=lambda notebook: regrade.start(job, notebook)), Tail(), time.time()
    try:
        with _kernel_specs_first(job):
            done = run_nbgrader(_api(job, kernel.path), task.lesson, task.student, watch)
    finally:
        kernel_text = kernel.close()
    job.graded.stages["autograde"] = round(time.monotonic() - started, 2)
    if watch.kernel_started:
        job.graded.stages["kernel_start"] = round(watch.kernel_started - wall, 2)
    job.log += ["== nbgrader autograde", f"{watch.left_out} code cells not run: they make nothing a graded cell uses",
                done.get("log", "").rstrip(), done.get("error", "").rstrip(),
                "== the kernel's error output", kernel_text.rstrip()]
    if done["success"]:
        return watch.sanitized
    if not (watch.kernel_died and watch.sanitized is not None):
        raise Unfinished("learner" if watch.kernel_died else "infrastructure",
                         telling_line(kernel_text, watch.error, done.get("error", "")))
    job.graded.notes.append(f"Your notebook's kernel died while it ran ({watch.cells_started} code cells had "
                            "started): the outputs below stop there. Every graded part was still decided in a "
                            "fresh process from your code.")
    # nbgrader removed the failed run's folder: the notebook as it was about to run stands in for it.
    shutil.copytree(job.submitted, job.autograded, dirs_exist_ok=True)
    os.chmod(job.notebook, 0o644)
    nbformat.write(watch.sanitized, job.notebook)
    return watch.sanitized


def _api(job: Job, kernel_stderr: str) -> Any:
    """nbgrader's API over the job's folder, set up to autograde: the kernel in the sandbox (its spec in
    ``jupyter/``, found first while :func:`_kernel_specs_first`), over Unix sockets, its error output to
    ``kernel_stderr``."""
    from ..notebooks.generate import nbgrader_api
    from ..kit.exercise import CLEAN_RUN_DECIDES
    from .sandbox import kernel_spec

    # HELPERS_START_AHEAD=0: the kernel's cells launch nothing while they are graded (the checks run in the clean
    # re-grade, the demonstrations are left out), so no rank factory is started ahead; a launch still starts one.
    env = {"NBGRADER_EXECUTION": "autograde", CLEAN_RUN_DECIDES: "1", "HELPERS_START_AHEAD": "0",
           **warm_up(job.task.lesson, clean=False)}
    job.autograded.mkdir(parents=True, exist_ok=True)
    box = job.box([job.autograded, job.runtime], env) if job.task.sandboxed else None
    kernel_spec(job.folder / "jupyter", box, stderr=kernel_stderr, env=env)
    return nbgrader_api(job.folder, **{
        "KernelManager.transport": "ipc",
        "KernelManager.ip": str(job.runtime / "kernel"),
        "KernelManager.connection_file": str(job.runtime / "kernel.json"),
    })


@contextmanager
def _kernel_specs_first(job: Job) -> Iterator[None]:
    """Meanwhile, kernel specs are looked up in the job's ``jupyter/`` first (the sandboxed kernel's spec): a kernel
    reads JUPYTER_PATH when it starts, and a grading process grades one submission at a time."""
    saved = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = os.pathsep.join(p for p in (str(job.folder / "jupyter"), saved) if p)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("JUPYTER_PATH", None)
        else:
            os.environ["JUPYTER_PATH"] = saved


def telling_line(kernel: str, error: BaseException | None, nbgrader_error: str) -> str:
    """The one line that says what went wrong: bubblewrap's message, the kernel's last words, the error."""
    lines = [line.strip() for line in kernel.splitlines() if line.strip()]
    bwrap = [line for line in lines if line.startswith("bwrap:")]
    if bwrap:
        return bwrap[-1]
    said = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}" if error else ""
    if lines and error is not None:
        return f"{said} (the kernel's last words: {clip(lines[-1], 300)})"
    if said:
        return said
    found = [line for line in nbgrader_error.strip().splitlines() if line.strip() and "above traceback" not in line]
    return found[-1].strip() if found else "nbgrader failed without a message"


def run_nbgrader(api: Any, lesson: str, student: str, watch: Watch) -> dict[str, Any]:
    """Autograde ``student``'s ``lesson`` with nbgrader's ``api`` as ``NbGraderAPI.autograde`` does (forced, the
    student added if new), watched by ``watch``; nbgrader's answer: ``success``, and ``log`` and ``error`` text."""
    from nbgrader.utils import capture_log, temp_attrs

    with temp_attrs(api.coursedir, assignment_id=lesson, student_id=student):
        app = WatchedAutograde(watch, coursedir=api.coursedir, parent=api)
        app.force = True
        app.create_student = True
        return capture_log(app)
