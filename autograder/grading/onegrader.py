"""One collect or grade of a course at a time: a lock on the course's grading folder.

Two ``make collect`` (or ``make grade``) runs on one course folder at once, by one instructor in
two terminals or by two instructors, would write the same gradebook (``autograder/gradebook.db``),
``submitted/``, ``autograded/`` and ``grades.csv`` side by side. :func:`grading_lock` takes an
exclusive ``flock`` on ``autograder/.grading.lock`` for the whole run; a second run stops at once
with a message naming who holds it (their Unix user, the command, its pid and start time) and
what to do. The kernel drops the lock when its process ends, however it ends: a crashed run never
leaves a lock behind. Nested use in one process (collect, then the grade it runs) takes it once.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import sys
import time
from contextlib import contextmanager
from pathlib import Path

__all__ = ["GradingBusy", "grading_lock"]

_held: set[Path] = set()


class GradingBusy(RuntimeError):
    """Another collect or grade of this course runs, or this user may not write its grading folder."""


def _me() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"


@contextmanager
def grading_lock(work: Path, command: str | None = None):
    """Hold the course's grading lock in folder ``work`` (``autograder/``) for the ``with`` block."""
    work = work.resolve()
    if work in _held:
        yield
        return
    if not work.exists() and os.access(work.parent, os.W_OK):
        work.mkdir(parents=True)
    path = work / ".grading.lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644) if os.access(work, os.W_OK) else -1
    except OSError:
        fd = -1
    if fd < 0:
        target = path if path.exists() else work
        owner = pwd.getpwuid(target.stat().st_uid).pw_name if target.exists() else "nobody yet"
        raise GradingBusy(
            f"{_me()} cannot write the course's grading folder {work} or its lock (it belongs to {owner}): grading "
            f"writes the gradebook there. One instructor grades a course folder: run `make collect` as {owner} (in their hub "
            f"server's terminal), or give {_me()} the rights (`chown -R {_me()}: {work.parent}` moves the course "
            f"to {_me()}, and `make hub HUB_INSTRUCTOR={_me()}` then names them the hub's instructor).")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "a process that wrote no details"
            raise GradingBusy(
                f"another collect or grade of this course is running ({holder}); two at once would write the same "
                f"gradebook ({work / 'gradebook.db'}). Wait until it ends, then run yours again: it picks up "
                f"whatever the other did not. Nothing needs removing if that process died: the lock ends with it."
            ) from None
        os.ftruncate(fd, 0)
        what = command or " ".join(["python -m autograder", *sys.argv[1:]])
        os.pwrite(fd, f"`{what}` by {_me()}, pid {os.getpid()}, since {time.strftime('%H:%M:%S %Z')}".encode(), 0)
        _held.add(work)
        try:
            yield
        finally:
            _held.discard(work)
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)
