"""The contract between the notebook and its ranks: every message and record, typed.

Three processes talk: the notebook (the kernel), the rank factory that forks ranks, and
the ranks. Everything they send each other is one of the classes below, pickled and
framed by :mod:`helpers._runtime.wire` (ranks) or sent as one packet (factory):

- launch specs, notebook -> factory -> rank: :class:`GroupSpec` (the same for every
  rank of a group) and :class:`RankSpec` (one per rank);
- factory requests :class:`Spawn`, :class:`Signal`, :class:`Stop`, and the factory's
  events :class:`Hello`, :class:`Fatal`, :class:`Spawned`, :class:`Exited`;
- requests, notebook -> rank: :class:`Call`, :class:`Exec`, :class:`Push`, :class:`Pull`;
- replies, rank -> notebook: :class:`Ready`, :class:`Started`, :class:`Result`, :class:`Failure`; and
  :class:`Death`, which the notebook makes from the factory's :class:`Exited` when a
  rank ends while something still waited for it;
- :class:`RankException`: an exception raised in a rank, captured there
  (:meth:`RankException.capture`); :mod:`helpers._runtime.report` turns it into the notebook's
  error;
- :class:`TraceEvent`: one traced torch.distributed call.

The board each rank writes what it is doing on is in :mod:`helpers._runtime.board`, and
the names of the torch.distributed calls the helpers watch in :mod:`helpers._runtime.calls`.

Example::

    >>> try:
    ...     raise ValueError("no such rank")
    ... except ValueError as exc:
    ...     failure = Failure(rank=1, id=7, error=RankException.capture(exc))
    >>> failure.error.type, failure.error.message, failure.error.original().args
    ('ValueError', 'no such rank', ('no such rank',))
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Union

__all__ = [
    "FD_NAMES",
    "GroupSpec",
    "RankSpec",
    "Spawn",
    "Signal",
    "Stop",
    "Hello",
    "Fatal",
    "Spawned",
    "Exited",
    "Call",
    "Exec",
    "Push",
    "Pull",
    "Request",
    "Ready",
    "Started",
    "Result",
    "Failure",
    "Death",
    "Frame",
    "RankException",
    "TraceEvent",
]

# --------------------------------------------------------------------------------------
# Launch specs.
# --------------------------------------------------------------------------------------

#: The pipes and shared memory each rank receives, in this order.
FD_NAMES = ("stdout", "stderr", "cmd", "reply", "diag", "board")


@dataclass(frozen=True)
class GroupSpec:
    """What every rank of one group needs to set itself up like a torchrun process."""

    world_size: int
    backend: str
    init: bool  # set up the default process group before serving requests
    pg_timeout: float  # seconds; the process group's own timeout
    env: dict[str, str]  # the environment every rank starts with
    cwd: str
    sys_path: list[str]
    threads: int  # torch intra-op threads per rank, unless OMP_NUM_THREADS is set
    sources: dict[str, list[str]]  # notebook cells' source lines, for tracebacks
    store_path: str | None = None  # the rendezvous FileStore (with init)
    store_dir: str | None = None  # its folder, removed by the factory if the notebook cannot
    forbid: dict[str, str] = field(default_factory=dict)  # call name -> why it is switched off


@dataclass(frozen=True)
class RankSpec:
    """One rank's own part of a launch."""

    rank: int
    fds: list[int]  # indices, in FD_NAMES order, into the descriptors sent with Spawn
    device: int | None  # the GPU of this rank (nccl), else None
    env: dict[str, str]  # RANK, LOCAL_RANK, GROUP_RANK, ROLE_RANK


# --------------------------------------------------------------------------------------
# Notebook <-> factory.
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spawn:
    """Fork these ranks (their pipe ends travel with the packet)."""

    gid: int
    ranks: list[RankSpec]
    group: GroupSpec


@dataclass(frozen=True)
class Signal:
    """Send ``sig`` to the group's ranks (or only ``ranks``); SIGTERM and SIGKILL reach
    each rank's whole process group."""

    gid: int
    sig: int
    ranks: list[int] | None = None


@dataclass(frozen=True)
class Stop:
    """Kill every rank and exit."""


@dataclass(frozen=True)
class Hello:
    """The factory is ready; ``info`` is what it found on the machine."""

    info: dict[str, Any]


@dataclass(frozen=True)
class Fatal:
    """The factory could not start (``error`` is its traceback)."""

    error: str


@dataclass(frozen=True)
class Spawned:
    gid: int
    pids: list[int]


@dataclass(frozen=True)
class Exited:
    gid: int
    rank: int
    pid: int
    code: int  # negative: killed by that signal


# --------------------------------------------------------------------------------------
# Notebook -> rank: requests.
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """Call ``fn(rank, world_size, *args, **kwargs)``; ``payload`` is the cloudpickled
    ``(fn, args, kwargs)``. ``forbid`` (call name -> reason), when given, is what is
    switched off while this call runs, instead of the group's own :attr:`GroupSpec.forbid`."""

    id: int
    payload: bytes
    trace: bool = False
    forbid: dict[str, str] | None = None


@dataclass(frozen=True)
class Exec:
    """Run a cell's source in the rank's namespace; the value of its last expression
    comes back."""

    id: int
    source: str
    filename: str
    trace: bool = False


