"""One submission's private work folder: the first step of its grading, and where the others work.

:func:`open_job` is the *set-up* step (:mod:`autograder.grading.submission`): on a machine that
may grade the task, a :class:`Job` writes what the task carries (nbgrader's configuration, the
lesson's instructor folder and released notebook, the gradebook template and the submission)
into a folder of its own, and the handed-in file must be a notebook of that lesson. The job also
carries the record its steps write (:attr:`Job.graded`, :attr:`Job.log`). :class:`Tail` and
:func:`text_tail` keep the start and end of what a child process writes to its error output, so
a flood costs nothing. :func:`sweep` removes the work folders of grading processes that were
killed before they could.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from .task import Graded, Task, Unfinished, write_files

__all__ = ["Job", "open_job", "warm_up", "Tail", "text_tail", "sweep", "PREFIX"]


#: Work folders are ``<tmp>/course-grading-<pid of the grading process>-<random>``.
PREFIX = "course-grading-"


#: The most of a process's error output kept in the log (its start and its end).
_KEEP_BYTES = 64 << 10


def warm_up(lesson: str, clean: bool) -> dict[str, str]:
    """``HELPERS_WARM_UP`` for the rank factory of a kernel (``clean`` False) or of the clean re-grade
    of ``lesson`` (the sandbox passes ``HELPERS_*`` on): ahead ("now") for the clean re-grade and when
    idle (the default) for the kernel where its ranks import ``torch._dynamo``, never ("off") where
    they do not: about a second of CPU saved per process (:func:`autograder.kit.registry.warm_ranks`;
    without it lesson 05's clean checks took 10.3 s instead of 4.2 s). The clean re-grade's factory is a
    fork of it, made first thing (:mod:`autograder.grading.clean`)."""
    from ..notebooks.cells import lesson_number
    from ..kit.registry import warm_ranks

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
    """One submission's work folder, with the record that grading it writes (:attr:`graded`, :attr:`log`)."""

    def __init__(self, task: Task, graded: Graded) -> None:
        self.task, self.graded = task, graded
        self.log: list[str] = []  # what each step has to say, in order; the record's log is made from it
        self.folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
        self.work = self.folder / "autograder"
        try:
            write_files(self.folder, task.course)  # nbgrader_config.py, solutions/<lesson>/, course/<lesson>/...
            write_files(self.submitted, task.submitted)
        except BaseException:
            shutil.rmtree(self.folder, ignore_errors=True)
            raise
        self.autograded = self.work / "autograded" / task.student / task.lesson
        self.runtime = self.folder / "runtime"
        self.runtime.mkdir()
        self.clean_folder = self.folder / "clean"
        self.clean_folder.mkdir()
        self.clean_process: subprocess.Popen | None = None  # the clean re-grade (autograder.grading.regrade)
        self.clean_started: float | None = None

    @property
    def submitted(self) -> Path:
        return self.work / "submitted" / self.task.student / self.task.lesson

    @property
    def solution(self) -> Path:
        """The lesson's instructor notebook, as the task carried it."""
        return self.folder / _solution(self.task.lesson)

    @property
    def notebook(self) -> Path:
        """The graded notebook, once nbgrader has made it."""
        return self.autograded / f"{self.task.lesson}.ipynb"

    def box(self, writable: list[Path], env: dict[str, str] | None = None):
        """The sandbox for this job's learner code: the course and this folder out of sight but ``writable``."""
        from ..paths import ROOT
        from .sandbox import Sandbox

        return Sandbox(writable=writable, hidden=[ROOT, self.folder], env=env or {})

    def remove(self) -> None:
        if self.clean_process is not None and self.clean_process.poll() is None:
            os.killpg(self.clean_process.pid, 9)
            self.clean_process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def open_job(task: Task, graded: Graded) -> Job:
    """*set-up*: the task's work folder, holding a notebook of its lesson. Refused (:class:`Unfinished`, the grading
    machinery's) on a machine that cannot sandbox the learner's code when the task asks for it, or that cannot
    write the folder; the learner's when the file handed in is no notebook of this lesson."""
    started = time.monotonic()
    refused = _refusal(task)
    if refused:
        raise Unfinished("infrastructure", refused)
    handed_in = task.submitted.get(f"{task.lesson}.ipynb")
    unreadable = _unreadable(handed_in) or _another_lesson(handed_in, task.course[_solution(task.lesson)], task.lesson)
    if unreadable:
        raise Unfinished("learner", unreadable)
    try:
        job = Job(task, graded)
    except Exception as exc:  # noqa: BLE001 - a disk that is full, a task that would write outside its folder
        raise Unfinished("infrastructure", f"setting up the work folder: {type(exc).__name__}: {exc}") from None
    job.log.append(f"== work folder {job.folder}")
    graded.stages["setup"] = round(time.monotonic() - started, 2)
    return job


def _solution(lesson: str) -> str:
    """Where the lesson's instructor notebook lies in a task's course files, and in the work folder."""
    return f"solutions/{lesson}/{lesson}.ipynb"


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


def _unreadable(data: bytes | None) -> str | None:
    """None when ``data`` is a notebook nbformat can read; else why not, for the learner."""
    import nbformat

    if data is None:
        return "no notebook was handed in"
    try:
        nbformat.reads(data.decode("utf-8"), as_version=4)
        return None
    except Exception as exc:  # noqa: BLE001 - any way a file can fail to be a notebook
        return f"the notebook file cannot be read ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"


def _graded_ids(data: bytes) -> set[str]:
    """The nbgrader grade_ids of a notebook's cells."""
    import nbformat

    cells = nbformat.reads(data.decode("utf-8"), as_version=4).cells
    return {c.metadata["nbgrader"]["grade_id"] for c in cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id")}


def _another_lesson(handed_in: bytes, solution: bytes, lesson: str) -> str | None:
    """Why the notebook ``handed_in`` is not a submission of ``lesson`` (its nbgrader cells all belong to another
    lesson: a learner handed in the wrong notebook under this one's name), or None."""
    theirs, ours = _graded_ids(handed_in), _graded_ids(solution)
    if not theirs or theirs & ours:
        return None  # a notebook of this lesson, or one whose cells grading puts back as they were released
    shown = ", ".join(sorted(theirs)[:4]) + (", ..." if len(theirs) > 4 else "")
    return (f"the notebook handed in as {lesson} is another lesson's: none of its nbgrader cells ({shown}) belongs "
            f"to {lesson}. The learner should hand in {lesson}/{lesson}.ipynb")


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
