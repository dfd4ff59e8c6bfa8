"""Persistent ranks: a process group that stays alive between notebook cells.

A :class:`Cluster` starts ``world_size`` ranks with the default process group set up,
then waits for work. Each rank keeps its own variables from one request to the next,
so rank 0 can ``isend`` in one cell and rank 1 ``recv`` in the next. The ``%%distributed``
cell magic (see :mod:`helpers.magics`) is a thin layer over this class.

Example::

    >>> from helpers import Cluster
    >>> with Cluster(2) as cluster:
    ...     cluster.exec("x = torch.tensor([rank + 1.0]); dist.all_reduce(x)")
    ...     cluster.pull("x")
    [tensor([3.]), tensor([3.])]

Failures are reported like :func:`helpers.launch` reports them, but the other ranks are
not stopped: they keep their state. A rank that hangs is interrupted when it is blocked
in Python code; a rank blocked inside a communication call cannot be, and the error says
so: :meth:`Cluster.restart` then gives a fresh group in a second or two. Ranks deadlocked
in point-to-point calls are found about a second after the deadlock forms, without
waiting for the timeout (:class:`~helpers.DeadlockError`, see :mod:`helpers._runtime.deadlock`).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from ._runtime.cells import cache_source
from ._runtime.factory import get_factory
from ._runtime.group import RankGroup, start_limit
from ._runtime.kept import ask
from ._runtime.protocol import Call, Exec, Pull, Push, Request
from ._runtime.report import Outcome, group_stopped_error, unusable_rank_error
from .backend import Choice, resolve_backend
from .errors import ClusterError
from .launcher import serialize, serialize_call, trace_of
from .settings import Forbid, LaunchSettings, takes_settings
from .trace import Trace
from .view import RequestOutput

__all__ = ["Cluster", "ClusterError", "Results", "DEFAULT_WORLD_SIZE"]

#: How many ranks ``Cluster()`` and the magics start when not told.
DEFAULT_WORLD_SIZE = 2


class Results(list):
    """Per-rank values of one request, in the order of the ranks asked; ``.trace`` when traced."""

    trace: Trace | None = None


@takes_settings("cluster")
class Cluster:
    """``world_size`` background ranks that run code on request and keep their state.

    Parameters
    ----------
    world_size:
        How many ranks to start (2 when not given).
    start:
        Start the ranks now (else on :meth:`start`, or ``with Cluster(...)``).
    {settings}

    Every setting is also an attribute (``cluster.timeout``), from ``cluster.settings``
    (:class:`~helpers.settings.LaunchSettings`). ``timeout`` is the default for each request;
    ``forbid`` switches calls off on the ranks for their whole life (:meth:`run` takes its
    own for one call).
    """

    def __init__(self, world_size: int = DEFAULT_WORLD_SIZE, *, start: bool = True, **settings: Any) -> None:
        self.settings = LaunchSettings.of(world_size, "cluster", **settings)
        self._output = RequestOutput(self.view, self.output, self.max_lines, self.world_size)
        self.choice: Choice | None = None
        self._group: RankGroup | None = None
        if start:
            self.start()

    # -- life cycle -------------------------------------------------------------------

    def start(self, *, announce: bool = True) -> "Cluster":
        """Start the ranks and wait until every one has its process group ready (a
        :class:`~helpers.LaunchTimeoutError` saying so after :func:`~helpers._runtime.group.start_limit`
        seconds, a minute or ``timeout`` if longer).

        With ``announce`` (the default) one line says how many ranks started on what.
        """
        if self._group is not None:
            return self
        factory = get_factory()
        self.choice = resolve_backend(self.backend, self.world_size, factory.info)
        router = self._output.router()
        group = RankGroup(factory, self.settings, init_backend=self.choice.init_backend, router=router,
                          devices=list(self.choice.devices) if self.choice.devices else None)
        self._group = group
        started = time.perf_counter()
        try:
            group.start()
            limit = start_limit(self.timeout)
            outcome = group.wait_ready(limit)
            if not outcome.ok:
                raise group_stopped_error(outcome, group.live, self.world_size, limit)
        except BaseException:
            self._group = None
            group.stop()
            group.close()
            raise
        if announce:
            router.note(
                f"Started {self.world_size} rank{'s' if self.world_size > 1 else ''} on "
                f"{self.choice.describe(self.world_size)} in {time.perf_counter() - started:.2f} s."
            )
        return self

    def shutdown(self) -> None:
        """Stop every rank (their variables are lost)."""
        group, self._group = self._group, None
        if group is not None:
            group.poll(0)
            # A busy rank (say, blocked in a recv nobody answers) would read the end of its
            # command pipe only after its request: waiting for it to exit is pointless.
            busy = any(s.state == "busy" for s in group.ranks)
            group.close(grace=0.0 if busy else 2.0)

    stop = shutdown

    def restart(self) -> "Cluster":
        """A fresh group of the same shape: stop all ranks, start new ones."""
        self.shutdown()
        return self.start()

    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __del__(self) -> None:
        try:
            if self._group is not None:
                self._group.stop()
                self._group.close(grace=0.5)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    @property
    def running(self) -> bool:
        return self._group is not None

    def status(self) -> list[dict[str, Any]]:
        """One entry per rank: ``rank``, ``pid``, ``state`` (idle, busy, dead) and ``exitcode``."""
        if self._group is None:
            return []
        self._group.poll(0)
        out = []
        for s in self._group.ranks:
            state = {"exited": "dead", "starting": "starting"}.get(s.state, s.state)
            out.append({"rank": s.rank, "pid": s.pid, "state": state, "exitcode": s.exitcode})
        return out

    def __repr__(self) -> str:
        if self._group is None:
            return f"Cluster(world_size={self.world_size}, stopped)"
        states = ", ".join(f"{d['rank']}:{d['state']}" for d in self.status())
        return f"Cluster(world_size={self.world_size}, backend={self.choice.name!r}, ranks={{{states}}})"

    # -- requests ---------------------------------------------------------------------

    def run(
        self,
        fn: Callable[..., Any],
        *args: Any,
        ranks: Sequence[int] | None = None,
        timeout: float | None = None,
        trace: bool = False,
        forbid: Forbid | None = None,
        **kwargs: Any,
    ) -> Results:
        """Call ``fn(rank, world_size, *args, **kwargs)`` on every rank (or ``ranks``).

        Returns the results in the order of ``ranks`` (by default, index = rank); with
        ``trace=True`` the list's ``.trace`` holds every torch.distributed call made.
        ``forbid`` switches these calls off for this call only, instead of the cluster's own
        (as :func:`helpers.launch` takes it).
        """
        if not callable(fn):
            raise TypeError(f"run() needs a function; got {type(fn).__name__} {fn!r}.")
        targets = self._targets(ranks)
        refused = LaunchSettings.checked("forbid", forbid) if forbid is not None else None
        outcome = self._request(Call(0, serialize_call(fn, args, kwargs), trace, refused), targets, timeout)
        return self._results(outcome, targets, trace)

    def _results(self, outcome: Outcome, targets: list[int], trace: bool, display: bool = False) -> Results:
        out = Results()
        for r in targets:
            reply = outcome.replies[r]
            if display and reply.text is not None:
                self._output.last.note(f"[rank {r}] Out: {reply.text}")
            out.append(reply.value())
        if trace:
            out.trace = trace_of(self.world_size, outcome)
        return out

    def exec(
        self,
        source: str,
        ranks: Sequence[int] | None = None,
        timeout: float | None = None,
        *,
        filename: str | None = None,
        display: bool = False,
        trace: bool = False,
    ) -> Results:
        """Run Python source on every rank (or ``ranks``), each in its own namespace.

        The namespace starts with ``rank``, ``world_size``, ``local_rank``, ``torch`` and
        ``dist``, and keeps every variable between calls. Returns each rank's value of
        the last expression (None when the source ends in a statement); with
        ``display=True`` those values are also printed, labelled by rank. With
        ``trace=True`` the list's ``.trace`` holds every torch.distributed call made.
        """
        if not isinstance(source, str):
            raise TypeError(f"exec() needs source code as a string; got {type(source).__name__}.")
        targets = self._targets(ranks)
        outcome = self._request(Exec(0, source, filename or cache_source(source), trace), targets, timeout)
        return self._results(outcome, targets, trace, display=display)

    def push(self, *, ranks: Sequence[int] | None = None, per_rank: bool = False, **values: Any) -> None:
        """Set variables in the ranks' namespaces.

        ``push(lr=0.1)`` gives every rank the same value. With ``per_rank=True`` each value
        must be a sequence with one item per targeted rank: ``push(per_rank=True,
        shard=[a, b])`` gives rank 0 ``a`` and rank 1 ``b``.
        """
        targets = self._targets(ranks)
        if not values:
            raise ValueError("push() needs at least one name=value, like push(lr=0.1).")
        if per_rank:
            for name, value in values.items():
                if not hasattr(value, "__len__") or len(value) != len(targets):
                    got = len(value) if hasattr(value, "__len__") else type(value).__name__
                    raise ValueError(
                        f"push(per_rank=True, {name}=...) needs one value per rank: {len(targets)} "
                        f"for ranks {targets}, got {got}. Without per_rank=True every rank gets the same value."
                    )
            for i, r in enumerate(targets):
                payload = serialize({n: v[i] for n, v in values.items()}, "the pushed values")
                self._request(Push(0, payload), [r], None)
            return
        payload = serialize(values, "the pushed values")
        self._request(Push(0, payload), targets, None)

    def pull(self, name: str, ranks: Sequence[int] | None = None) -> list[Any]:
        """The value of variable ``name`` on every rank (or ``ranks``), in rank order."""
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"pull() needs a variable name like 'x'; got {name!r}.")
        targets = self._targets(ranks)
        outcome = self._request(Pull(0, [name]), targets, None)
        return [outcome.replies[r].value()[0] for r in targets]

    # -- machinery --------------------------------------------------------------------

    def _targets(self, ranks: Sequence[int] | None) -> list[int]:
        if ranks is None:
            return list(range(self.world_size))
        if isinstance(ranks, int):
            ranks = [ranks]
        out = []
        for r in ranks:
            if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < self.world_size:
                raise ValueError(
                    f"rank {r!r} is not in this cluster: ranks are 0 to {self.world_size - 1}."
                )
            if r not in out:
                out.append(r)
        return out

    def _usable_group(self, targets: list[int]) -> RankGroup:
        """The running group, once every targeted rank can take a request; else why not."""
        group = self._group
        if group is None:
            raise ClusterError("the cluster is not running. Start it with cluster.start() (or %dist_start).")
        group.poll(0)  # collect anything that happened since the last request
        group.take_events()
        for r in targets:
            error = unusable_rank_error(r, group.ranks[r].state, group.ranks[r].exitcode)
            if error is not None:
                raise error
        return group

    def _request(self, request: Request, targets: list[int], timeout: float | None) -> Outcome:
        """Ask the targeted ranks (see :func:`helpers._runtime.kept.ask`: a failure interrupts
        the ranks still running and raises); their output goes to a new router."""
        timeout = self.timeout if timeout is None else LaunchSettings.checked("timeout", timeout)
        group = self._usable_group(targets)
        group.router.flush()
        group.router = self._output.router(targets)
        return ask(group, request, targets, timeout, after_failure=self.after_failure)


def _setting_property(name: str) -> property:
    return property(lambda self: getattr(self.settings, name), doc=LaunchSettings.help(name))


# Each setting the ranks were started with is an attribute: cluster.world_size, cluster.timeout, ...
for _name in LaunchSettings.names("cluster"):
    if _name in vars(Cluster):
        raise TypeError(f"the setting {_name!r} would hide Cluster.{_name}; give the setting another name")
    setattr(Cluster, _name, _setting_property(_name))
del _name
