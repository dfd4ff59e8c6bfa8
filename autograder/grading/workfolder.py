"""One submission's private work folder, and the nbgrader and clean re-grade runs inside it.

:class:`Job` writes what its task carries (nbgrader's configuration, the lesson's instructor
folder, the gradebook template and the submission) into a folder of its own, gives nbgrader's API over it (set up to run the kernel in the grading
sandbox), and starts and waits for the clean re-grade (:mod:`autograder.grading.clean`) as a
process of its own session. :class:`Tail` keeps the start and end of what a child process
writes to its error output, so a flood costs nothing. :func:`sweep` removes the work folders
of grading processes that were killed before they could.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from .task import Task, write_files

__all__ = ["Job", "Tail", "text_tail", "sweep", "RANK_FACTORY_ENV", "warm_up", "CLEAN_TIMEOUT", "PREFIX"]


#: Seconds the clean re-grade of one submission may take before its unfinished parts score 0.
CLEAN_TIMEOUT = float(os.environ.get("COURSE_CLEAN_TIMEOUT", "600"))


#: Work folders are ``<tmp>/course-grading-<pid of the grading process>-<random>``.
PREFIX = "course-grading-"


#: The most of a process's error output kept in the log (its start and its end).
_KEEP_BYTES = 64 << 10


#: For the clean re-grade (the sandbox passes ``HELPERS_*`` on): its rank factory is a fork of it,
#: made first thing (autograder.grading.clean), not a fresh interpreter started when helpers is
#: imported. For a lesson whose ranks build optimizers the factory also imports at once what each of
#: them would import again (see ``helpers._runtime.factory_process``; without it lesson 05's clean
#: checks took 10.3 s instead of 4.2 s); for the other lessons, never (:func:`warm_up`).
RANK_FACTORY_ENV = {"HELPERS_PRESTART": "0"}


def warm_up(lesson: str, clean: bool) -> dict[str, str]:
    """``HELPERS_WARM_UP`` for the rank factory of a kernel (``clean`` False) or of the clean re-grade
    of ``lesson``: ahead ("now") for the clean re-grade and when idle (the default) for the kernel
    where its ranks import ``torch._dynamo``, never ("off") where they do not: about a second of CPU
    saved per process (:func:`autograder.lessons.registry.warm_ranks`)."""
    from ..course.cells import lesson_number
    from ..lessons.registry import warm_ranks

    if not warm_ranks(lesson_number(Path(f"{lesson}.ipynb")), "checks" if clean else "kernel"):
        return {"HELPERS_WARM_UP": "off"}
    return {"HELPERS_WARM_UP": "now"} if clean else {}


class Tail:
    """A pipe whose other end a child process writes; a thread keeps its first and last bytes.

    Its :attr:`path` (``/proc/<this pid>/fd/<n>``) opens the pipe's writing end from another
    process, so a kernel that floods its error output costs this process nothing.
    """

    def __init__(self) -> None:
        self._read, write = os.pipe()
        self._write: int | None = write
        self.path = f"/proc/{os.getpid()}/fd/{write}"
        self._head, self._tail, self._dropped = bytearray(), bytearray(), 0
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        while True:
            try:
                data = os.read(self._read, 1 << 16)
            except OSError:
                data = b""
            if not data:
                break
            room = _KEEP_BYTES // 8 - len(self._head)
            if room > 0:
                self._head += data[:room]
                data = data[room:]
            self._tail += data
            if len(self._tail) > _KEEP_BYTES:
                self._dropped += len(self._tail) - _KEEP_BYTES
                del self._tail[:len(self._tail) - _KEEP_BYTES]
        os.close(self._read)

    def close(self) -> str:
        """Stop writing here (children may still hold the pipe: wait briefly), and return what was kept."""
        if self._write is not None:
            os.close(self._write)
            self._write = None
            self._thread.join(timeout=2.0)
        gap = f"\n[... {self._dropped} bytes left out ...]\n" if self._dropped else ""
        return (bytes(self._head) + gap.encode() + bytes(self._tail)).decode("utf-8", "replace")


def text_tail(path: Path) -> str:
    """The start and end of a file a child process wrote (at most :data:`_KEEP_BYTES`)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            if size <= _KEEP_BYTES:
                return f.read().decode("utf-8", "replace")
            head = f.read(_KEEP_BYTES // 8)
            f.seek(size - _KEEP_BYTES * 7 // 8)
            tail = f.read()
        return (head + f"\n[... {size - len(head) - len(tail)} bytes left out ...]\n".encode() + tail).decode(
            "utf-8", "replace")
    except OSError:
        return ""


class Job:
    """One submission's work folder, and the nbgrader and clean runs inside it."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self.folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
        self.work = self.folder / "autograder"
        try:
            write_files(self.folder, task.course)  # nbgrader_config.py, solutions/<lesson>/, autograder/gradebook.db
            write_files(self.submitted, task.submitted)
        except BaseException:
            shutil.rmtree(self.folder, ignore_errors=True)
            raise
        self.autograded = self.work / "autograded" / task.student / task.lesson
        self.runtime = self.folder / "runtime"
        self.runtime.mkdir()
        self.clean_folder = self.folder / "clean"
        self.clean_folder.mkdir()
        self.clean_process: subprocess.Popen | None = None
        self.clean_started: float | None = None

    @property
    def submitted(self) -> Path:
        return self.work / "submitted" / self.task.student / self.task.lesson

    @property
    def solution(self) -> Path:
        """The lesson's instructor notebook, as the task carried it."""
        return self.folder / "solutions" / self.task.lesson / f"{self.task.lesson}.ipynb"

    @property
    def notebook(self) -> Path:
        return self.autograded / f"{self.task.lesson}.ipynb"

    def box(self, writable: list[Path], env: dict[str, str] | None = None):
        from ..course.build import ROOT
        from .sandbox import Sandbox

        return Sandbox(writable=writable, hidden=[ROOT, self.folder], env=env or {})

    def api(self, kernel_stderr: str | None = None) -> Any:
        """nbgrader's API over this work folder; with ``kernel_stderr``, set up to autograde: the kernel in
        the sandbox (from the spec in ``jupyter/``, which goes first on JUPYTER_PATH while it starts), over
        Unix sockets, its error output to that file, and watched (autograder.course.preprocessors)."""
        from nbgrader.converters import Autograde
        from nbgrader.preprocessors import Execute

        from ..course.build import nbgrader_api
        from ..lessons.kit import CLEAN_RUN_DECIDES
        from ..course.preprocessors import SANITIZE, KeepSanitized, WatchedExecute
        from .sandbox import kernel_spec

        if kernel_stderr is None:
            return nbgrader_api(self.folder)
        env = {"NBGRADER_EXECUTION": "autograde", CLEAN_RUN_DECIDES: "1", "HELPERS_PRESTART": "1",
               **warm_up(self.task.lesson, clean=False)}
        self.autograded.mkdir(parents=True, exist_ok=True)
        box = self.box([self.autograded, self.runtime], env) if self.task.sandboxed else None
        kernel_spec(self.folder / "jupyter", box, stderr=kernel_stderr, env=env)
        return nbgrader_api(self.folder, **{
            "Autograde.sanitize_preprocessors": [*SANITIZE, KeepSanitized],
            "Autograde.autograde_preprocessors": [WatchedExecute if p is Execute else p for p in
                                                  Autograde.class_traits()["autograde_preprocessors"].default()],
            "KernelManager.transport": "ipc",
            "KernelManager.ip": str(self.runtime / "kernel"),
            "KernelManager.connection_file": str(self.runtime / "kernel.json"),
        })

    def start_clean(self, notebook: Any) -> None:
        """Start the clean re-grade of ``notebook`` (the restored one, before it runs) in the background."""
        import nbformat

        from ..course.cells import lesson_number

        copy = self.clean_folder / "submission.ipynb"
        nbformat.write(notebook, copy)
        from ..lessons.registry import sealed_modules
        from ..lessons.sealed import environment

        lesson = lesson_number(self.notebook)
        argv = [sys.executable, "-m", "autograder.grading.clean", str(copy), str(lesson)]
        # The instructor modules the hidden checks need, open for the clean re-grade alone (lessons/sealed.py).
        sealed = {name: os.open(Path(__file__).resolve().parents[1] / "lessons" / f"{name}.py", os.O_RDONLY)
                  for name in sealed_modules(lesson)}
        factory_env = {**RANK_FACTORY_ENV, **warm_up(self.task.lesson, clean=True), **environment(sealed)}
        if self.task.sandboxed:
            argv = self.box([self.clean_folder], factory_env).wrap(argv)
        env = dict(os.environ, PYTHONUNBUFFERED="1", **factory_env)
        env.pop("COURSE_CLEAN_RUN_DECIDES", None)
        try:
            with (self.folder / "clean.out").open("wb") as out, (self.folder / "clean.err").open("wb") as err:
                self.clean_started = time.monotonic()
                self.clean_process = subprocess.Popen(argv, cwd=self.clean_folder, env=env, stdout=out, stderr=err,
                                                      stdin=subprocess.DEVNULL, start_new_session=True,
                                                      pass_fds=tuple(sealed.values()))
        finally:
            for fd in sealed.values():
                os.close(fd)

    def finish_clean(self) -> tuple[list[dict[str, Any]], dict[str, Any], str | None, str]:
        """Wait for the clean re-grade: (one result per part, its first line, why it stopped early or None, its log)."""
        process, stopped = self.clean_process, None
        if process is None:
            return [], {}, "it did not start", ""
        remaining = CLEAN_TIMEOUT - (time.monotonic() - (self.clean_started or time.monotonic()))
        try:
            code = process.wait(timeout=max(1.0, remaining))
            if code != 0:
                stopped = f"it exited with code {code}"
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)  # its own session: the sandbox and everything in it
            process.wait()
            stopped = f"it did not finish within {CLEAN_TIMEOUT:g} s and was stopped"
        lines = []
        for line in (self.folder / "clean.out").read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    lines.append(json.loads(line))
                except ValueError:
                    pass
        head = next((line for line in lines if "left_out" in line), {})
        errors = text_tail(self.folder / "clean.err")
        if stopped and errors.strip():
            stopped += ": " + errors.strip().splitlines()[-1]
        return [line for line in lines if "part" in line], head, stopped, errors

    def remove(self) -> None:
        if self.clean_process is not None and self.clean_process.poll() is None:
            os.killpg(self.clean_process.pid, 9)
            self.clean_process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(folder: Path | None = None) -> list[Path]:
    """Remove the work folders whose grading process has gone (killed before it could); returns them.

    A worker killed while it graded (``kill -9``, out of memory, a lost machine) leaves its work
    folder behind: the next worker process started on that machine clears it.
    """
    removed = []
    for path in Path(folder or tempfile.gettempdir()).glob(f"{PREFIX}*-*"):
        pid = path.name[len(PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
