"""The contract between the notebook and its ranks: every message and record, typed.

Three processes talk: the notebook (the kernel), the rank factory that forks ranks, and
the ranks. Everything they send each other is one of the classes below, pickled and
framed by :mod:`helpers._runtime.wire` (ranks) or sent as one packet (factory):

- launch specs, notebook -> factory -> rank: :class:`GroupSpec` (the same for every
  rank of a group) and :class:`RankSpec` (one per rank);
- factory requests :class:`Spawn`, :class:`Signal`, :class:`Stop`, and the factory's
  events :class:`Hello`, :class:`Fatal`, :class:`Spawned`, :class:`Exited`;
- requests, notebook -> rank: :class:`Call`, :class:`Exec`, :class:`Push`, :class:`Pull`;
- replies, rank -> notebook: :class:`Ready`, :class:`Result`, :class:`Failure`; and
  :class:`Death`, which the notebook makes from the factory's :class:`Exited` when a
  rank ends while something still waited for it;
- :class:`RankException`: an exception raised in a rank, captured there
  (:meth:`RankException.capture`); :mod:`helpers._runtime.report` turns it into the notebook's
  error;
- :class:`BoardRecord` and :class:`Board`: the few bytes per rank, in shared memory,
  where each rank notes what it is doing right now (so a hang can be explained even
  while a rank is blocked inside C++), and :class:`P2PCounts`, the point-to-point
  messages each rank posted and saw complete per peer, on the same board (so a deadlock
  can be found as it forms, :mod:`helpers._runtime.deadlock`);
- :class:`TraceEvent`: one traced torch.distributed call.

The names of the torch.distributed calls the helpers watch are here too:
:data:`POINT_TO_POINT`, :data:`COLLECTIVES` and :data:`DATA_COLLECTIVES` (every
collective that moves data, the set an exercise switches off when it asks for a
hand-made one).

Example::

    >>> board = Board.create(2)
    >>> board.post(1, "call", "recv", peer=0, nbytes=16)
    >>> board.read()[1].call, board.read()[1].peer
    ('recv', 0)
"""

from __future__ import annotations

import mmap
import os
import pickle
import struct
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Union

__all__ = [
    "POINT_TO_POINT",
    "COLLECTIVES",
    "DATA_COLLECTIVES",
    "DDP",
    "CALLS",
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
    "Result",
    "Failure",
    "Death",
    "Frame",
    "RankException",
    "BoardRecord",
    "P2PCounts",
    "Board",
    "board_size",
    "FLAG_UNSURE",
    "FLAG_TIMED",
    "TraceEvent",
]

# --------------------------------------------------------------------------------------
# The torch.distributed calls the helpers know.
# --------------------------------------------------------------------------------------

POINT_TO_POINT = ("send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list", "recv_object_list")
COLLECTIVES = (
    "broadcast",
    "all_reduce",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "gather",
    "scatter",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "monitored_barrier",
    "broadcast_object_list",
    "all_gather_object",
    "gather_object",
    "scatter_object_list",
    "_all_gather_base",
    "_reduce_scatter_base",
    # Newer names; each is wrapped only where the installed torch has it.
    "all_gather_single",  # the successor of all_gather_into_tensor
    "reduce_scatter_single",  # the successor of reduce_scatter_tensor
    "all_reduce_coalesced",
    "all_gather_coalesced",
    "gather_single",  # torch 2.14: gather into one tensor on dst
    "gather_into_tensor",  # torch 2.14's deprecated name for gather_single
)
#: Every collective that moves data (all but the barriers): what an exercise that builds
#: its own collective switches off. The object collectives are in it: they call the others.
DATA_COLLECTIVES = tuple(c for c in COLLECTIVES if c not in ("barrier", "monitored_barrier"))
#: Pass this name in ``forbid`` to switch off ``torch.nn.parallel.DistributedDataParallel``.
DDP = "DistributedDataParallel"
#: Pass this name in ``forbid`` to switch off the course's own ring all-reduce (``helpers.ring``,
#: which lesson 8 teaches): an exercise that asks for a ring must not be answered by calling it.
COURSE_RING = "helpers.ring"
#: Every call a rank notes on the board (its index is what the board stores).
#: What DistributedDataParallel's constructor is noted as on the board while it runs: it
#: broadcasts rank 0's weights from C++, a collective every rank of the group must join.
DDP_CONSTRUCTOR = "DistributedDataParallel"
CALLS = POINT_TO_POINT + COLLECTIVES + ("wait", DDP_CONSTRUCTOR)

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
    phase: str = "run"  # "init": while joining the process group

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
# The board: what each rank is doing right now.
# --------------------------------------------------------------------------------------