@dataclass(frozen=True)
class Push:
    """Set variables in the rank's namespace (``payload``: a cloudpickled dict)."""

    id: int
    payload: bytes
    trace: bool = False


@dataclass(frozen=True)
class Pull:
    """Send back the values of these variables."""

    id: int
    names: list[str]
    trace: bool = False


Request = Union[Call, Exec, Push, Pull]

# --------------------------------------------------------------------------------------
# Rank -> notebook: replies.
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ready:
    """The rank is set up and waits for requests."""

    rank: int
    pid: int
    main_thread: int


@dataclass(frozen=True)
class Started:
    """The rank has loaded request ``id`` (unpickled the function and its arguments, which
    imports the modules they use) and now runs the learner's code: start-up is over, and
    the request's timeout counts from the moment every rank asked has sent this."""

    rank: int
    id: int


@dataclass
class Result:
    """A request finished. ``data`` is the cloudpickled value (None if it could not be
    pickled: then ``text`` is its repr, which :class:`Exec` always sends)."""

    rank: int
    id: int
    data: bytes | None
    text: str | None = None
    trace: list["TraceEvent"] = field(default_factory=list)
    time: float = field(default_factory=time.time)

    def value(self) -> Any:
        from .wire import loads

        return loads(self.data) if self.data is not None else self.text


@dataclass(frozen=True)
class Frame:
    filename: str
    lineno: int
    name: str
    line: str | None = None


@dataclass
class RankException:
    """An exception raised in a rank, in a form that always reaches the notebook."""

    type: str  # the class's qualified name
    message: str
    text: str  # the formatted traceback
    frames: list[Frame]
    pickled: bytes | None  # the exception itself, when it could be pickled
    time: float
    phase: str = "run"  # "init": while joining the process group; "load": while loading a request

    @classmethod
    def capture(cls, exc: BaseException, skip_file: str | None = None, phase: str = "run") -> "RankException":
        """Describe ``exc`` in the rank; leading frames of ``skip_file`` (the rank loop) are left out."""
        tb = exc.__traceback__
        while skip_file and tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) == skip_file:
            tb = tb.tb_next
        te = traceback.TracebackException(type(exc), exc, tb, capture_locals=False)
        try:
            import cloudpickle

            pickled = cloudpickle.dumps(exc)
        except Exception:  # noqa: BLE001 - sent without the object, by its text
            pickled = None
        return cls(
            type=type(exc).__qualname__,
            message=str(exc),
            text="".join(te.format()),
            frames=[Frame(f.filename, f.lineno, f.name, f.line) for f in te.stack],
            pickled=pickled,
            time=time.time(),
            phase=phase,
        )

    def original(self) -> BaseException | None:
        """The rank's exception object, when its class exists here too."""
        if self.pickled is None:
            return None
        try:
            from .wire import loads

            return loads(self.pickled)
        except Exception:  # noqa: BLE001 - a class defined only on the rank
            return None


@dataclass
class Failure:
    """A request raised (or the rank could not set up its process group: ``id`` None)."""

    rank: int
    id: int | None
    error: RankException

    @property
    def time(self) -> float:
        return self.error.time


@dataclass
class Death:
    """A rank ended while the notebook still waited for it (made from :class:`Exited`)."""

    rank: int
    code: int | None
    time: float = field(default_factory=time.time)


# --------------------------------------------------------------------------------------
# Traces.
# --------------------------------------------------------------------------------------


@dataclass
class TraceEvent:
    """One communication call on one rank: a torch.distributed function, or (``via``) a
    ProcessGroup method called directly or a functional collective.

    ``start``/``end`` bound the call itself; for asynchronous calls (``isend``,
    ``irecv``, ``async_op=True``, a functional collective) ``waited`` is when ``wait()``
    (``wait_tensor`` for a functional collective) returned, if it was called. In a rank the times are ``time.perf_counter()`` values; in a
    :class:`~helpers.trace.Trace` they are seconds from the trace's first call.
    """

    rank: int
    op: str
    peer: int | None
    nbytes: int | None
    dtype: str | None
    shape: tuple | None
    start: float
    end: float
    async_op: bool = False
    wait_start: float | None = None
    waited: float | None = None
    tag: int = 0
    group: list[int] | None = None
    batch: bool = False
    seq: int | None = None
    offset: int | None = None  # where the tensor starts in its storage, in bytes
    base_nbytes: int | None = None  # the size of that storage
    reduce_op: str | None = None
    note: str | None = None  # what made the call, where it was not the rank's own code ("DDP bucket 2")
    # How the call was made, where it was not a torch.distributed function: "process_group" (a
    # ProcessGroup method called directly; ``note`` names it) or "functional" (a functional
    # collective, as DTensor makes; ``note`` names the op). ``op`` is always the public call doing that work.
    via: str | None = None

    @property
    def done(self) -> float:
        """When the operation was known to be complete (end, or the end of its wait)."""
        return self.waited if self.waited is not None else self.end

    @property
    def is_send(self) -> bool:
        return self.op in ("send", "isend", "send_object_list")

    @property
    def is_recv(self) -> bool:
        return self.op in ("recv", "irecv", "recv_object_list")

    @property
    def is_p2p(self) -> bool:
        return self.is_send or self.is_recv
