"""The functional collectives, seen like the public calls: DTensor's, tensor parallelism's, FSDP2's fallbacks.

DTensor's redistribution (``full_tensor()``, ``redistribute``), ``parallelize_module``'s
layers, ``clip_grad_norm_`` on DTensor gradients and ``torch.compile``'d code communicate
through the functional collectives: the dispatcher ops ``torch.ops._c10d_functional.*``
(reached from ``torch.distributed._functional_collectives``' Python functions, from their
autograd formulas, or directly), which return at once and are waited for later, by
``wait_tensor``, at the result's first use. They never pass the public torch.distributed
functions. :func:`wrap_functional` wraps each op where every Python caller reaches it: the
callable an op object calls (its ``_op``; the op objects themselves stay the same objects,
with the same hash, so ``func is torch.ops._c10d_functional.all_reduce.default`` and
``CommDebugMode`` work as before). Each call goes on the board as the public call doing the
same work (:data:`~helpers._runtime.calls.FUNCTIONAL_OPS`) and, with tracing, into the trace:
``op`` that name, ``via`` ``"functional"``, ``note`` the op (``"_c10d_functional.all_reduce"``),
``async_op`` True and ``waited`` when ``wait_tensor`` returned. Calls made inside another
wrapped call, or while torch traces a graph (fake tensors, ``torch.compile``), pass straight through.

Not seen: what C++ calls without Python in between, such as the backward of the
``*_autograd`` functional collectives before torch 2.13 (2.13's autograd formulas are Python, and seen).

:func:`refuse_functional` switches ops off for ``forbid``, with the Python functions that
reach them (:data:`~helpers._runtime.calls.FUNCTIONAL_ENTRY_POINTS`), so that the error names
what the program called.

Example (inside a rank, tracing)::

    >>> import torch.distributed._functional_collectives as funcol
    >>> funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD).wait()
    >>> [(e.op, e.nbytes, e.via, e.waited is not None) for e in current().take_events()]
    [('all_reduce', 16, 'functional', True)]
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable

from . import callargs
from .apis import refuser
from .board import FLAG_UNSURE
from .calls import FUNCTIONAL_ENTRY_POINTS, FUNCTIONAL_OPS, KNOWN
from .work import threaded
from .wrapper import enter_below, record, timed

__all__ = ["OpCall", "FunctionalSite", "wrap_functional", "refuse_functional"]

_NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd")
_AWAITING_AT_MOST = 512  # results not waited for yet that a rank remembers (oldest forgotten first)


class OpCall:
    """Stands in for the C++ callable of an op object (``packet._op``): same hash, same attributes, another call."""

    __slots__ = ("original", "call")

    def __init__(self, original: Callable, call: Callable) -> None:
        self.original = original
        self.call = call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.call(*args, **kwargs)

    def __hash__(self) -> int:
        return hash(self.original)  # an op object's hash is its _op's: sets and dicts of ops still find it

    def __eq__(self, other: Any) -> bool:
        return other is self or other is self.original

    def __getattr__(self, name: str) -> Any:
        if name in OpCall.__slots__:
            raise AttributeError(name)
        return getattr(self.original, name)

    def __repr__(self) -> str:
        return f"<helpers' {self.original!r}>"


class FunctionalSite:
    """What a wrapper knows of one functional op, from its schema: where its tensors, group, peer, reduce op and tag are."""

    via = "functional"

    def __init__(self, namespace: str, opname: str, params: list[str]) -> None:
        self.name = FUNCTIONAL_OPS[opname]
        self.note = f"{namespace}.{opname}"
        self.params = params
        self.is_p2p = KNOWN[self.name].family == "point_to_point"
        self.batch = opname == "batch_p2p_ops"

    def arg(self, args: tuple, kwargs: dict, *names: str) -> Any:
        for name in names:
            if name in kwargs:
                return kwargs[name]
            if name in self.params and self.params.index(name) < len(args):
                return args[self.params.index(name)]
        return None

    def read(self, args: tuple, kwargs: dict) -> tuple[Any, Any, Any, int | None]:
        """``(peer as a global rank, group, a tensor for dtype and shape, bytes)`` of one call."""
        value = args[0] if args else kwargs.get(self.params[0]) if self.params else None
        if self.batch:
            value = self.arg(args, kwargs, "tensors")
        tensors = value if isinstance(value, (list, tuple)) else [value]
        group = _group(self.arg(args, kwargs, "group_name", "group"))
        peer = self.arg(args, kwargs, "src", "dst")
        if peer is not None and not self.is_p2p:
            peer = callargs.global_rank(group, int(peer))  # a broadcast's root, in the group's numbering
        return peer, group, tensors[0] if tensors else None, callargs.nbytes(list(tensors))

    def bind(self, args: tuple, kwargs: dict) -> dict:
        op = self.arg(args, kwargs, "reduce_op", "reduceOp")
        tag = self.arg(args, kwargs, "tag")
        return {"op": str(op).upper(), "tag": tag if isinstance(tag, int) else 0} if op else {"tag": 0}


def _group(value: Any) -> Any:
    """The process group a functional op names (by its name, as the ops pass it)."""
    if isinstance(value, str):
        import torch.distributed.distributed_c10d as c10d

        resolve = getattr(c10d, "_resolve_process_group", None)
        try:
            return resolve(value) if resolve is not None else None
        except Exception:  # noqa: BLE001 - a name this rank does not know
            return None
    return value


def _tracing() -> bool:
    """Whether torch is tracing a graph (torch.compile, fake tensors) rather than running the op."""
    fc = sys.modules.get("torch.distributed._functional_collectives")
    check = getattr(fc, "_are_we_tracing", None)
    return bool(check is not None and check())


def _key(tensor: Any) -> int | None:
    try:
        return tensor.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 - not a plain tensor
        return None


def _ops() -> list[tuple[str, str, Any]]:
    """``(namespace, op name, op object)`` of every functional op this torch has, wait_tensor last."""
    import torch

    out = []
    for namespace in _NAMESPACES:
        space = getattr(torch.ops, namespace)
        for opname in (*FUNCTIONAL_OPS, "wait_tensor"):
            if namespace != _NAMESPACES[0] and opname == "wait_tensor":
                continue
            try:
                out.append((namespace, opname, getattr(space, opname)))
            except (AttributeError, RuntimeError):  # this torch has no such op
                continue
    return out


def _targets(packet: Any) -> list[Any]:
    """The op object and its overloads (``.default``): each calls its own ``_op``."""
    targets = [packet]
    for overload in getattr(packet, "overloads", lambda: [])():
        try:
            targets.append(getattr(packet, overload))
        except AttributeError:
            continue
    return [t for t in targets if callable(vars(t).get("_op"))]


def wrap_functional(inst: Any) -> None:
    """Wrap every functional op of this torch for the rank's Instrument ``inst``."""
    import torch

    for namespace, opname, packet in _ops():
        try:
            schema = torch._C._get_schema(packet._qualified_op_name, "")
            params = [a.name for a in schema.arguments]
        except Exception:  # noqa: BLE001 - an op whose schema cannot be read: leave it alone
            continue
        for target in _targets(packet):
            original = vars(target)["_op"]
            if opname == "wait_tensor":
                call = _wait_call(inst, original)
            else:
                call = _op_call(inst, FunctionalSite(namespace, opname, params), original)
            inst._set(target, "_op", OpCall(original, call), layer="functional")