# What a rank can be doing, in the order the board stores them.
PHASES = (
    "starting",  # setting itself up, joining the process group
    "ready",  # waiting for the next request
    "running",  # running a request, outside any torch.distributed call
    "call",  # inside a torch.distributed call
    "wait",  # inside wait() on an asynchronous request
)
_PHASE_INDEX = {name: i for i, name in enumerate(PHASES)}
_CALL_INDEX = {name: i for i, name in enumerate(CALLS)}
# phase, call index, peer, collective sequence number, bytes, group members bit mask, start time,
# collectives entered on the default group, flags (FLAG_UNSURE, FLAG_TIMED)
_SLOT_FORMAT = struct.Struct("<BBhIQQdIB")
_SLOT = 64

#: A slot flag, kept from the first time it is set for the rank's life: the rank made a
#: point-to-point call its message counts cannot describe (a receive from any source,
#: send_object_list/recv_object_list, batch_isend_irecv, or a call from a thread other than
#: the main one), so nobody can tell from the board that its peers' calls will never be
#: matched, and deadlocks are left to the timeout (see :mod:`helpers._runtime.deadlock`).
FLAG_UNSURE = 1
#: A slot flag for the call in progress: it has a timeout of its own (``work.wait(timeout)``),
#: so it may return without any peer doing anything.
FLAG_TIMED = 2

#: The message counts each rank keeps per peer, in this order (see :class:`P2PCounts`).
COUNT_KINDS = ("sends_posted", "sends_done", "recvs_posted", "recvs_done")
SENDS_POSTED, SENDS_DONE, RECVS_POSTED, RECVS_DONE = range(4)
_COUNT = struct.calcsize("<I")


def board_size(world_size: int) -> int:
    """Bytes of a board: a slot per rank, then a row of message counts per rank (4 per peer).

    >>> board_size(2)
    192
    """
    return _SLOT * world_size + _COUNT * len(COUNT_KINDS) * world_size * world_size


def _world_size_of(size: int) -> int:
    for world_size in range(1, 65):
        if board_size(world_size) == size:
            return world_size
    raise ValueError(f"a board of {size} bytes fits no world size from 1 to 64")


@dataclass(frozen=True)
class BoardRecord:
    """One rank's slot: its phase, and the call it is in (``call``/``wait`` phases)."""

    rank: int
    phase: str
    call: str | None = None
    peer: int | None = None
    seq: int = 0  # how many collectives the rank had entered (matches calls across ranks)
    nbytes: int = 0
    members: list[int] | None = None  # the group's ranks, when not the default group
    start: float = 0.0
    # How many collectives on the default group the rank had entered, this call included.
    # Every rank makes those in the same order, so unlike ``seq`` (which counts subgroups'
    # calls too) it says, also after a rank returned, whether it made a given call.
    world_seq: int = 0
    flags: int = 0  # FLAG_UNSURE, FLAG_TIMED

    @property
    def in_call(self) -> bool:
        return self.phase in ("call", "wait") and self.call is not None

    @property
    def unsure(self) -> bool:
        """The rank made a point-to-point call its message counts cannot describe."""
        return bool(self.flags & FLAG_UNSURE)

    @property
    def timed(self) -> bool:
        """The call in progress has its own timeout: it may return with no peer's help."""
        return bool(self.flags & FLAG_TIMED)


@dataclass(frozen=True)
class P2PCounts:
    """Every rank's point-to-point message counts, per peer, as read from the board.

    Rank R's wrappers keep, for each peer P: the sends to P it posted (counted before the
    call goes into torch), the sends to P it saw complete (the blocking call returned, or
    ``wait()`` on the request did), and the same two for receives from P. A request whose
    completion nobody waited for is never counted complete.

    >>> counts = P2PCounts(2, (0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0))
    >>> counts.get(0, 1, SENDS_POSTED), counts.get(1, 0, RECVS_POSTED), counts.get(1, 0, RECVS_DONE)
    (1, 1, 0)
    """

    world_size: int
    values: tuple[int, ...]  # [rank][peer][kind], flattened

    def get(self, rank: int, peer: int, kind: int) -> int:
        """Rank ``rank``'s count of ``kind`` (:data:`SENDS_POSTED`...) for ``peer``."""
        return self.values[(rank * self.world_size + peer) * 4 + kind]

    def pair(self, rank: int, peer: int) -> tuple[int, ...]:
        """All four counts rank ``rank`` keeps for ``peer``."""
        at = (rank * self.world_size + peer) * 4
        return self.values[at:at + 4]

    @classmethod
    def zero(cls, world_size: int) -> "P2PCounts":
        return cls(world_size, (0,) * (4 * world_size * world_size))


