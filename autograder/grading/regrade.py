"""The clean re-grade of one submission, as a process beside its kernel: started, waited for, read.

:func:`start` runs :mod:`autograder.grading.clean` on the notebook as it was about to run, in the
sandbox, as a process of its own session; the autograde step starts it from inside nbgrader as
soon as that notebook exists (:class:`autograder.grading.autograde.Watch`), so it runs while
the kernel does. :func:`regrade` is the *clean re-grade* step (:mod:`autograder.grading.submission`):
it waits for that process (starting it first if nothing started it) and returns its
:class:`Verdicts`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any, NamedTuple

from ..hidden.sealed import environment, open_sealed
from .task import Unfinished
from .workfolder import Job, text_tail, warm_up

__all__ = ["Verdicts", "regrade", "start", "CLEAN_TIMEOUT"]

#: Seconds the clean re-grade of one submission may take before its unfinished parts score 0.
CLEAN_TIMEOUT = float(os.environ.get("COURSE_CLEAN_TIMEOUT", "600"))


class Verdicts(NamedTuple):
    """What the clean re-grade decided: one result per part, the definitions it left out, why it stopped early."""

    results: list[dict[str, Any]]
    left_out: list[str]
    stopped: str | None


def start(job: Job, notebook: Any) -> None:
    """Start the clean re-grade of ``notebook`` (the restored one, before it runs) in the background."""
    import nbformat

    from ..notebooks.cells import lesson_number

    copy = job.clean_folder / "submission.ipynb"
    nbformat.write(notebook, copy)
    lesson = lesson_number(job.notebook)
    argv = [sys.executable, "-m", "autograder.grading.clean", str(copy), str(lesson)]
    # The answers the hidden checks compare with, open for the clean re-grade alone (autograder.hidden.sealed):
    # the sandbox hides their files, and the re-grade reads the descriptors before the learner's code runs.
    sealed = open_sealed(lesson)
    factory_env = {**warm_up(job.task.lesson, clean=True), **environment(sealed)}
    if job.task.sandboxed:
        argv = job.box([job.clean_folder], factory_env).wrap(argv)
    env = dict(os.environ, PYTHONUNBUFFERED="1", **factory_env)
    env.pop("COURSE_CLEAN_RUN_DECIDES", None)
    try:
        with (job.folder / "clean.out").open("wb") as out, (job.folder / "clean.err").open("wb") as err:
            job.clean_started = time.monotonic()
            job.clean_process = subprocess.Popen(argv, cwd=job.clean_folder, env=env, stdout=out, stderr=err,
                                                 stdin=subprocess.DEVNULL, start_new_session=True,
                                                 pass_fds=tuple(sealed.values()))
    finally:
        for fd in sealed.values():
            os.close(fd)


def regrade(job: Job, sanitized: Any) -> Verdicts:
    """*clean re-grade*: every graded part decided in a fresh process from the learner's definitions alone. Started
    now from ``sanitized`` (the notebook as it was about to run; None: the graded notebook) unless the autograde
    step started it; :class:`Unfinished` when it decided nothing."""
    if job.clean_process is None:  # no restored copy was seen: now, from the notebook as it was to run
        import nbformat

        start(job, sanitized if sanitized is not None else nbformat.read(job.notebook, as_version=4))
    waited = time.monotonic()
    results, head, stopped, errors = _finish(job)
    stages = job.graded.stages
    stages["clean"] = round(time.monotonic() - (job.clean_started or waited), 2)
    stages["clean_after_kernel"] = round(time.monotonic() - waited, 2)
    if "ready" in head:
        stages["clean_ready"] = head["ready"]
    job.log += ["== clean re-grade" + (f" (stopped: {stopped})" if stopped else ""),
                *(json.dumps(r) for r in results), errors.rstrip()]
    if stopped and not results:
        raise Unfinished("infrastructure", f"the clean re-grade failed: {stopped}")
    return Verdicts(results, head.get("left_out", []), stopped)


def _finish(job: Job) -> tuple[list[dict[str, Any]], dict[str, Any], str | None, str]:
    """Wait for the clean re-grade: (one result per part, its first line, why it stopped early or None, its log)."""
    process, stopped = job.clean_process, None
    if process is None:
        return [], {}, "it did not start", ""
    remaining = CLEAN_TIMEOUT - (time.monotonic() - (job.clean_started or time.monotonic()))
    try:
        code = process.wait(timeout=max(1.0, remaining))
        if code != 0:
            stopped = f"it exited with code {code}"
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)  # its own session: the sandbox and everything in it
        process.wait()
        stopped = f"it did not finish within {CLEAN_TIMEOUT:g} s and was stopped"
    lines = []
    for line in (job.folder / "clean.out").read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                lines.append(json.loads(line))
            except ValueError:
                pass
    head = next((line for line in lines if "left_out" in line), {})
    errors = text_tail(job.folder / "clean.err")
    if stopped and errors.strip():
        stopped += ": " + errors.strip().splitlines()[-1]
    return [line for line in lines if "part" in line], head, stopped, errors
