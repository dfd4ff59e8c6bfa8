"""A ProcessGroup's own methods, called directly, seen like the public calls.

``dist.all_reduce(t)`` ends in ``group.allreduce([t], opts)``, a method of the C++
``ProcessGroup`` class; a program can call that method itself
(``dist.group.WORLD.allreduce([t]).wait()``, ``pg._allgather_base(out, t)``), and so can
torch's own Python code. :func:`wrap_process_group` wraps every such method the installed
torch has (:data:`~helpers._runtime.calls.PROCESS_GROUP_METHODS`) on the class, so that a
direct call goes on the board and into the trace like the public call doing the same work:
its event's ``op`` is that call's name, ``via`` is ``"process_group"`` and ``note`` names the
method (``"ProcessGroup.allreduce"``). A call made inside a wrapped call (the public
function's own) passes straight through: one call, one event (:class:`~helpers._runtime.wrapper.Depth`).
Inside ``_coalescing_manager`` the method that sends what the public calls queued is part of
them, and passes through too.

``send`` and ``recv`` return requests, so they are recorded as ``isend`` and ``irecv``; the
rank's message counts cannot describe them, so the rank is marked unsure (deadlocks are left
to the timeout, see :mod:`helpers._runtime.deadlock`).

Example (inside a rank, tracing)::

    >>> dist.group.WORLD.allreduce([torch.ones(4)]).wait()
    >>> [(e.op, e.nbytes, e.via, e.note) for e in current().take_events()]
    [('all_reduce', 16, 'process_group', 'ProcessGroup.allreduce')]
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from . import callargs
from .calls import KNOWN, PROCESS_GROUP_METHODS
from .wrapper import enter_below, hand_back, timed

__all__ = ["MethodSite", "wrap_process_group", "wrap_method"]

_INPUT_NAMES = ("input_tensors", "input_tensor", "inputs", "input", "tensors", "tensor")


class MethodSite:
    """What a wrapper knows of one ProcessGroup method: the public call it stands for, where its tensors are."""

    __slots__ = ("name", "method", "note", "input_at", "is_p2p", "reduces")
    via = "process_group"

    def __init__(self, method: str, cls_name: str = "ProcessGroup") -> None:
        self.name, self.input_at = PROCESS_GROUP_METHODS[method]
        self.method = method
        self.note = f"{cls_name}.{method}"
        self.is_p2p = KNOWN[self.name].family == "point_to_point"
        self.reduces = KNOWN[self.name].reduces

    def read(self, pg: Any, args: tuple, kwargs: dict) -> tuple[Any, Any, int | None]:
        """``(peer as a global rank, a tensor for dtype and shape, bytes)`` of one call."""
        value = None
        if self.input_at is not None:
            if self.input_at < len(args):
                value = args[self.input_at]
            else:
                value = next((kwargs[k] for k in _INPUT_NAMES if k in kwargs), None)
        tensors = _flat(value)
        nbytes = callargs.nbytes(tensors) if tensors else None
        peer = self._peer(pg, args, kwargs)
        return peer, tensors[0] if tensors else None, nbytes

    def _peer(self, pg: Any, args: tuple, kwargs: dict) -> int | None:
        if self.is_p2p:
            if self.method == "recv_anysource":
                return None
            peer = args[1] if len(args) > 1 else kwargs.get("dstRank", kwargs.get("srcRank"))
        elif self.method in ("broadcast", "reduce", "gather", "scatter"):
            opts = _options(args, kwargs)
            peer = getattr(opts, "rootRank", None) if opts is not None else (
                args[1] if len(args) > 1 and isinstance(args[1], int) else kwargs.get("root"))
        else:
            return None
        return None if peer is None else callargs.global_rank(pg, int(peer))

    def bind(self, args: tuple, kwargs: dict) -> dict:
        """The event's tag and reduce op, however the overload in use passed them."""
        bound: dict = {}
        if self.is_p2p:  # send(tensors, dstRank, tag), recv(tensors, srcRank, tag), recv_anysource(tensors, tag)
            at = 1 if self.method == "recv_anysource" else 2
            bound["tag"] = args[at] if len(args) > at else kwargs.get("tag", 0)
        if self.reduces:
            opts = _options(args, kwargs)
            op = getattr(opts, "reduceOp", None) if opts is not None else next(
                (a for a in list(args[1:]) + list(kwargs.values()) if "ReduceOp" in type(a).__qualname__
                 or "RedOpType" in type(a).__qualname__), None)
            if op is not None:
                bound["op"] = getattr(op, "op", op)  # a ReduceOp object holds its RedOpType
        return bound


def _flat(value: Any) -> list:
    """The tensors of a method's argument: one tensor, a list of them, or a list of lists."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        out = []
        for item in value:
            out += _flat(item) if isinstance(item, (list, tuple)) else [item] if isinstance(item, torch.Tensor) else []
        return out
    return []


def _options(args: tuple, kwargs: dict) -> Any:
    """The ``...Options`` object of a call (``AllreduceOptions``, ``BroadcastOptions``), if it passed one."""
    for value in list(args) + list(kwargs.values()):
        if type(value).__name__.endswith("Options"):
            return value
    return None


def wrap_process_group(inst: Any) -> None:
    """Wrap, on the ``ProcessGroup`` class, each method of :data:`PROCESS_GROUP_METHODS` it has (``inst``: the rank's Instrument)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    cls = dist.ProcessGroup
    manager = getattr(getattr(c10d, "_coalescing_manager", None), "__wrapped__", None)
    coalescing = getattr(manager, "__code__", None)
    for method in PROCESS_GROUP_METHODS:
        if method in vars(cls):
            inst._set(cls, method, wrap_method(inst, cls, method, coalescing), layer="process_group")


def wrap_method(inst: Any, cls: type, method: str, coalescing: Any = None) -> Callable:
    """The wrapper of ``cls.method`` (a pybind11 method: called with the group first).

    ``coalescing``: the code of ``_coalescing_manager``, whose calls are part of the public calls queued in it.
    """
    original = getattr(cls, method)  # the function itself, which takes the group as its first argument
    site = MethodSite(method, cls.__name__)
    name, is_p2p = site.name, site.is_p2p
    local, is_work = inst._local, callargs.is_work

    def wrapper(pg: Any, *args: Any, **kwargs: Any) -> Any:
        if local.depth or (coalescing is not None and sys._getframe(1).f_code is coalescing):
            return original(pg, *args, **kwargs)
        peer, tensor, nbytes = site.read(pg, args, kwargs)
        enter_below(inst, name, is_p2p, peer, tensor, pg, nbytes)
        result, start, end = timed(inst, original, (pg, *args), kwargs)
        if inst.tracing or is_work(result):
            return hand_back(inst, site, result, args, kwargs, (peer, pg, tensor, nbytes), -1, start, end)
        return result

    wrapper.__name__ = wrapper.__qualname__ = method
    wrapper.__doc__ = getattr(original, "__doc__", None)
    wrapper.__wrapped__ = original
    return wrapper
