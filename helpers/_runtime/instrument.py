"""Watching torch.distributed from inside a rank: what it is waiting for, and a trace.

Every rank wraps its communication once, at start, in three layers: the public
torch.distributed functions (:mod:`helpers._runtime.wrapper`), the ``ProcessGroup``
methods a program may call directly (:mod:`helpers._runtime.pgcalls`) and the functional
collectives DTensor uses (:mod:`helpers._runtime.functional`); a call made inside another
(``dist.all_reduce`` ends in ``ProcessGroup.allreduce``) counts once.
The wrappers always note the call in progress on a small shared "board" (a few bytes
per rank in memory the notebook can read at any moment), so that a hang can be
explained even when the rank is stuck inside C++: which call, which peer. Point-to-point
calls also count, per peer, the messages posted and seen complete (on the same board),
so that the notebook can tell that blocked ranks will never be matched and report the
deadlock at once (:mod:`helpers._runtime.deadlock`). With tracing on, each call is also recorded
as an event (op, peer, bytes, dtype, shape, times); the events go home with the
request's reply.

The same wrappers can switch calls off: an exercise that asks for a hand-made
all-reduce runs with ``all_reduce`` and its relatives raising
:class:`~helpers.ForbiddenCallError`, also on the process group object and as a
functional collective, so only point-to-point calls can do the work; whole APIs (DDP,
FSDP, DTensor, pipelining, ...) are switched off by :mod:`helpers._runtime.apis`.

The board and the trace events are records of :mod:`helpers._runtime.protocol`. This
module installs the wrappers and switches calls off; what a wrapper does on each call is
:mod:`helpers._runtime.wrapper`.

This module runs in the ranks only; the notebook side is :mod:`helpers.trace`. Inside a
rank, :func:`current` is the rank's :class:`Instrument` (benchmarks switch its wrappers
off and on with :meth:`Instrument.uninstall` and :meth:`Instrument.install`).

Example (inside a rank)::

    >>> from helpers._runtime.instrument import current
    >>> inst = current()
    >>> inst.tracing = True          # record the next calls as TraceEvents
    >>> dist.barrier(); [e.op for e in inst.take_events()]
    ['barrier']
"""

from __future__ import annotations

import threading
from typing import Any

from . import apis, callargs
from .board import Board
from .calls import APIS, COLLECTIVES, FORBIDDEN_ALIASES, FORBIDDEN_FUNCTIONAL, POINT_TO_POINT
from .ddp_watch import watch_ddp
from .functional import refuse_functional, wrap_functional
from .pgcalls import wrap_process_group
from .protocol import TraceEvent
from .wrapper import Depth, wrap

__all__ = ["Instrument", "current", "LAYERS"]

_current: "Instrument | None" = None
_INHERITED = object()  # an attribute a class only inherits: putting it back means deleting ours
_UNSET = object()
#: The layers of wrappers, as :meth:`Instrument.uninstall` names them.
LAYERS = ("torch.distributed", "process_group", "functional", "ddp")


def current() -> "Instrument | None":
    """The rank's instrument (None outside a rank, or with HELPERS_NO_INSTRUMENT=1)."""
    return _current


