"""The grading harness: run a learner's function on fresh ranks and say who is at fault.

The lesson checks (``autograder.lessons.lessonNN`` and ``autograder.hidden.lessonNN``, declared with :mod:`autograder.kit.exercise`) are
built on this module. Every run of the learner's code:

- happens in fresh rank processes through :func:`helpers.launch`, never in the learner's
  kernel, so nothing the learner patched there reaches the ranks;
- can switch calls off inside the ranks (``forbid``) where the exercise is to build them;
- keeps the ranks' output out of the notebook, so a harmless warning cannot cost points;
- ends within its own short timeout, so one broken submission cannot stall the class.

Two kinds of error come out of it:

- :class:`GradingFailure` (an ``AssertionError``): the learner's answer is wrong, hangs,
  crashes, calls a switched-off function or is still the stub. The message is written
  for the learner: the part, the world size, the rank, the values.
- :class:`CheckError`: the course's own check broke (a rank failed inside the
  ``autograder`` package's files rather than in the learner's code). The message says
  so, and asks the learner to tell the instructor.

Example (what :meth:`autograder.kit.exercise.Attempt.run` does for a check)::

    >>> from autograder.kit.harness import run_ranks
    >>> def worker(rank, world_size, fn):
    ...     return fn(rank, world_size)
    >>> list(run_ranks("demo", worker, 2, (lambda r, w: r * 10,), exercise="Exercise 0.0", function="f"))
    [0, 10]
"""

from __future__ import annotations

import os
import pickle
import random
import sysconfig
import time
from typing import Any, Callable, Mapping, Sequence

import helpers
from helpers import Cluster, ForbiddenCallError, LaunchResult, LaunchTimeoutError, RankFailedError
from helpers.launcher import run_settings
from helpers.settings import LaunchSettings
from helpers._runtime.protocol import Frame

from .pieces import AnswerError

__all__ = [
    "GradingFailure",
    "CheckError",
    "run_ranks",
    "fresh_seed",
    "require_function",
    "course_frame",
    "reuse_ranks",
    "take_stats",
]

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the whole autograder package
_HELPERS_DIR = os.path.dirname(os.path.abspath(helpers.__file__))
_LIBRARY_DIRS = tuple(
    {os.path.abspath(p) for key in ("stdlib", "platstdlib", "purelib", "platlib") if (p := sysconfig.get_paths().get(key))}
) + (_HELPERS_DIR,)


class GradingFailure(AssertionError):
    """The learner's answer failed a check; the message is written for the learner.

    ``part`` is the graded part (or ``""``), ``text`` what the learner reads about it; the
    message is ``"part: text"``. Code that sums failures up reads the fields, not the message.

    >>> failure = GradingFailure("rank 1 returned 3 instead of 2.", part="correct")
    >>> str(failure), failure.part, failure.text
    ('correct: rank 1 returned 3 instead of 2.', 'correct', 'rank 1 returned 3 instead of 2.')
    """

    #: ``"Exercise 4.4"`` once the kit knows which exercise failed (it says so in the notebook).
    exercise: str = ""

    def __init__(self, text: str, part: str = "") -> None:
        self.text, self.part = text, part
        super().__init__(f"{part}: {text}" if part else text)

    def __reduce__(self):
        return (_failure, (type(self), self.text, self.part, self.exercise))

    def _render_traceback_(self) -> list[str]:
        """What a notebook shows: the exercise, the part and what went wrong, not the checks' own frames.

        >>> failure = GradingFailure("every rank holds the sum.", part="correct")
        >>> failure.exercise = "Exercise 5.1"
        >>> failure._render_traceback_()[0].endswith('Exercise 5.1, part "correct": every rank holds the sum.')
        True
        """
        red, reset = "\x1b[0;31m", "\x1b[0m"
        where = ", ".join(w for w in (self.exercise, f'part "{self.part}"' if self.part else "") if w)
        head, _, rest = self.text.partition("\n")
        return [f"{red}{type(self).__name__}{reset}: " + (f"{where}: " if where else "") + head, *rest.splitlines()]


def _failure(cls: type, text: str, part: str, exercise: str) -> GradingFailure:
    failure = cls(text, part)
    failure.exercise = exercise
    return failure


