"""Run a function on several ranks from a notebook cell: ``launch(fn, world_size)``.

``fn`` is called as ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes, with
the default process group already set up, and the ranks' return values come back as a
list indexed by rank. ``fn`` can be defined right in the notebook, as a closure, using
the notebook's classes and globals: it is sent to the ranks by value (cloudpickle), so
there is no file to write and no ``if __name__ == "__main__"`` guard.

Example::

    >>> import torch, torch.distributed as dist
    >>> from helpers import launch
    >>> def total(rank, world_size):
    ...     t = torch.tensor([rank + 1.0])
    ...     dist.all_reduce(t)           # every rank ends with 1 + 2 + 3 + 4
    ...     return t.item()
    >>> launch(total, 4)
    [10.0, 10.0, 10.0, 10.0]
"""

from __future__ import annotations

import signal
import time
from typing import Any, Callable, Sequence

from ._runtime.factory import get_factory
from ._runtime.group import RankGroup
from ._runtime.protocol import Call, Request
from ._runtime.report import Outcome, group_stopped_error, interrupted_launch, stopped_ranks
from .backend import resolve_backend
from .errors import LaunchError
from .output import OutputRouter
from .settings import LaunchSettings, takes_settings
from .trace import Trace

__all__ = ["launch", "run_settings", "LaunchResult", "serialize", "serialize_call"]

_INTERRUPT_STEPS = ((signal.SIGINT, 0.5), (signal.SIGTERM, 0.5))
_last_announcement: str | None = None

class LaunchResult(list):
    """The ranks' return values, indexed by rank, plus what else the launch produced.

    Attributes: ``output`` (rank -> text the rank printed, last 64 KiB), ``backend``,
    ``seconds`` (wall time of the launch), ``trace`` (a :class:`~helpers.trace.Trace`
    with ``trace=True``, else None).
    """

    output: dict[int, str]
    backend: str
    seconds: float
    trace: Trace | None = None


_PICKLER: Any = None


def _pickler() -> Any:
    """cloudpickle's pickler, made to keep the file name of every code object it sends.

    cloudpickle 3.1.3 and later write ``"<dynamic-code>"`` as the file name of code sent by
    value (for payloads that do not depend on where a function was defined). The ranks'
    tracebacks and hang reports then cannot name the learner's cell or show its line. A
    code object is sent in ``marshal``'s format instead, which keeps every field: the ranks
    are forked from the kernel's own interpreter, so they read it alike. Code that marshal
    refuses (constants it cannot write) goes through cloudpickle's own reducer.
    """
    global _PICKLER
    if _PICKLER is None:
        import marshal
        import types

        import cloudpickle

        class KeepFileNames(cloudpickle.Pickler):
            def reducer_override(self, obj: Any) -> Any:
                if type(obj) is types.CodeType:
                    try:
                        return marshal.loads, (marshal.dumps(obj),)
                    except ValueError:
                        pass
                return super().reducer_override(obj)

        _PICKLER = KeepFileNames
    return _PICKLER


def serialize(obj: Any, what: str) -> bytes:
    """Pickle ``obj`` by value (cloudpickle) for the ranks; ``what`` names it in errors.

    Functions keep the file names of their code, so that a rank's traceback points at the
    notebook cell or file they came from:

    >>> import pickle
    >>> def f():
    ...     return 1
    >>> f.__module__ = "__main__"   # as if defined in a notebook: sent by value
    >>> pickle.loads(serialize(f, "f")).__code__.co_filename == f.__code__.co_filename
    True
    """
    import io

    try:
        buffer = io.BytesIO()
        _pickler()(buffer, protocol=5).dump(obj)
        return buffer.getvalue()
    except Exception as exc:  # noqa: BLE001
        raise LaunchError(
            f"could not send {what} to the ranks: {type(exc).__name__}: {exc}. Everything sent "
            "from the notebook must be picklable; open files, locks, sockets and generators are "
            "not. Create those on the ranks instead."
        ) from None


def serialize_call(fn: Callable, args: Sequence, kwargs: dict | None = None) -> bytes:
    """Pickle a call by value so that ranks can run notebook-defined code."""
    name = getattr(fn, "__name__", repr(fn))
    return serialize((fn, tuple(args), dict(kwargs or {})), f"{name!r} and its arguments")


