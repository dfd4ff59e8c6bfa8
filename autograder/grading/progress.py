"""The progress line of a grading run: how many are graded, how many run where, and the time left.

Shown once a run has taken a few seconds. In a terminal it is one line, redrawn in place
every second (and cleared before anything else is printed); in a log (output that is not a
terminal) it is a plain line every half minute.

Example::

    >>> import io
    >>> progress = Progress(30, out=io.StringIO(), after=0)
    >>> progress.workers(2)
    >>> for _ in range(10):
    ...     progress.done(ok=True)
    >>> progress.line(running=2, elapsed=100.0)
    '[######..............] 10 of 30 graded, 2 running on 2 workers, 1 min 40 s so far, about 3 min 20 s left'
    >>> duration(3725)
    '1 h 2 min'
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress", "duration"]


def duration(seconds: float) -> str:
    """``45`` -> ``'45 s'``, ``130`` -> ``'2 min 10 s'``, ``3725`` -> ``'1 h 2 min'``."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


class Progress:
    """Counts of one run, and the line that shows them."""

    WIDTH = 20

    def __init__(self, total: int, out: TextIO | None = None, after: float = 3.0, every: float = 30.0) -> None:
        self.total, self.finished, self.failed, self.threads, self.most_threads = total, 0, 0, 0, 0
        self.out = out or sys.stdout
        self.after, self.every = after, every
        self.started = time.monotonic()
        self.last_plain = self.started
        self.tty = bool(getattr(self.out, "isatty", lambda: False)())
        self.shown = False

    def workers(self, threads: int) -> None:
        """How many submissions the workers can grade at a time now."""
        self.threads = threads
        self.most_threads = max(self.most_threads, threads)

    def done(self, ok: bool) -> None:
        """One more submission has its final record."""
        self.finished += 1
        self.failed += 0 if ok else 1

    def line(self, running: int, elapsed: float) -> str:
        filled = self.WIDTH * self.finished // max(1, self.total)
        text = f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {self.finished} of {self.total} graded"
        if self.failed:
            text += f" ({self.failed} failed)"
        text += f", {running} running on {self.threads} worker{'s' if self.threads != 1 else ''}"
        text += f", {duration(elapsed)} so far"
        if self.finished:
            text += f", about {duration(elapsed / self.finished * (self.total - self.finished))} left"
        return text

    def show(self, running: int) -> None:
        """Draw the line (in a terminal), or print it (in a log, every ``every`` seconds), once ``after`` s have passed."""
        now = time.monotonic()
        if now - self.started < self.after or self.finished >= self.total:
            return
        if self.tty:
            self.out.write("\r\x1b[K" + self.line(running, now - self.started))
            self.out.flush()
            self.shown = True
        elif now - self.last_plain >= self.every:
            self.last_plain = now
            print("  " + self.line(running, now - self.started), file=self.out, flush=True)

    def clear(self) -> None:
        """Take the line off the terminal, so that the next print starts on a clean line."""
        if self.shown:
            self.out.write("\r\x1b[K")
            self.out.flush()
            self.shown = False