class CheckError(RuntimeError):
    """The course's own check broke: a fault in the grading code, not in the learner's answer.

    ``exercise`` and ``part`` say where, ``problem`` what went wrong (the exception), and
    ``detail`` where in the course's code (a few traceback lines for the instructor).

    Example::

        >>> str(CheckError("Exercise 4.1", "correct", "ZeroDivisionError: division by zero")).splitlines()[0]
        'Exercise 4.1, part "correct": the course\\'s check itself failed (ZeroDivisionError: division by zero).'
    """

    def __init__(self, exercise: str, part: str, problem: str, detail: str = "") -> None:
        self.exercise, self.part, self.problem, self.detail = exercise, part, problem, detail
        message = (
            f'{exercise}, part "{part}": the course\'s check itself failed ({problem}).\n'
            "This is a fault in the course's grading code, not in your answer, and it says nothing "
            "about whether your answer is right. Please tell your instructor and include this message."
        )
        if detail:
            message += "\nWhere it failed, for the instructor:\n" + detail
        super().__init__(message)

    def __reduce__(self):
        return (type(self), (self.exercise, self.part, self.problem, self.detail))


def fresh_seed() -> int:
    """A seed drawn at grading time, so answers cannot be precomputed.

    >>> 1 <= fresh_seed() < 2**31
    True
    """
    return random.SystemRandom().randrange(1, 2**31)


def require_function(fn: Any, name: str, exercise: str) -> Callable:
    """``fn`` itself when it can be called; else a GradingFailure asking for the function.

    >>> require_function(print, "print", "Exercise 0.0") is print
    True
    """
    if not callable(fn):
        raise GradingFailure(f"{exercise}: define a function named `{name}` (found {type(fn).__name__}).")
    return fn


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + os.sep)


def _owner(filename: str) -> str:
    """Whose code a traceback frame is in: ``"course"``, ``"library"`` or ``"learner"``."""
    if filename.startswith("<frozen"):
        return "library"
    path = filename if filename.startswith("<") else os.path.abspath(filename)
    if _within(path, PACKAGE_DIR):
        return "course"
    if any(_within(path, lib) for lib in _LIBRARY_DIRS):
        return "library"
    return "learner"  # a notebook cell, or any other file of the learner's


def course_frame(frames: Sequence[Frame]) -> str | None:
    """The innermost frame of a rank's traceback when it lies in the autograder package, else None.

    ``frames`` are a :class:`helpers.RankFailedError`'s ``frames``, outermost first.
    Frames of libraries (the standard library, installed packages, ``helpers``) are passed
    over: a check that calls torch wrongly is still the course's fault, and a learner's
    call that fails inside torch is still the learner's. The first frame that is neither
    decides: in the ``autograder`` package it is the course's fault, anywhere else (a
    notebook cell) the learner's.

    >>> course_frame([Frame("/tmp/ipykernel_1/2.py", 3, "ring_allreduce")]) is None
    True
    """
    for frame in reversed(list(frames)):
        owner = _owner(frame.filename)
        if owner != "library":
            return f'File "{frame.filename}", line {frame.lineno}, in {frame.name}' if owner == "course" else None
    return None


def _raised_by_learner(frames: Sequence[Frame]) -> bool:
    """True when the innermost frame of all is the learner's: their own ``raise``, not a library's."""
    return bool(frames) and _owner(frames[-1].filename) == "learner"


def _signal(exitcode: int | None) -> str:
    """``"SIGABRT"`` for a process a signal ended (a negative exit code), else ``""``.

    >>> _signal(-6), _signal(1)
    ('SIGABRT', '')
    """
    import signal

    if exitcode is None or exitcode >= 0:
        return ""
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return ""


def _traceback_tail(text: str, lines: int = 6) -> str:
    tail = text.strip().splitlines()[-lines:] if text else []
    return "\n".join(tail)


def _stub_failure(part: str, function: str, exercise: str, text: str) -> GradingFailure:
    return GradingFailure(
        f"`{function}` still raises NotImplementedError ({text or 'NotImplementedError'}). "
        f"Replace the `raise NotImplementedError(...)` line of {exercise} with your code, run that "
        "cell, then run this one again.", part
    )