class Board:
    """Shared memory with one slot per rank, then each rank's message counts per peer; the
    notebook creates it, each rank writes its own slot and its own row of counts."""

    def __init__(self, fd: int, world_size: int, owner: bool) -> None:
        self.fd = fd
        self.world_size = world_size
        self._owner = owner
        self._map = mmap.mmap(fd, board_size(world_size))
        self._views: list[memoryview] = []  # released before the map is closed

    @classmethod
    def create(cls, world_size: int) -> "Board":
        """A new board (notebook side); every slot reads ``starting``, every count 0."""
        fd = os.memfd_create("helpers-board", os.MFD_CLOEXEC)
        os.ftruncate(fd, board_size(world_size))
        return cls(fd, world_size, owner=True)

    @classmethod
    def attach(cls, fd: int) -> "Board":
        """The board a rank received as a file descriptor (its size says how many slots)."""
        return cls(fd, _world_size_of(os.fstat(fd).st_size), owner=False)

    def post(self, rank: int, phase: str, call: str | None = None, *, peer: int | None = None,
             seq: int = 0, nbytes: int | None = None, members: int | None = None, world_seq: int = 0,
             flags: int = 0) -> None:
        self.writer(rank)(phase, call, peer, seq, nbytes, members, world_seq, flags)

    def writer(self, rank: int) -> Callable[..., None]:
        """A function that writes ``rank``'s slot: ``write(phase, call, peer, seq, nbytes, members, world_seq, flags)``.

        What :meth:`post` does, with the slot's place worked out once: a rank's wrappers
        write their slot around every call, so each microsecond here is paid many times.
        Every write stamps the slot with the time, so a rank that left a call and went
        back into the same one is told apart from a rank that never left it.
        """
        pack, buffer, offset, clock = _SLOT_FORMAT.pack_into, self._map, rank * _SLOT, time.perf_counter

        def write(phase: str, call: str | None = None, peer: int | None = None, seq: int = 0,
                  nbytes: int | None = None, members: int | None = None, world_seq: int = 0, flags: int = 0) -> None:
            pack(buffer, offset, _PHASE_INDEX[phase], _CALL_INDEX.get(call, 0) if call else 0,
                 -1 if peer is None else int(peer), seq, int(nbytes or 0), int(members or 0), clock(), world_seq,
                 flags)

        return write

    def counter(self, rank: int) -> memoryview:
        """``rank``'s row of message counts, writable in place: ``row[peer * 4 + kind] += 1``
        (``kind`` one of :data:`SENDS_POSTED`, :data:`SENDS_DONE`, :data:`RECVS_POSTED`,
        :data:`RECVS_DONE`). One aligned 4-byte store per count, so a reader never sees
        half of one."""
        row = len(COUNT_KINDS) * self.world_size * _COUNT
        start = _SLOT * self.world_size + rank * row
        base = memoryview(self._map)
        view = base[start:start + row].cast("I")
        self._views += [view, base]
        return view

    def read_counts(self) -> P2PCounts:
        """Every rank's message counts, as they are now."""
        start = _SLOT * self.world_size
        with memoryview(self._map) as base, base[start:] as area, area.cast("I") as counts:
            return P2PCounts(self.world_size, tuple(counts.tolist()))

    def read(self) -> list[BoardRecord]:
        out = []
        for rank in range(self.world_size):
            phase, call, peer, seq, nbytes, mask, start, world_seq, flags = _SLOT_FORMAT.unpack_from(
                self._map, rank * _SLOT)
            name = PHASES[phase] if phase < len(PHASES) else "running"
            out.append(BoardRecord(
                rank=rank,
                phase=name,
                call=CALLS[call] if name in ("call", "wait") and call < len(CALLS) else None,
                peer=None if peer < 0 else peer,
                seq=seq,
                nbytes=nbytes,
                members=[r for r in range(64) if mask >> r & 1] if mask else None,
                start=start,
                world_seq=world_seq,
                flags=flags,
            ))
        return out

    def close(self) -> None:
        for view in self._views:
            view.release()
        self._views = []
        self._map.close()
        if self._owner:
            os.close(self.fd)


# --------------------------------------------------------------------------------------
# Traces.
# --------------------------------------------------------------------------------------


@dataclass
class TraceEvent:
    """One torch.distributed call on one rank.

    ``start``/``end`` bound the call itself; for asynchronous calls (``isend``,
    ``irecv``, ``async_op=True``) ``waited`` is when ``wait()`` returned, if it was
    called. In a rank the times are ``time.perf_counter()`` values; in a
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
