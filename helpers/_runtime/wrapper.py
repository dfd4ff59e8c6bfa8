"""What a rank's wrapper around one torch.distributed function does on every call.

:class:`~helpers._runtime.instrument.Instrument` installs the wrappers (and puts torch's
functions back); :func:`wrap` makes each one. What a wrapper needs to know of its function
is worked out once, when it is made (:class:`CallSite`: where the peer, the group and the
tensor are passed). A call then goes through these steps:

1. **Switched off?** A call the exercise forbids raises
   :class:`~helpers.ForbiddenCallError` (:meth:`CallSite.refusal`).
2. **Nested?** A call made while another wrapped call runs (``all_gather_object`` calls
   ``all_gather``; ``all_reduce`` calls ``ProcessGroup.allreduce``, which
   :mod:`helpers._runtime.pgcalls` wraps) is part of that call: it goes straight to torch,
   neither noted nor traced (:class:`Depth`, which every layer of wrappers reads).
3. **On the board, before.** :meth:`CallSite.read` reads the peer, group, tensor and bytes;
   :func:`enter_p2p` counts a point-to-point message as posted, :func:`enter_collective`
   numbers a collective; then the board says "call" (:mod:`helpers._runtime.board`).
4. **The call**, timed; the board says "running" again, and a blocking ``send`` or ``recv``
   is counted done.
5. **What goes back** (:func:`hand_back`, only when tracing or for a request): with tracing
   an event (:func:`record`); a request (``isend``, ``async_op=True``) wrapped in a
   :class:`~helpers._runtime.work.TracedWork`, so that waiting on it shows too.

``batch_isend_irecv`` has a wrapper of its own (:func:`wrap_batch`). This code runs on
every torch.distributed call a learner makes: the common path (board, no trace) makes as
few Python calls as it can (``bench/trace_bench.py`` measures it).

Example (a rank's instrument, here on a board of one rank, around a stand-in ``send``)::

    >>> import torch
    >>> from helpers._runtime.board import Board
    >>> from helpers._runtime.instrument import Instrument
    >>> board = Board.create(1); inst = Instrument(0, board, 1)
    >>> def send(tensor, dst=None, group=None, tag=0): return None
    >>> wrapped = wrap(inst, "send", send)
    >>> inst.tracing = True; wrapped(torch.ones(4), 0); [(e.op, e.nbytes) for e in inst.take_events()]
    [('send', 16)]
    >>> board.close()
"""

from __future__ import annotations

import inspect
import threading
import time
from typing import Any, Callable

from ..errors import ForbiddenCallError
from . import callargs
from .board import FLAG_UNSURE, RECVS_DONE, RECVS_POSTED, SENDS_DONE, SENDS_POSTED
from .calls import COLLECTIVES, KNOWN, POINT_TO_POINT, family_of
from .protocol import TraceEvent
from .work import TracedWork, threaded

__all__ = ["CallSite", "Depth", "wrap", "wrap_batch", "enter_p2p", "enter_collective", "enter_below", "timed",
           "hand_back", "record"]

_NOWHERE = 1 << 30  # the position of a parameter the function does not have: never in args


class Depth(threading.local):
    """How deep in wrapped calls this thread is: 0 outside any, 1 inside one.

    Every layer of wrappers (torch.distributed's functions, ProcessGroup methods, functional
    collectives) reads it first: a call made inside another wrapped call (``dist.all_reduce``
    ends in ``ProcessGroup.allreduce``) is part of that call, one event, not two. A class
    attribute, so that a new thread (autograd's, DDP's) reads 0 without a ``getattr`` default.
    """

    depth = 0