#: Rank runs since :func:`reuse_ranks` or the last :func:`take_stats`: how many, seconds in them, fresh groups started.
_STATS = {"runs": 0, "seconds": 0.0, "started": 0}
#: Warm groups kept between runs by :func:`reuse_ranks`, by their shape (world size, simulated hosts).
_POOL: dict[tuple, Cluster] | None = None


def reuse_ranks(on: bool = True) -> None:
    """Keep ranks alive between the checks of this process (the clean re-grade of one submission).

    Every check then runs on a warm group of its shape instead of fresh processes: about a
    millisecond instead of a tenth of a second or more per run. The calls a check switches
    off travel with each run (:meth:`helpers.Cluster.run`'s ``forbid``). A group is used again only
    when it is as a fresh one would be: every rank idle and answering, the default process
    group up, torch's default dtype and gradient mode as they start, and every message a
    rank sent received. After any failure, or anything else, the group is stopped and the
    next check gets fresh ranks. Learners never share ranks: each submission's clean
    re-grade is a process of its own. ``on=False`` stops every kept group.
    """
    global _POOL
    if on and _POOL is None:
        _POOL = {}
    elif not on and _POOL is not None:
        for cluster in _POOL.values():
            cluster.shutdown()
        _POOL = None


def take_stats() -> dict[str, Any]:
    """The rank runs made since the last call: ``{"runs": n, "seconds": s, "started": fresh groups}``; resets them."""
    stats = dict(_STATS)
    _STATS.update(runs=0, seconds=0.0, started=0)
    return stats


def _as_fresh(rank: int, world_size: int) -> bool:
    """On a kept rank after a run: put back what a run may change, and say whether the group is still usable."""
    import torch
    import torch.distributed as dist

    torch.set_default_dtype(torch.float32)
    torch.set_grad_enabled(True)
    return dist.is_initialized() and dist.get_world_size() == world_size and dist.get_rank() == rank


def _clean_board(cluster: Cluster) -> bool:
    """Every rank idle, none made a call its message counts cannot describe, and every message sent was received."""
    from helpers._runtime.board import RECVS_POSTED, SENDS_POSTED

    group = cluster._group
    if group is None or group.board is None:
        return False
    if any(rec.phase != "ready" or rec.unsure for rec in group.read_board()):
        return False
    counts, n = group.board.read_counts(), cluster.world_size
    return all(counts.get(r, p, SENDS_POSTED) == counts.get(p, r, RECVS_POSTED) for r in range(n) for p in range(n))


def _ranks(worker: Callable, args: tuple, settings: LaunchSettings) -> LaunchResult:
    """One run of ``worker`` on gloo ranks: fresh ones (:func:`helpers.launch`), or a kept group (:func:`reuse_ranks`)."""
    began = time.monotonic()
    try:
        if _POOL is None or not settings.init:
            _STATS["started"] += 1
            return run_settings(worker, args, None, settings)
        key = (settings.world_size, settings.nnodes)
        cluster = _POOL.pop(key, None)
        if cluster is None:
            _STATS["started"] += 1
            cluster = Cluster(settings.world_size, backend=settings.backend, nnodes=settings.nnodes,
                              timeout=max(settings.timeout, 30.0), output=settings.output, view="text",
                              after_failure=0.0, start=False).start(announce=False)
        try:
            values = cluster.run(worker, *args, timeout=settings.timeout, trace=settings.trace, forbid=settings.forbid)
            usable = _clean_board(cluster) and all(cluster.run(_as_fresh, timeout=5.0))
        except BaseException:
            cluster.shutdown()
            raise
        if usable and _POOL is not None:
            _POOL[key] = cluster
        else:
            cluster.shutdown()
        result = LaunchResult(values)
        result.trace, result.backend, result.output = values.trace, "gloo", {}
        result.seconds = time.monotonic() - began
        return result
    finally:
        _STATS["runs"] += 1
        _STATS["seconds"] += time.monotonic() - began


