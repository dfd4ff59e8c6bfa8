"""Exceptions raised in the notebook when ranks fail, hang or cannot start.

Each error says what happened, on which rank, and what to do next. In Jupyter they render
without the launcher's own frames (IPython's ``_render_traceback_`` hook): the learner sees
the rank's traceback down to their own cell line, not ours. All of them can be pickled.

Example::

    >>> from helpers import launch, RankFailedError
    >>> def boom(rank, world_size):
    ...     if rank == 1:
    ...         raise ValueError("bad shape")
    >>> try:
    ...     launch(boom, 2)
    ... except RankFailedError as err:
    ...     print(err.rank, err.exc_type)
    1 ValueError
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "LaunchError",
    "RankFailedError",
    "LaunchTimeoutError",
    "DeadlockError",
    "BackendUnavailableError",
    "ClusterError",
    "ForbiddenCallError",
    "Interrupted",
]


class LaunchError(RuntimeError):
    """Base class of every error the launcher raises about ranks."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.__dict__.update(details)

    def __reduce__(self):
        state = {k: v for k, v in self.__dict__.items() if k != "message"}
        return (_rebuild, (type(self), self.message, state))

    def __str__(self) -> str:
        return self.message

    def _render_traceback_(self) -> list[str]:
        """What Jupyter shows: our message only, never the launcher's internal frames."""
        red, reset = "\x1b[0;31m", "\x1b[0m"
        head, _, rest = self.message.partition("\n")
        return [f"{red}{type(self).__name__}{reset}: {head}", *rest.splitlines()]


def _rebuild(cls, message, state):
    # Call the class, as when the error was raised, rather than cls.__new__(cls): for
    # LaunchTimeoutError that attribute is RuntimeError.__new__, which refuses to build a
    # TimeoutError (an OSError) subclass, so unpickling it failed.
    return cls(message, **state)


class RankFailedError(LaunchError):
    """A rank raised an exception, exited early, or was killed by a signal.

    Attributes: ``rank``, ``world_size``, ``exc_type`` (name of the rank's exception, or
    None when the process died without one), ``exc_message``, ``rank_traceback`` (text),
    ``exitcode`` (None while the rank was alive), ``original`` (the rank's exception
    object when it could be sent back), ``frames`` (the traceback's frames, outermost
    first, as :class:`helpers._runtime.protocol.Frame` records with ``filename``, ``lineno``,
    ``name`` and ``line``; empty for a death), ``stopped`` (ranks we stopped because of it).
    """


class LaunchTimeoutError(LaunchError, TimeoutError):
    """Ranks were still running when the timeout ran out.

    Attributes: ``timeout``, ``stacks`` (rank -> that rank's Python stack as text),
    ``waiting`` (rank -> one-line summary of where it was blocked), ``finished`` (ranks
    that had already returned).
    """


class DeadlockError(LaunchTimeoutError):
    """Ranks were found blocked for good in point-to-point calls, before the timeout.

    Ranks that each wait for a message no rank can ever send them (a cycle of receives,
    sends nobody receives, a receive from a rank that has finished) are stopped about a
    second after the deadlock forms, with the report a timeout gives (see
    :mod:`helpers._runtime.deadlock`). It is a :class:`LaunchTimeoutError`, so code that catches
    those still does. Attributes: those of :class:`LaunchTimeoutError`, plus ``seconds``
    (when it was found, after the request started) and ``ranks`` (the deadlocked ranks).
    """


class BackendUnavailableError(LaunchError, ValueError):
    """The requested backend cannot run here (for example nccl without enough GPUs)."""


class ClusterError(LaunchError):
    """The cluster cannot take this request (not started, a rank dead or still busy)."""


class Interrupted(KeyboardInterrupt):
    """The stop button (or Ctrl-C) ended a launch, a cell on persistent ranks, or a command.

    It is a ``KeyboardInterrupt``, so code that catches those still does; in Jupyter it
    shows as one line saying what was stopped, instead of a traceback through the helpers'
    own waiting loops.
    """

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what

    def __str__(self) -> str:
        return self.what

    def _render_traceback_(self) -> list[str]:
        red, reset = "\x1b[0;31m", "\x1b[0m"
        return [f"{red}KeyboardInterrupt{reset}: {self.what}"]


class ForbiddenCallError(RuntimeError):
    """Raised inside a rank when the code calls something the launch switched off.

    Exercises that ask for a hand-made collective run with the built-in ones switched
    off (``launch(..., forbid=...)``), and those that ask for hand-made sharding or
    pipelining with torch's own APIs switched off. ``call`` names what was called (for
    example ``"torch.distributed.all_reduce"``, ``"ProcessGroup.allreduce"`` or
    ``"torch.distributed.fsdp.fully_shard"``), ``reason`` is the sentence the launch gave
    for switching it off, ``name`` the entry of ``forbid`` that switched it off
    (``"all_reduce"`` for the first two, ``"FSDP"`` for the third), and ``family`` what
    kind of call that entry is: ``"collective"``, ``"point_to_point"``, or a whole API's:
    ``"ddp"`` (``DistributedDataParallel``), ``"zero"`` (``ZeroRedundancyOptimizer``),
    ``"fsdp"``, ``"dtensor"``, ``"pipelining"`` or ``"course_ring"`` (``helpers.ring``);
    see :func:`helpers._runtime.calls.family_of`. Decide on ``family`` and ``name``, never on
    the text. It travels home pickled, so the notebook side can test
    ``isinstance(err.original, ForbiddenCallError)`` on a :class:`RankFailedError`.

    >>> import pickle
    >>> err = ForbiddenCallError("ProcessGroup.allreduce", "build it from send and recv", "collective", "all_reduce")
    >>> copy = pickle.loads(pickle.dumps(err))
    >>> copy.family, copy.name, str(copy)
    ('collective', 'all_reduce', 'ProcessGroup.allreduce is switched off here: build it from send and recv')
    """

    def __init__(self, call: str, reason: str, family: str | None = None, name: str | None = None) -> None:
        super().__init__(f"{call} is switched off here: {reason}")
        self.call = call
        self.reason = reason
        self.family = family
        self.name = name

    def __reduce__(self):
        return (type(self), (self.call, self.reason, self.family, self.name))