class CallSite:
    """What a wrapper knows of its function, worked out once: where each argument it reads is passed."""

    __slots__ = ("name", "params", "family", "is_p2p", "blocking", "group_at", "peer_param", "peer_at",
                 "group_peer_param", "group_peer_at", "tensor_param", "tensor_at")
    via = note = None  # a torch.distributed function: made the plain way (see TraceEvent.via)

    def __init__(self, name: str, fn: Callable) -> None:
        self.name = name
        self.params = list(inspect.signature(fn).parameters)
        self.family = family_of(name)
        self.is_p2p = name in POINT_TO_POINT
        self.blocking = name in ("send", "recv")  # returns when the message is done (isend/irecv: at wait())
        position = {p: i for i, p in enumerate(self.params)}
        self.group_at = position.get("group", _NOWHERE)
        self.peer_param = next((p for p in callargs.PEER_PARAMS if p in position), None)
        self.peer_at = position.get(self.peer_param, _NOWHERE)
        self.group_peer_param = next((p for p in callargs.GROUP_PEER_PARAMS if p in position), None)
        self.group_peer_at = position.get(self.group_peer_param, _NOWHERE)
        self.tensor_param = KNOWN[name].tensor or (self.params[0] if self.params else None)
        self.tensor_at = position.get(self.tensor_param, _NOWHERE)

    def read(self, args: tuple, kwargs: dict) -> tuple[Any, Any, Any, int | None]:
        """What a call passed: ``(peer, group, tensor, bytes of the tensor)``; the peer as a global rank.

        Each argument is read where it was given, by position or by name (a parameter the
        function lacks is looked up under the name None: never given). No dict of every
        argument is made: this runs on every call.
        """
        n = len(args)
        group = args[self.group_at] if self.group_at < n else kwargs.get("group")
        peer = args[self.peer_at] if self.peer_at < n else kwargs.get(self.peer_param)
        if peer is None and self.group_peer_param is not None:
            group_peer = args[self.group_peer_at] if self.group_peer_at < n else kwargs.get(self.group_peer_param)
            if group_peer is not None:
                peer = callargs.global_rank(group, group_peer)
        tensor = args[self.tensor_at] if self.tensor_at < n else kwargs.get(self.tensor_param)
        return peer, group, tensor, callargs.nbytes(tensor)

    def bind(self, args: tuple, kwargs: dict) -> dict:
        """Every argument by its parameter's name (for the event's tag and reduce op)."""
        bound = dict(zip(self.params, args))
        bound.update(kwargs)
        return bound

    def refusal(self, reason: str) -> ForbiddenCallError:
        """The error a call of this function raises while an exercise switches it off."""
        return ForbiddenCallError(f"torch.distributed.{self.name}", reason, self.family, self.name)


def wrap(inst: Any, name: str, fn: Callable) -> Callable:
    """``fn``, the torch.distributed function ``name``, wrapped for the rank's :class:`Instrument` ``inst``."""
    if name == "batch_isend_irecv":
        return _like(wrap_batch(inst, fn), fn)
    site = CallSite(name, fn)
    read, enter, blocking = site.read, enter_p2p if site.is_p2p else enter_collective, site.blocking
    local, perf_counter, is_work = inst._local, time.perf_counter, callargs.is_work

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if name in inst.forbidden:  # 1. switched off
            raise site.refusal(inst.forbidden[name])
        if local.depth:  # 2. made by another wrapped call: part of that one
            return fn(*args, **kwargs)
        peer, group, tensor, nbytes = read(args, kwargs)  # 3. on the board, before
        count = enter(inst, name, peer, tensor, group, nbytes)
        local.depth = 1  # 4. the call
        start = perf_counter()
        try:
            result = fn(*args, **kwargs)
        finally:
            local.depth = 0
            end = perf_counter()
            inst.running()
        if count >= 0 and blocking:
            inst.counts[count] += 1  # a blocking send or recv is done: counted after the board says "running"
            count = -1
        if inst.tracing or is_work(result):  # 5. what goes back
            return hand_back(inst, site, result, args, kwargs, (peer, group, tensor, nbytes), count, start, end)
        return result

    return _like(wrapper, fn)