class Instrument:
    """The wrappers of one rank: board updates always, events when tracing.

    It puts them in place (:meth:`install`), puts torch's functions back (:meth:`uninstall`)
    and switches calls off (:meth:`forbid`); each wrapper, and what it does on a call, is
    made by :func:`helpers._runtime.wrapper.wrap`. The wrappers keep their state here: the
    board's writer and message counts, the sequence numbers, the events, the nesting depth.
    """

    def __init__(self, rank: int, board: Board | None, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.tracing = False
        self.events: list[TraceEvent] = []
        # With tracing, a list here also keeps a copy of each call's tensor beside its event
        # ((event, tensor) pairs): what a send or an all-gather carried, for checks that must
        # know it (lesson 9's all-gather of the updated parameters). None: nothing is kept.
        self.payloads: list[tuple[TraceEvent, Any]] | None = None
        self.forbidden: dict[str, str] = {}  # collectives refused by the wrappers, with their reasons
        self.refused: dict[str, str] = {}  # everything switched off now, as forbid() was given it
        self._refusing: set[tuple[Any, str]] = set()  # attributes replaced by refusers
        self.seq = 0  # collectives entered, on any group
        self.world_seq = 0  # collectives entered on the default group (every rank makes these in one order)
        self._local = Depth()  # how deep in wrapped calls each thread is
        self.awaiting: dict[int, tuple] = {}  # functional collectives' results not waited for yet
        self._layers: dict[tuple[Any, str], str] = {}  # each wrapped attribute's layer (LAYERS)
        self._board = board
        self._write = board.writer(rank) if board is not None else None
        self._running = board.running_writer(rank) if board is not None else None
        # This rank's row of point-to-point message counts on the board (peer * 4 + kind),
        # and FLAG_UNSURE once a call was made that the counts cannot describe.
        self.counts = board.counter(rank) if board is not None else None
        self.flags = 0
        self.main_thread = threading.main_thread().ident
        self.threads = threading.active_count()  # in a rank, 1: its main thread
        self.non_member = None  # what new_group gives a rank outside the group (set by install)
        self._originals: dict[tuple[Any, str], Any] = {}

    # -- board ------------------------------------------------------------------------

    def post(self, phase: str, call: str | None = None, peer: int | None = None,
             nbytes: int | None = None, members: int | None = None, flags: int = 0) -> None:
        if self._write is not None:
            self._write(phase, call, peer, self.seq, nbytes, members, self.world_seq, self.flags | flags)

    def running(self) -> None:
        """``post("running")``, faster: what every wrapped call does as it returns."""
        if self._running is not None:
            self._running(self.seq, self.world_seq, self.flags)

    # -- install ----------------------------------------------------------------------

    def install(self) -> None:
        """Put the wrappers in place (idempotent)."""
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        global _current
        _current = self
        self.non_member = getattr(dist.GroupMember, "NON_GROUP_MEMBER", None)
        if getattr(self, "_installed", None):
            for (owner, name), wrapped in self._installed.items():
                setattr(owner, name, wrapped)
            return
        for name in POINT_TO_POINT + COLLECTIVES:
            original = getattr(c10d, name, None)
            if original is None:
                continue
            wrapped = wrap(self, name, original)  # one object for both names: P2POp checks op in [isend, irecv]
            self._set(c10d, name, wrapped, layer="torch.distributed")
            if getattr(dist, name, None) is original:
                self._set(dist, name, wrapped, layer="torch.distributed")
        wrap_process_group(self)
        wrap_functional(self)
        watch_ddp(self)
        self._installed = {key: vars(key[0])[key[1]] for key in self._originals}

    def uninstall(self, layers: tuple[str, ...] = LAYERS) -> None:
        """Put torch's own functions back, in these layers (:data:`LAYERS`): used to measure the wrappers' cost."""
        for key, original in self._originals.items():
            if key in getattr(self, "_installed", {}) and self._layers.get(key, "ddp") in layers:
                self._put_back(key, original)

    def _set(self, owner: Any, name: str, value: Any, refusing: bool = False, layer: str | None = None,
             original: Any = _UNSET) -> None:
        # The attribute as it sits in the owner's own dict: a class's method is kept as its
        # descriptor (getattr would unwrap a pybind11 method, which then no longer binds
        # ``self`` when put back), and one it only inherits is kept as _INHERITED.
        self._originals.setdefault((owner, name), vars(owner).get(name, _INHERITED) if original is _UNSET else original)
        setattr(owner, name, value)
        if refusing:
            self._refusing.add((owner, name))
        if layer is not None:
            self._layers[(owner, name)] = layer

    def _put_back(self, key: tuple[Any, str], value: Any) -> None:
        owner, name = key
        if value is _INHERITED:
            delattr(owner, name)
        else:
            setattr(owner, name, value)

    def refuse_only(self, reasons: dict[str, str]) -> None:
        """Make exactly these calls switched off (name -> reason), putting back any other switched off before.

        What a request that brings its own ``forbid`` does on kept ranks (see
        :meth:`helpers.Cluster.run`): the calls the last request switched off work again, with
        the wrappers in place, and these are refused. Nothing changes when they are already so.
        """
        if reasons == self.refused:
            return
        apis.WATCH.clear()
        installed = getattr(self, "_installed", {})
        for key in self._refusing:
            self._put_back(key, installed.get(key, self._originals[key]))
        self._refusing.clear()
        self.forbidden.clear()
        self.refused = {}
        self.forbid(reasons)

    def forbid(self, reasons: dict[str, str]) -> None:
        """Switch off these calls (name -> the reason the learner reads).

        A collective's name also switches off its process-group methods and its functional
        collectives (however they are reached); a name of :data:`~helpers._runtime.calls.APIS`
        switches off a whole API (:mod:`helpers._runtime.apis`).
        """
        self.refused = {**self.refused, **reasons}
        for name, reason in reasons.items():
            if name in APIS:
                apis.switch_off(self, name, reason)
                continue
            self.forbidden[name] = reason
            for method in FORBIDDEN_ALIASES.get(name, ()):
                for cls in callargs.process_group_classes():
                    if hasattr(cls, method):
                        self._set(cls, method, apis.refuser(f"{cls.__name__}.{method}", reason, name), refusing=True)
            if name in FORBIDDEN_FUNCTIONAL:
                refuse_functional(self, FORBIDDEN_FUNCTIONAL[name], reason, name)

    def take_events(self) -> list[TraceEvent]:
        """The events recorded since the last call (and the functional results still awaited are forgotten)."""
        events, self.events = self.events, []
        self.awaiting.clear()
        return events
