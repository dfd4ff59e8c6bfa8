"""DistributedDataParallel's communication, made visible on the board and in traces.

DDP all-reduces its gradient buckets from C++, below the Python functions the rank's
wrappers replace (:mod:`helpers._runtime.instrument`); :func:`watch_ddp` routes them through
the wrapped ``dist.all_reduce`` with a communication hook that does what DDP does by default.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any, Callable

from .callargs import members
from .calls import DDP_CONSTRUCTOR

__all__ = ["watch_ddp"]


def watch_ddp(inst: Any) -> None:
    """Make DistributedDataParallel's communication show on ``inst``'s board and trace (``inst``: the rank's Instrument).

    DDP's reducer all-reduces its gradient buckets from C++, where the wrappers above
    cannot see it (:meth:`Instrument.install` calls this). Unless the program registers a communication hook of its own, the
    first forward pass registers one that does what DDP does by default (divide the
    bucket by the group's size, all-reduce it asynchronously) through the wrapped
    ``dist.all_reduce``: each bucket becomes a traced all-reduce noted "DDP bucket i",
    and while buckets are in flight the board says the rank waits in an all_reduce,
    which is where a rank stuck at the end of backward is. A program's own Python hook
    (fp16 compression, for example) calls the wrapped functions itself. A model that a
    ``Join(..., divide_by_initial_world_size=False)`` holds at its first forward pass gets no
    hook: a hook divides by the group's size, and DDP's own reduction is what honours that
    option (its buckets then do not show in the trace). The
    constructor, which broadcasts rank 0's weights from C++, is noted on the board as
    :data:`~helpers._runtime.calls.DDP_CONSTRUCTOR` while it runs.
    """
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:  # a torch built without distributed support
        return
    init, forward = DistributedDataParallel.__init__, DistributedDataParallel.forward
    register = DistributedDataParallel.register_comm_hook
    builtin = getattr(DistributedDataParallel, "_register_builtin_comm_hook", None)
    in_flight = [0]
    lock = threading.Lock()

    def bucket_hook(process_group, bucket):  # no annotations: DDP checks them against its own types
        import torch.distributed as dist

        group = process_group if process_group is not None else dist.group.WORLD
        tensor = bucket.buffer()
        tensor.div_(group.size())  # DDP's default: the mean, dividing before the sum
        mark = len(inst.events)
        work = dist.all_reduce(tensor, group=process_group, async_op=True)
        events = inst.events[mark:] if inst.tracing else []
        for event in events:
            event.note = f"DDP bucket {bucket.index()}"
        with lock:
            in_flight[0] += 1
            inst.post("wait", "all_reduce", None, tensor.numel() * tensor.element_size())

        def done(fut: Any) -> Any:
            ended = time.perf_counter()
            for event in events:
                event.waited = ended
            with lock:
                in_flight[0] -= 1
                if in_flight[0] == 0:
                    inst.post("running")
            return fut.value()[0]

        return work.get_future().then(done)

    def traced_init(ddp: Any, *args: Any, **kwargs: Any) -> None:
        inst.seq += 1
        group = kwargs.get("process_group", args[5] if len(args) > 5 else None)
        if members(group) is None:  # the constructor broadcasts over the default group
            inst.world_seq += 1
        inst.post("call", DDP_CONSTRUCTOR)
        try:
            init(ddp, *args, **kwargs)
        finally:
            inst.post("running")

    def traced_forward(ddp: Any, *args: Any, **kwargs: Any) -> Any:
        if not getattr(ddp, "_helpers_hook_set", False):
            ddp._helpers_hook_set = True
            # A Join(divide_by_initial_world_size=False) asks DDP's own reduction to divide by the
            # ranks not yet joined; any communication hook would divide by the group's size instead.
            if getattr(ddp, "_divide_by_initial_world_size", True) is not False:
                register(ddp, ddp.process_group, bucket_hook)
        return forward(ddp, *args, **kwargs)

    def own_hook(ddp: Any, state: Any, hook: Callable) -> Any:
        ddp._helpers_hook_set = True

        def noted(state, bucket):  # no annotations: DDP checks them against its own types
            mark = len(inst.events)
            future = hook(state, bucket)
            for event in inst.events[mark:] if inst.tracing else ():
                event.note = f"DDP bucket {bucket.index()}"
            return future

        functools.update_wrapper(noted, hook)
        del noted.__wrapped__  # DDP reads the signature: it must be noted's own
        return register(ddp, state, noted)

    def own_builtin(ddp: Any, *args: Any, **kwargs: Any) -> Any:
        ddp._helpers_hook_set = True
        return builtin(ddp, *args, **kwargs)

    for name, value in (("__init__", traced_init), ("forward", traced_forward), ("register_comm_hook", own_hook)):
        functools.update_wrapper(value, getattr(DistributedDataParallel, name))
        inst._set(DistributedDataParallel, name, value)
    if builtin is not None:
        inst._set(DistributedDataParallel, "_register_builtin_comm_hook", functools.update_wrapper(own_builtin, builtin))