def enter_p2p(inst: Any, name: str, peer: Any, tensor: Any, group: Any, nbytes: int | None) -> int:
    """A point-to-point call about to go into torch, on the board: its message counted as
    posted, then "call". Returns where its completion is counted (-1: not counted).

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
    count = _posted(inst, name, peer, tensor, group)
    inst.post("call", name, peer, nbytes, None)
    return count


def _posted(inst: Any, name: str, peer: Any, tensor: Any, group: Any) -> int:
    counts = inst.counts
    if counts is None or (group is not None and group == inst.non_member):
        return -1
    sending = name in ("send", "isend")
    if name in ("send_object_list", "recv_object_list") or (peer is None and not sending) \
            or not getattr(tensor, "is_cpu", True) or threaded(inst):
        inst.flags |= FLAG_UNSURE
        return -1
    try:
        peer = int(peer)
    except (TypeError, ValueError):
        return -1
    if not 0 <= peer < inst.world_size:
        return -1  # torch refuses it: no message
    at = peer * 4
    counts[at + (SENDS_POSTED if sending else RECVS_POSTED)] += 1
    return at + (SENDS_DONE if sending else RECVS_DONE)


def enter_collective(inst: Any, name: str, peer: Any, tensor: Any, group: Any, nbytes: int | None) -> int:
    """A collective about to go into torch, on the board: numbered (``seq`` on any group,
    ``world_seq`` on the default one, which every rank calls in one order), then "call".
    Returns -1: a collective has no message counts."""
    members = callargs.members(group)
    if threading.get_ident() != inst.main_thread:  # see work.threaded
        inst.flags |= FLAG_UNSURE
    inst.seq += 1
    if members is None:
        inst.world_seq += 1
    inst.post("call", name, peer, nbytes, members)
    return -1


def enter_below(inst: Any, name: str, is_p2p: bool, peer: Any, tensor: Any, group: Any, nbytes: int | None) -> None:
    """A call made below the public functions (a ProcessGroup method, a functional collective), on the board:
    a collective numbered as :func:`enter_collective` numbers it; a point-to-point one marks the rank unsure
    (its message counts do not describe it: deadlocks are left to the timeout), then "call"."""
    if is_p2p:
        inst.flags |= FLAG_UNSURE
        inst.post("call", name, peer, nbytes, None)
    else:
        enter_collective(inst, name, peer, tensor, group, nbytes)


def timed(inst: Any, fn: Callable, args: tuple, kwargs: dict) -> tuple[Any, float, float]:
    """``fn(*args, **kwargs)`` as a wrapped call runs it: what it calls is part of it (:class:`Depth`), and
    the board says "running" once it returns. Returns ``(result, start, end)``."""
    local = inst._local
    local.depth = 1
    start = time.perf_counter()
    try:
        result = fn(*args, **kwargs)
    finally:
        local.depth = 0
        end = time.perf_counter()
        inst.running()
    return result, start, end


def hand_back(inst: Any, site: CallSite, result: Any, args: tuple, kwargs: dict, read: tuple,
              count: int, start: float, end: float) -> Any:
    """What a wrapper returns when tracing, or when torch returned a request: the call's
    event recorded, and a request wrapped so that its wait is noted (``count``: where its
    completion is counted, see :func:`enter_p2p`). ``read`` is what :meth:`CallSite.read` read."""
    name = site.name
    peer, group, tensor, nbytes = read
    if name == "recv" and peer is None and isinstance(result, int):
        peer = result  # a receive from any source: now we know who sent
    bound = site.bind(args, kwargs) if inst.tracing else {}  # for the event's tag and reduce op
    work = callargs.is_work(result)
    if work and callargs.called_from_torch(3):  # three frames up: past this function and the wrapper
        # torch's own code (DDP's Join support, for one) hands the request to C++,
        # which takes only the real Work: record the call, return the request as is.
        if inst.tracing:
            record(inst, name, peer, tensor, nbytes, start, end, group, bound, via=site.via,
                   note=site.note).async_op = True
        return result
    if inst.tracing:
        event = record(inst, name, peer, tensor, nbytes, start, end, group, bound, via=site.via, note=site.note)
        if work:
            event.async_op = True
            return TracedWork(result, [event], inst, (name, peer, nbytes), count)
    elif work and inst._board is not None:
        return TracedWork(result, [], inst, (name, peer, nbytes), count)
    return result


def wrap_batch(inst: Any, fn: Callable) -> Callable:
    """The wrapper of ``batch_isend_irecv``: one board entry for the batch, an event per operation."""
    site = CallSite("batch_isend_irecv", fn)
    local = inst._local

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if site.name in inst.forbidden:
            raise site.refusal(inst.forbidden[site.name])
        if local.depth:
            return fn(*args, **kwargs)
        ops = args[0] if args else kwargs.get("p2p_op_list")
        return _batch(inst, fn, ops or [])

    return wrapper


def _batch(inst: Any, fn: Callable, ops: list) -> Any:
    local = inst._local
    inst.flags |= FLAG_UNSURE  # its requests are not counted: leave deadlocks to the timeout
    labels = []
    for op in ops:
        kind = getattr(getattr(op, "op", None), "__name__", "isend")
        labels.append((kind, op.peer, callargs.nbytes(op.tensor), op.tensor))
    inst.post("call", "batch_isend_irecv", labels[0][1] if labels else None, sum(n or 0 for _, _, n, _ in labels))
    local.depth = 1
    start = time.perf_counter()
    try:
        works = fn(ops)
    finally:
        local.depth = 0
        end = time.perf_counter()
        inst.running()
    if not inst.tracing:
        return works
    events = [record(inst, kind, peer, tensor, nbytes, start, end, None, {}, batch=True)
              for kind, peer, nbytes, tensor in labels]
    for event in events:
        event.async_op = True
    if isinstance(works, list):
        # One request may stand for the whole batch: each waits for all of its events.
        return [TracedWork(w, events, inst, ("wait", None, 0)) for w in works]
    return works


def record(inst: Any, name: str, peer: Any, tensor: Any, nbytes: Any, start: float, end: float, group: Any,
           bound: dict, batch: bool = False, via: str | None = None, note: str | None = None) -> TraceEvent:
    """Add the trace event of one call (or one operation of a batch) to ``inst.events``; returns it.

    ``via`` and ``note`` say how a call that was not a torch.distributed function was made
    (:attr:`~helpers._runtime.protocol.TraceEvent.via`)."""
    import torch

    event = TraceEvent(
        rank=inst.rank, op=name, peer=peer, nbytes=nbytes, dtype=None, shape=None, start=start, end=end,
        tag=bound.get("tag", 0) or 0, group=callargs.members_list(group), batch=batch,
        seq=inst.seq if name in COLLECTIVES else None, note=note, via=via,
    )
    if isinstance(tensor, torch.Tensor):
        event.dtype = str(tensor.dtype).replace("torch.", "")
        event.shape = tuple(tensor.shape)
        try:
            event.offset = tensor.storage_offset() * tensor.element_size()
            event.base_nbytes = tensor.untyped_storage().nbytes()
        except Exception:  # noqa: BLE001 - sparse or unusual tensors
            pass
        if inst.payloads is not None:  # a check wants to see what the call carried
            inst.payloads.append((event, tensor.detach().clone()))
    if "op" in bound and name in KNOWN and KNOWN[name].reduces:
        event.reduce_op = str(bound["op"]).rsplit(".", 1)[-1]
    inst.events.append(event)
    return event


def _like(wrapper: Callable, fn: Callable) -> Callable:
    """``wrapper`` named and documented as ``fn``, which it wraps (``__wrapped__``)."""
    wrapper.__name__ = fn.__name__
    wrapper.__qualname__ = fn.__qualname__
    wrapper.__doc__ = fn.__doc__
    wrapper.__wrapped__ = fn
    wrapper.__module__ = fn.__module__
    return wrapper