def trace_of(world_size: int, outcome: Outcome) -> Trace:
    """The trace of a traced request, from the events every rank sent with its result."""
    return Trace.from_events(world_size, (e for reply in outcome.replies.values() for e in reply.trace))


def announce(router: OutputRouter, text: str) -> None:
    """Print a one-line notice, unless it is the same as the last one."""
    global _last_announcement
    if text != _last_announcement and router.note(text):
        _last_announcement = text


@takes_settings("launch")
def launch(
    fn: Callable[..., Any],
    world_size: int,
    args: Sequence[Any] = (),
    *,
    kwargs: dict[str, Any] | None = None,
    **settings: Any,
) -> LaunchResult:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` ranks; return their results.

    Parameters
    ----------
    fn:
        The function each rank runs. It may be defined in a notebook cell.
    world_size:
        How many ranks (processes) to start.
    args, kwargs:
        Extra positional and keyword arguments for ``fn``, the same for every rank.
    {settings}

    The settings are those of :class:`~helpers.settings.LaunchSettings` that a launch takes.

    Returns
    -------
    LaunchResult
        A list of the ranks' return values (tensors moved to the CPU), index = rank.

    Raises
    ------
    RankFailedError
        A rank raised or died; the others were stopped within about a second.
    LaunchTimeoutError
        The ranks were still running ``timeout`` seconds after every one had started ``fn``;
        or they had not all started it (forked, joined the process group, loaded ``fn``)
        within a minute (``timeout`` if longer), which the error says, with ``.unstarted``.
    BackendUnavailableError, ValueError
        Bad arguments, raised before any rank starts; TypeError for a setting launch does not take.
    """
    _check_function(fn, world_size)
    checked = LaunchSettings.of(world_size, "launch", **settings)
    if isinstance(args, (str, bytes)) or not isinstance(args, (list, tuple)):
        raise TypeError(f"args must be a tuple of extra arguments for fn, like args=(x,); got {args!r}.")
    return run_settings(fn, args, kwargs, checked)


def run_settings(fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any] | None,
                 settings: LaunchSettings) -> LaunchResult:
    """:func:`launch` with its settings already checked and gathered in one object."""
    world_size, nnodes = settings.world_size, settings.nnodes
    router = OutputRouter(settings.output, max_lines=settings.max_lines)
    payload = serialize_call(fn, args, kwargs)
    started = time.perf_counter()
    factory = get_factory()
    choice = resolve_backend(settings.backend, world_size, factory.info)
    announce(router, f"Launching {world_size} rank{'s' if world_size > 1 else ''} on {choice.describe(world_size)}"
             + (f", {nnodes} simulated hosts" if nnodes > 1 else ""))
    group = RankGroup(factory, settings, init_backend=choice.init_backend, router=router,
                      devices=list(choice.devices) if choice.devices else None)
    outcome = _run_once(group, Call(0, payload, settings.trace), settings.timeout)
    results = LaunchResult(outcome.replies[r].value() for r in range(world_size))
    results.output = {r: router.text(r) for r in range(world_size)}
    results.backend = choice.name
    results.seconds = time.perf_counter() - started
    results.trace = trace_of(world_size, outcome) if settings.trace else None
    return results


def _check_function(fn: Any, world_size: Any) -> None:
    if not callable(fn):
        raise TypeError(
            f"launch() needs a function to run on every rank as its first argument; got "
            f"{type(fn).__name__} {fn!r}. Define def work(rank, world_size): ... and call launch(work, {world_size!r})."
        )


def _run_once(group: RankGroup, request: Request, timeout: float) -> Outcome:
    """Start the group, run one request on every rank, and end the group whatever happens."""
    try:
        group.start()
        outcome = group.request(request, list(range(group.world_size)), timeout)
        if not outcome.ok:
            error = group_stopped_error(outcome, group.live, group.world_size, timeout)
            group.stop()
            raise error
        group.close()
        return outcome
    except KeyboardInterrupt:
        live = group.live
        group.stop(_INTERRUPT_STEPS)
        group.close()
        if live:
            group.router.note(f"Interrupted: {stopped_ranks(live)}.")
        raise interrupted_launch(live) from None
    except BaseException:
        group.stop()
        group.close()
        raise

