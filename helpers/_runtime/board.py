"""The board: a few bytes per rank, in shared memory, where each rank notes what it is doing.

Each rank writes its own slot (:class:`BoardRecord`: its phase, the torch.distributed call
it is in, with peer and size) around every call, so a hang can be explained even while a
rank is blocked inside C++; after the slots, each rank keeps its point-to-point message
counts per peer (:class:`P2PCounts`), so a deadlock can be found as it forms
(:mod:`helpers._runtime.deadlock`). The notebook creates the board (:meth:`Board.create`)
and reads it; a rank attaches to the file descriptor it received (:meth:`Board.attach`).

Example::

    >>> board = Board.create(2)
    >>> board.post(1, "call", "recv", peer=0, nbytes=16)
    >>> board.read()[1].call, board.read()[1].peer
    ('recv', 0)
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from dataclasses import dataclass
from typing import Callable

from .calls import CALLS

__all__ = [
    "PHASES",
    "FLAG_UNSURE",
    "FLAG_TIMED",
    "COUNT_KINDS",
    "SENDS_POSTED",
    "SENDS_DONE",
    "RECVS_POSTED",
    "RECVS_DONE",
    "board_size",
    "BoardRecord",
    "P2PCounts",
    "Board",
]

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

    def running_writer(self, rank: int) -> Callable[[int, int, int], None]:
        """A function that writes "running" in ``rank``'s slot: ``running(seq, world_seq, flags)``.

        What ``writer(rank)("running", None, None, seq, None, None, world_seq, flags)`` writes,
        with nothing to look up or convert: every wrapped call ends with it.
        """
        pack, buffer, offset, clock, phase = _SLOT_FORMAT.pack_into, self._map, rank * _SLOT, time.perf_counter, \
            _PHASE_INDEX["running"]

        def running(seq: int, world_seq: int, flags: int) -> None:
            pack(buffer, offset, phase, 0, -1, seq, 0, 0, clock(), world_seq, flags)

        return running

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
            in_call = name in ("call", "wait")
            out.append(BoardRecord(
                rank=rank,
                phase=name,
                call=CALLS[call] if in_call and call < len(CALLS) else None,
                peer=None if peer < 0 or not in_call else peer,  # a slot never written reads 0
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