def _op_call(inst: Any, site: FunctionalSite, original: Callable) -> Callable:
    local, name = inst._local, site.name

    def call(*args: Any, **kwargs: Any) -> Any:
        if local.depth or _tracing():
            return original(*args, **kwargs)
        peer, group, tensor, nbytes = site.read(args, kwargs)
        enter_below(inst, name, site.is_p2p, peer, tensor, group, nbytes)
        result, start, end = timed(inst, original, args, kwargs)
        events = _record(inst, site, args, kwargs, (peer, group, tensor, nbytes), start, end) if inst.tracing else []
        awaiting = inst.awaiting
        for out in result if isinstance(result, (list, tuple)) else [result]:
            key = _key(out)
            if key is not None:
                awaiting[key] = ((name, peer, nbytes), events)
        while len(awaiting) > _AWAITING_AT_MOST:
            awaiting.pop(next(iter(awaiting)))
        return result

    return call


def _record(inst: Any, site: FunctionalSite, args: tuple, kwargs: dict, read: tuple, start: float,
            end: float) -> list:
    peer, group, tensor, nbytes = read
    if site.batch:  # batch_p2p_ops(op_list, peer_list, tag_list, tensors, group_name): an event per operation
        kinds, peers, tags, tensors = (site.arg(args, kwargs, n) or [] for n in
                                       ("op_list", "peer_list", "tag_list", "tensors"))
        events = [record(inst, kind, p, t, callargs.nbytes(t), start, end, group, {"tag": tag}, batch=True,
                         via=site.via, note=site.note) for kind, p, tag, t in zip(kinds, peers, tags, tensors)]
    else:
        events = [record(inst, site.name, peer, tensor, nbytes, start, end, group, site.bind(args, kwargs),
                         via=site.via, note=site.note)]
    for event in events:
        event.async_op = True
    return events


def _wait_call(inst: Any, original: Callable) -> Callable:
    """``wait_tensor``: the board says the rank waits in the collective whose result it is; its events get ``waited``."""
    local, perf_counter = inst._local, time.perf_counter

    def wait(*args: Any, **kwargs: Any) -> Any:
        if local.depth or _tracing():
            return original(*args, **kwargs)
        tensor = args[0] if args else next(iter(kwargs.values()), None)
        (op, peer, nbytes), events = inst.awaiting.pop(_key(tensor), (("wait", None, 0), []))
        if threaded(inst):
            inst.flags |= FLAG_UNSURE
        inst.post("wait", op, peer, nbytes, None)
        local.depth = 1
        began = perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            local.depth = 0
            ended = perf_counter()
            inst.running()
            for event in events:
                if event.wait_start is None:
                    event.wait_start = began
                event.waited = ended

    return wait


def refuse_functional(inst: Any, opnames: tuple[str, ...], reason: str, name: str) -> None:
    """Switch off these functional ops (``forbid`` entry ``name``), however they are reached, and
    the Python functions of ``torch.distributed._functional_collectives`` that make them."""
    for namespace, opname, packet in _ops():
        if opname not in opnames:
            continue
        for target in _targets(packet):
            original = inst._originals.get((target, "_op"), vars(target)["_op"])
            stand_in = refuser(f"torch.ops.{namespace}.{opname}", reason, name)
            inst._set(target, "_op", OpCall(original, stand_in), refusing=True)
    try:
        import torch.distributed._functional_collectives as fc
    except ImportError:
        return
    for fname, opname in FUNCTIONAL_ENTRY_POINTS.items():
        if opname in opnames and callable(getattr(fc, fname, None)):
            inst._set(fc, fname, refuser(f"torch.distributed._functional_collectives.{fname}", reason, name),
                      refusing=True)