def run_ranks(
    part: str,
    worker: Callable,
    world_size: int,
    args: Sequence[Any] = (),
    *,
    exercise: str,
    function: str,
    context: str = "",
    hints: Mapping[str, str] | None = None,
    **settings: Any,
) -> LaunchResult:
    """Run ``worker(rank, world_size, *args)`` on fresh gloo ranks; turn every failure into feedback.

    ``exercise`` ("Exercise 4.1") and ``function`` (the learner's function name) word the
    feedback; ``hints`` maps the type name of a rank's exception (or ``"SIGABRT"`` and the like
    for a rank a signal ended, ``"DeadlockError"`` for a deadlock of point-to-point calls) to a
    sentence added to it: the fix, where the mistake behind it is a usual one.
    ``settings`` are launch settings (:class:`helpers.settings.LaunchSettings`): grading runs
    on gloo, keeps the ranks' output out of the notebook and stops a run after 10 s unless told
    otherwise; ``forbid`` maps calls to switch off to the reason the learner reads, ``nnodes``
    simulates hosts, ``init=False`` leaves the process group to the worker.

    Raises :class:`GradingFailure` when the learner's code hangs, crashes, calls a
    switched-off function or is still a stub, and :class:`CheckError` when a rank fails
    inside the autograder's own files.
    """
    launch = LaunchSettings(world_size, **{"backend": "gloo", "output": "quiet", "timeout": 10.0, **settings})
    hosts = f" on {launch.nnodes} simulated hosts" if launch.nnodes > 1 else ""
    where = f"on {world_size} rank{'s' if world_size != 1 else ''}{hosts}" + (f", {context}" if context else "")
    try:
        return _ranks(worker, tuple(args), launch)
    except pickle.UnpicklingError as err:  # a rank sent back something other than data (see helpers._runtime.wire.restrict)
        raise GradingFailure(
            f"a rank {where} sent back an object that grading does not load ({err}). Return numbers, "
            "strings, lists, dicts or tensors.", part
        ) from None
    except LaunchTimeoutError as err:
        waits = "\n".join(f"  {line}" for line in err.waiting.values())
        notes = "\n".join(f"  {n}" for n in getattr(err, "notes", []))
        if isinstance(err, helpers.DeadlockError):  # found as it formed, before the timeout
            stuck = ", ".join(map(str, err.ranks))
            calls = "point-to-point calls" if len(err.ranks) != 1 else "a point-to-point call"
            happened = (f"your code deadlocked {where}: rank{'s' if len(err.ranks) != 1 else ''} {stuck} waited "
                        f"in {calls} that no rank could ever match; it was stopped.")
            if hints and "DeadlockError" in hints:
                notes += ("\n" if notes else "") + f"  {hints['DeadlockError']}"
        else:
            happened = f"your code did not finish within {launch.timeout:g} s {where}; it was stopped."
        raise GradingFailure(
            f"{happened}\nWhere the ranks were waiting:\n{waits}" + (f"\n{notes}" if notes else ""), part
        ) from None
    except RankFailedError as err:
        if isinstance(err.original, ForbiddenCallError):
            what = {"course_ring": "lesson 8's ring from helpers.ring", "collective": "a built-in collective",
                    "point_to_point": "a point-to-point call this exercise switches off",
                    "pipelining": "torch's own pipelining (torch.distributed.pipelining)"}.get(
                err.original.family, f"torch's own {err.original.name}" if err.original.name else "a switched-off call")
            raise GradingFailure(f"rank {err.rank} called {what} {where}: {err.exc_message}", part) from None
        if isinstance(err.original, AnswerError):  # what the learner's code made cannot be used: their mistake
            raise GradingFailure(f"{where}, rank {err.rank}: {err.exc_message}", part) from None
        fault = course_frame(err.frames)
        if fault is not None:
            raise CheckError(
                exercise, part, f"rank {err.rank} raised {err.exc_type}: {err.exc_message} {where}",
                _traceback_tail(err.rank_traceback),
            ) from None
        if err.exc_type == "NotImplementedError" and _raised_by_learner(err.frames):
            raise _stub_failure(part, function, exercise, err.exc_message) from None
        what = f"raised {err.exc_type}: {err.exc_message}" if err.exc_type else err.exc_message
        key = err.exc_type or _signal(err.exitcode)
        hint = f"\n  {hints[key]}" if hints and key in hints else ""
        tail = _traceback_tail(err.rank_traceback)
        raise GradingFailure(f"rank {err.rank} {what} {where}.{hint}" + (f"\n{tail}" if tail else ""), part) from None
