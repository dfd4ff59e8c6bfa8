"""Run a command (a launcher such as ``torchrun``) from a notebook cell, with nothing left behind.

:func:`run` runs a command to its end and shows its output live, each line labelled;
:func:`start` runs it in the background and returns a :class:`Job` to wait on or stop
later, so that a cell can start two ``torchrun`` agents side by side.

Every command runs under a small supervising process (:mod:`helpers._runtime.supervise`) that
is a child subreaper: whatever the command starts, even workers in sessions of their own
(torchrun's) or processes whose parent died, is ended when the command ends, when the
stop button interrupts the cell, when the timeout expires, or when the kernel dies.

Example::

    >>> from helpers import run
    >>> job = run(["torchrun", "--standalone", "--nproc-per-node=2", "train.py"], timeout=120)
    [torchrun] ...
    >>> job.returncode
    0
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Callable, Sequence, Union

from .errors import Interrupted, LaunchError

__all__ = ["Job", "start", "run", "CommandFailedError", "CommandTimeoutError"]

Output = Union[str, Callable[[str, str], None]]
_TAIL = 4000  # lines of output a Job keeps
_SUPERVISOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_runtime", "supervise.py")


class CommandFailedError(LaunchError):
    """A command run with ``check=True`` exited with a code other than 0."""

    def __init__(self, label: str, returncode: int, tail: str) -> None:
        self.label, self.returncode, self.tail = label, returncode, tail
        super().__init__(f"{label} exited with code {returncode}.\nIts last lines:\n{tail}")

    def __reduce__(self):
        return (type(self), (self.label, self.returncode, self.tail))


class CommandTimeoutError(LaunchError):
    """A command did not finish within its timeout; it and everything it started were ended."""

    def __init__(self, label: str, timeout: float, tail: str) -> None:
        self.label, self.timeout, self.tail = label, timeout, tail
        super().__init__(
            f"{label} did not finish within {timeout:g} s, so it was stopped, with every process it had "
            f"started.\nIts last lines:\n{tail}\nIf it is just slow, pass a larger timeout=."
        )

    def __reduce__(self):
        return (type(self), (self.label, self.timeout, self.tail))


class Job:
    """A command running under the supervisor. Use :func:`start` or :func:`run` to make one."""

    def __init__(self, command: Sequence[str], *, label: str | None = None, env: dict[str, str] | None = None,
                 cwd: str | os.PathLike | None = None, output: Output = "live", grace: float = 3.0) -> None:
        if isinstance(command, str):
            raise TypeError(f"pass the command as a list of arguments, e.g. {shlex.split(command)!r}, not one string")
        self.command = [str(a) for a in command]
        if not self.command:
            raise ValueError("the command is empty: pass at least the program to run")
        self.label = label or os.path.basename(self.command[0])
        if not callable(output) and output not in ("live", "quiet"):
            raise ValueError(f"output={output!r} is not understood; pass 'live', 'quiet' or a function sink(label, line)")
        self.output = output
        self.lines: deque[str] = deque(maxlen=_TAIL)
        self.started = time.monotonic()
        self.ended: float | None = None
        full_env = {**os.environ, **(env or {})}
        full_env.setdefault("PYTHONUNBUFFERED", "1")  # lines arrive as they are printed
        self._out = sys.stdout
        self._proc = subprocess.Popen(
            [sys.executable, _SUPERVISOR, str(grace), "--", *self.command],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=full_env, cwd=cwd, start_new_session=True,
        )
        self.pid = self._proc.pid
        self._reader = threading.Thread(target=self._read, name=f"helpers-job-{self.label}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for raw in iter(self._proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.lines.append(line)
            if callable(self.output):
                self.output(self.label, line)
            elif self.output == "live":
                self._out.write(f"[{self.label}] {line}\n")
                self._out.flush()

    @property
    def returncode(self) -> int | None:
        """The command's exit code (None while it runs; 128 + N when signal N ended it)."""
        return self._proc.poll()

    @property
    def text(self) -> str:
        """The output kept so far (the last 4000 lines), stdout and stderr interleaved."""
        return "\n".join(self.lines)

    def tail(self, n: int = 15) -> str:
        """The last ``n`` lines of output, indented."""
        return "\n".join("  " + line for line in list(self.lines)[-n:]) or "  (no output)"

    def running(self) -> bool:
        return self._proc.poll() is None

    def wait(self, timeout: float | None = None, check: bool = False) -> int:
        """Wait for the end; returns the exit code.

        After ``timeout`` seconds the command and all it started are stopped and
        :class:`CommandTimeoutError` is raised. The stop button (KeyboardInterrupt) stops
        them too. With ``check=True`` an exit code other than 0 raises
        :class:`CommandFailedError`.
        """
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise CommandTimeoutError(self.label, timeout, self.tail()) from None
        except KeyboardInterrupt:
            self.stop()
            raise Interrupted(f"{self.label} was interrupted; it and everything it started were stopped.") from None
        self._finish()
        if check and self._proc.returncode != 0:
            raise CommandFailedError(self.label, self._proc.returncode, self.tail())
        return self._proc.returncode

    def stop(self) -> int:
        """End the command and everything it started (SIGTERM, then SIGKILL after the grace period)."""
        if self._proc.poll() is None:
            try:
                self._proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:  # the supervisor itself is stuck: end its whole group
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
        self._finish()
        return self._proc.returncode

    def _finish(self) -> None:
        self._reader.join(5)
        if self.ended is None:
            self.ended = time.monotonic()

    def __repr__(self) -> str:
        state = "running" if self.running() else f"exited {self._proc.returncode}"
        return f"<Job {self.label!r} pid {self.pid} {state}>"

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start(command: Sequence[str], *, label: str | None = None, env: dict[str, str] | None = None,
          cwd: str | os.PathLike | None = None, output: Output = "live", grace: float = 3.0) -> Job:
    """Start ``command`` in the background; its output lines appear as ``[label] line``.

    ``env`` adds variables to the kernel's environment; ``output`` is ``"live"``,
    ``"quiet"`` (kept on ``job.text`` only) or a function ``sink(label, line)``.
    ``grace`` is how long the processes get between SIGTERM and SIGKILL when stopped.
    """
    return Job(command, label=label, env=env, cwd=cwd, output=output, grace=grace)


def run(command: Sequence[str], *, timeout: float = 120.0, check: bool = False, label: str | None = None,
        env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None, output: Output = "live",
        grace: float = 3.0) -> Job:
    """Run ``command`` to its end (at most ``timeout`` seconds) and return the finished :class:`Job`."""
    job = start(command, label=label, env=env, cwd=cwd, output=output, grace=grace)
    job.wait(timeout, check=check)
    return job
