"""Watching torch.distributed from inside a rank: what it is waiting for, and a trace.

Every rank wraps the public torch.distributed communication functions once, at start.
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
:class:`~helpers.ForbiddenCallError`, also on the process group object, so only
point-to-point calls can do the work.

The board and the trace events are records of :mod:`helpers._runtime.protocol`.

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

import inspect
import threading
import time
from typing import Any, Callable

from ..errors import ForbiddenCallError
from . import callargs
from .board import FLAG_UNSURE, RECVS_DONE, RECVS_POSTED, SENDS_DONE, SENDS_POSTED, Board
from .calls import COLLECTIVES, COURSE_RING, DDP, FORBIDDEN_ALIASES, KNOWN, POINT_TO_POINT, family_of
from .ddp_watch import watch_ddp
from .protocol import TraceEvent
from .work import TracedWork, threaded

__all__ = ["Instrument", "current"]

_current: "Instrument | None" = None
_INHERITED = object()  # an attribute a class only inherits: putting it back means deleting ours


def current() -> "Instrument | None":
    """The rank's instrument (None outside a rank, or with HELPERS_NO_INSTRUMENT=1)."""
    return _current


class Instrument:
    """The wrappers of one rank: board updates always, events when tracing."""

    def __init__(self, rank: int, board: Board | None, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.tracing = False
        self.events: list[TraceEvent] = []
        self.forbidden: dict[str, str] = {}  # collectives refused by the wrappers, with their reasons
        self.refused: dict[str, str] = {}  # everything switched off now, as forbid() was given it
        self._refusing: set[tuple[Any, str]] = set()  # attributes replaced by refusers
        self.seq = 0  # collectives entered, on any group
        self.world_seq = 0  # collectives entered on the default group (every rank makes these in one order)
        self._local = threading.local()
        self._board = board
        self._write = board.writer(rank) if board is not None else None
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

    def _posted(self, name: str, peer: Any, tensor: Any, group: Any) -> int:
        """Count a point-to-point call about to go into torch; returns where its completion
        is counted (-1: not counted).

        Posted counts go up before the call starts (before the board says "call"), so a
        message in flight is always counted. What the counts cannot describe marks the
        rank unsure instead (:data:`~helpers._runtime.board.FLAG_UNSURE`): a receive from any
        source, the object calls (two messages each, one of them of unknown size), a
        tensor off the CPU (nccl's sends may finish before their receive is posted, which
        gloo's never do, and the rules rely on that), and a call while the rank runs
        Python threads besides its main one (the board shows one call per rank: another
        thread may be about to send what this call waits for). A call on a group this
        rank is not in does nothing, and is not counted.
        """
        counts = self.counts
        if counts is None or (group is not None and group == self.non_member):
            return -1
        sending = name in ("send", "isend")
        if name in ("send_object_list", "recv_object_list") or (peer is None and not sending) \
                or not getattr(tensor, "is_cpu", True) or threaded(self):
            self.flags |= FLAG_UNSURE
            return -1
        try:
            peer = int(peer)
        except (TypeError, ValueError):
            return -1
        if not 0 <= peer < self.world_size:
            return -1  # torch refuses it: no message
        at = peer * 4
        counts[at + (SENDS_POSTED if sending else RECVS_POSTED)] += 1
        return at + (SENDS_DONE if sending else RECVS_DONE)

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
            wrapped = self._wrap(name, original)
            self._set(c10d, name, wrapped)
            if getattr(dist, name, None) is original:
                self._set(dist, name, wrapped)
        watch_ddp(self)
        self._installed = {key: vars(key[0])[key[1]] for key in self._originals}

    def uninstall(self) -> None:
        """Put torch.distributed's own functions back (used to measure the wrappers' cost)."""
        for key, original in self._originals.items():
            if key in getattr(self, "_installed", {}):
                self._put_back(key, original)

    def _set(self, owner: Any, name: str, value: Any, refusing: bool = False) -> None:
        # The attribute as it sits in the owner's own dict: a class's method is kept as its
        # descriptor (getattr would unwrap a pybind11 method, which then no longer binds
        # ``self`` when put back), and one it only inherits is kept as _INHERITED.
        self._originals.setdefault((owner, name), vars(owner).get(name, _INHERITED))
        setattr(owner, name, value)
        if refusing:
            self._refusing.add((owner, name))

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
        installed = getattr(self, "_installed", {})
        for key in self._refusing:
            self._put_back(key, installed.get(key, self._originals[key]))
        self._refusing.clear()
        self.forbidden.clear()
        self.refused = {}
        self.forbid(reasons)

    def forbid(self, reasons: dict[str, str]) -> None:
        """Switch off these calls (name -> the reason the learner reads).

        A collective's name also switches off its process-group methods and functional
        version; :data:`~helpers._runtime.calls.DDP` switches off DistributedDataParallel.
        """
        self.refused = {**self.refused, **reasons}
        for name, reason in reasons.items():
            if name == DDP:
                self._forbid_ddp(reason)
                continue
            if name == COURSE_RING:
                self._forbid_course_ring(reason)
                continue
            self.forbidden[name] = reason
            for method in FORBIDDEN_ALIASES.get(name, ()):
                for cls in callargs.process_group_classes():
                    if hasattr(cls, method):
                        self._set(cls, method, _refuser(f"{cls.__name__}.{method}", reason, name), refusing=True)
            try:
                import torch.distributed._functional_collectives as fc
            except ImportError:
                continue
            for fname in (name, name.replace("all_reduce", "all_reduce_inplace")):
                if hasattr(fc, fname):
                    self._set(fc, fname, _refuser(f"_functional_collectives.{fname}", reason, name), refusing=True)

    def _forbid_course_ring(self, reason: str) -> None:
        from .. import ring

        for fname in ring.__all__:
            self._set(ring, fname, _refuser(f"helpers.ring.{fname}", reason, COURSE_RING), refusing=True)

    def _forbid_ddp(self, reason: str) -> None:
        from torch.nn.parallel import DistributedDataParallel

        self._set(DistributedDataParallel, "__init__",
                  _refuser("torch.nn.parallel.DistributedDataParallel", reason, DDP), refusing=True)

    # -- the wrapper ------------------------------------------------------------------

    def _wrap(self, name: str, fn: Callable) -> Callable:
        params = list(inspect.signature(fn).parameters)
        peer_param = next((p for p in callargs.PEER_PARAMS if p in params), None)
        group_peer_param = next((p for p in callargs.GROUP_PEER_PARAMS if p in params), None)
        tensor_param = KNOWN[name].tensor or (params[0] if params else None)
        is_p2p = name in POINT_TO_POINT
        blocking = name in ("send", "recv")  # returns when the message is done (isend/irecv: at wait())
        inst = self
        local = self._local
        position = {p: i for i, p in enumerate(params)}

        def argument(args: tuple, kwargs: dict, param: str | None) -> Any:
            # What the call passed for ``param``, by position or by name (this runs on every call:
            # no dict of every argument unless tracing needs one).
            if param is None:
                return None
            i = position.get(param)
            if i is not None and i < len(args):
                return args[i]
            return kwargs.get(param)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if name in inst.forbidden:
                raise ForbiddenCallError(f"torch.distributed.{name}", inst.forbidden[name], family_of(name), name)
            if getattr(local, "depth", 0):  # a call made by another wrapped call
                return fn(*args, **kwargs)
            peer = argument(args, kwargs, peer_param)
            group = argument(args, kwargs, "group")
            if peer is None and group_peer_param:
                group_peer = argument(args, kwargs, group_peer_param)
                if group_peer is not None:
                    peer = callargs.global_rank(group, group_peer)
            if name == "batch_isend_irecv":
                return inst._batch(fn, argument(args, kwargs, "p2p_op_list") or [])
            tensor = argument(args, kwargs, tensor_param)
            nbytes = callargs.nbytes(tensor)
            members = None if is_p2p else callargs.members(group)
            if is_p2p:
                count = inst._posted(name, peer, tensor, group)
            else:
                count = -1
                if threading.get_ident() != inst.main_thread:  # see work.threaded
                    inst.flags |= FLAG_UNSURE
                inst.seq += 1
                if members is None:
                    inst.world_seq += 1
            inst.post("call", name, peer, nbytes, members)
            local.depth = 1
            start = time.perf_counter()
            try:
                result = fn(*args, **kwargs)
            finally:
                local.depth = 0
                end = time.perf_counter()
                inst.post("running")
            if count >= 0 and blocking:
                inst.counts[count] += 1  # completed: counted after the board says "running"
                count = -1
            if name == "recv" and peer is None and isinstance(result, int):
                peer = result  # receive from any source: now we know who sent
            if inst.tracing:
                bound = dict(zip(params, args))
                bound.update(kwargs)
            if callargs.is_work(result) and callargs.called_from_torch():
                # torch's own code (DDP's Join support, for one) hands the request to C++,
                # which takes only the real Work: record the call, return the request as is.
                if inst.tracing:
                    inst._event(name, peer, tensor, nbytes, start, end, group, bound).async_op = True
                return result
            if inst.tracing:
                event = inst._event(name, peer, tensor, nbytes, start, end, group, bound)
                if callargs.is_work(result):
                    event.async_op = True
                    return TracedWork(result, [event], inst, (name, peer, nbytes), count)
            elif callargs.is_work(result) and inst._board is not None:
                return TracedWork(result, [], inst, (name, peer, nbytes), count)
            return result

        wrapper.__name__ = fn.__name__
        wrapper.__qualname__ = fn.__qualname__
        wrapper.__doc__ = fn.__doc__
        wrapper.__wrapped__ = fn
        wrapper.__module__ = fn.__module__
        return wrapper

    def _batch(self, fn: Callable, ops: list) -> Any:
        local = self._local
        self.flags |= FLAG_UNSURE  # its requests are not counted: leave deadlocks to the timeout
        labels = []
        for op in ops:
            kind = getattr(getattr(op, "op", None), "__name__", "isend")
            labels.append((kind, op.peer, callargs.nbytes(op.tensor), op.tensor))
        self.post("call", "batch_isend_irecv", labels[0][1] if labels else None, sum(n or 0 for _, _, n, _ in labels))
        local.depth = 1
        start = time.perf_counter()
        try:
            works = fn(ops)
        finally:
            local.depth = 0
            end = time.perf_counter()
            self.post("running")
        if not self.tracing:
            return works
        events = [
            self._event(kind, peer, tensor, nbytes, start, end, None, {}, batch=True)
            for kind, peer, nbytes, tensor in labels
        ]
        for event in events:
            event.async_op = True
        if isinstance(works, list):
            # One request may stand for the whole batch: each waits for all of its events.
            return [TracedWork(w, events, self, ("wait", None, 0)) for w in works]
        return works

    def _event(
        self, name: str, peer: Any, tensor: Any, nbytes: Any, start: float, end: float, group: Any, bound: dict, batch: bool = False
    ) -> TraceEvent:
        import torch

        event = TraceEvent(
            rank=self.rank, op=name, peer=peer, nbytes=nbytes, dtype=None, shape=None, start=start, end=end,
            tag=bound.get("tag", 0) or 0, group=callargs.members_list(group), batch=batch,
            seq=self.seq if name in COLLECTIVES else None,
        )
        if isinstance(tensor, torch.Tensor):
            event.dtype = str(tensor.dtype).replace("torch.", "")
            event.shape = tuple(tensor.shape)
            try:
                event.offset = tensor.storage_offset() * tensor.element_size()
                event.base_nbytes = tensor.untyped_storage().nbytes()
            except Exception:  # noqa: BLE001 - sparse or unusual tensors
                pass
        if "op" in bound and name in KNOWN and KNOWN[name].reduces:
            event.reduce_op = str(bound["op"]).rsplit(".", 1)[-1]
        self.events.append(event)
        return event

    def take_events(self) -> list[TraceEvent]:
        events, self.events = self.events, []
        return events


def _refuser(label: str, reason: str, name: str) -> Callable:
    """A stand-in for the call ``label`` that raises; ``name`` is the ``forbid`` entry that switched it off."""
    family = family_of(name)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ForbiddenCallError(label, reason, family, name)

    refuse.__name__ = label.rsplit(".", 1)[-1]
    return refuse
