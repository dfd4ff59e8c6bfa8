"""The course's cost model of a collective: latency per step plus the bytes a rank sends over the bandwidth.

A ring collective over p ranks takes ``steps`` sequential messages (an all-reduce 2(p - 1), an
all-gather, reduce-scatter or all-to-all p - 1, a send 1), and each rank sends ``nbytes`` in all
(:func:`helpers.memrec.ring_bytes`). On a link of latency alpha and bandwidth B:

    seconds = steps x alpha + nbytes / B

:func:`seconds` is that formula. For a real cluster alpha and B come from published figures
(:func:`helpers.plan.h100_cluster`); on this machine they are fitted to measurements of gloo on CPU
ranks: :func:`measure` times each collective at several sizes, :func:`fit` finds one
:class:`~helpers.plan.Link` per collective (least squares on the relative error, so that small and
large messages count alike), and :meth:`Fit.errors` says how far the fit is from times it was not
fitted on.

Example::

    >>> from helpers.plan import Link
    >>> nvlink = Link("NVLink", 3e-6, 450e9)
    >>> round(seconds("all_reduce", 8, 2 * 7 / 8 * 2**30, nvlink) * 1e3, 2)      # 1 GiB over 8 GPUs
    4.22
    >>> fit = Fit({"all_reduce": Link("gloo all_reduce", 1e-4, 1e9)}, 4)
    >>> round(fit.predict("all_reduce", 1 << 20) * 1e3, 3)                       # 1 MiB tensor on 4 ranks
    2.173
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Sequence

from .memrec import collective, ring_bytes
from .plan import Link

__all__ = ["steps", "seconds", "measure", "fit", "Fit", "OPS", "flop_rate", "pin_to_core"]

OPS = ("all_reduce", "all_gather", "reduce_scatter")


def steps(op: str, p: int) -> int:
    """Sequential messages of one ring collective over ``p`` ranks (1 for a send)."""
    kind = collective(op) or op
    if kind == "send":
        return 1
    if p <= 1:
        return 0
    return 2 * (p - 1) if kind == "all_reduce" else p - 1


def seconds(op: str, p: int, nbytes: float, link: Link) -> float:
    """The model's time of one collective over ``p`` ranks that sends ``nbytes`` per rank on ``link``."""
    if nbytes <= 0:
        return 0.0
    return steps(op, p) * link.latency + nbytes / link.bandwidth


def pin_to_core(rank: int) -> int | None:
    """Bind this process to one of the cores it may run on, chosen by ``rank`` (round robin); the core, or None where
    the system cannot bind a process (macOS, Windows) or allows it only one core anyway."""
    import os

    if not hasattr(os, "sched_setaffinity"):
        return None
    try:
        allowed = sorted(os.sched_getaffinity(0))
        if len(allowed) < 2:
            return None
        core = allowed[rank % len(allowed)]
        os.sched_setaffinity(0, {core})
    except OSError:  # a container's cpuset changed under us, or binding is refused: time unbound
        return None
    return core


def _time_rank(rank: int, world_size: int, ops: list[str], sizes: list[int], repeats: int, best: bool,
               pin: bool = False) -> dict:
    """On a rank: the slowest rank's fastest (or median) seconds of each collective at each size (bytes of the whole
    tensor). The (collective, size) pairs are visited ``repeats`` times, each time in a new order (the same on every
    rank), so that a burst of other work on the machine spoils a few tries of many pairs, not every try of one.
    ``pin`` binds the rank to a core of its own first (:func:`pin_to_core`)."""
    import random
    import time

    import torch
    import torch.distributed as dist

    if pin:
        pin_to_core(rank)

    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    tensors = {n: (torch.ones(n // 4), torch.ones(n // 4 // world_size)) for n in sizes}
    calls = {"all_reduce": lambda whole, piece: dist.all_reduce(whole),
             "all_gather": lambda whole, piece: gather(whole, piece),
             "reduce_scatter": lambda whole, piece: scatter(piece, whole)}
    pairs = [(op, n) for op in ops for n in sizes]
    times: dict[tuple[str, int], list[float]] = {pair: [] for pair in pairs}
    for op, n in pairs:                                  # one untimed call each: connections and buffers warm
        calls[op](*tensors[n])
    order = random.Random(0)
    for _ in range(repeats):
        order.shuffle(pairs)
        for op, n in pairs:
            dist.barrier()
            start = time.perf_counter()
            calls[op](*tensors[n])
            took = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
            times[(op, n)].append(took.item())
    return {pair: min(t) if best else statistics.median(t) for pair, t in times.items()}


@dataclass
class Measured:
    """Median seconds of each collective (``op``, whole tensor's bytes) on ``world_size`` ranks."""

    world_size: int
    seconds: dict[tuple[str, int], float]

    def points(self, op: str, sizes: Sequence[int] | None = None) -> list[tuple[int, float]]:
        """(bytes a rank sends, seconds) for ``op`` at ``sizes`` (default: every size measured)."""
        names = {"all_gather": "all_gather_into_tensor"}
        out = []
        for (o, n), t in sorted(self.seconds.items()):
            if o == op and (sizes is None or n in sizes):
                local = n // self.world_size if op == "all_gather" else n
                out.append((ring_bytes(names.get(op, op), local, self.world_size), t))
        return out


def measure(sizes: Sequence[int], world_size: int = 2, ops: Sequence[str] = OPS, repeats: int = 15, best: bool = True,
            launches: int = 1, pin: bool = True, **settings) -> Measured:
    """Time each of ``ops`` on ``world_size`` fresh ranks at each size (bytes of the whole tensor).

    Each try is the slowest rank's time; a size's time is the fastest of ``repeats`` tries (``best``) or their median.
    On a shared machine the fastest try is the one the fewest other processes got in the way of.

    ``launches`` > 1 times on that many sets of fresh ranks, one after the other, and keeps each size's fastest.
    gloo's connections over loopback sometimes settle, for the whole life of a set of ranks, into a slower state:
    on the 2-core machine the median all-reduce of 512 KiB to 2 MiB took about 3 ms in such a launch, against 0.7
    to 2 ms in the others. That is a property of one set of connections, not of the link a cost model describes.

    ``pin`` (the default) binds each rank to a core of its own (:func:`pin_to_core`), as a cluster's launcher binds
    each rank to its own cores. Unbound, two ranks on the 2-core machine were sometimes scheduled on one core: the
    model's worst error on sizes it was not fitted on (``bench/plan_bench.py``) was 17% to 24% over four runs of
    five fits, and 12% to 15% bound, in the same hour."""
    from .launcher import launch

    if launches < 1:
        raise ValueError(f"launches={launches}: time on at least 1 set of ranks")
    settings = {"output": "quiet", "timeout": 300, **settings}
    runs = [launch(_time_rank, world_size, (list(ops), [int(n) for n in sizes], repeats, best, pin), **settings)[0]
            for _ in range(launches)]
    return Measured(world_size, {pair: min(run[pair] for run in runs) for pair in runs[0]})


@dataclass
class Fit:
    """One fitted :class:`~helpers.plan.Link` per collective, for ``world_size`` ranks."""

    links: dict[str, Link]
    world_size: int
    fitted_on: list[int] = field(default_factory=list)

    def predict(self, op: str, nbytes: int) -> float:
        """The model's seconds for ``op`` on a whole tensor of ``nbytes``."""
        local = nbytes // self.world_size if op == "all_gather" else nbytes
        sent = ring_bytes("all_gather_into_tensor" if op == "all_gather" else op, local, self.world_size)
        return seconds(op, self.world_size, sent, self.links[op])

    def errors(self, measured: Measured, sizes: Sequence[int]) -> dict[tuple[str, int], float]:
        """(model - measured) / measured for every op at each of ``sizes``."""
        return {(op, n): self.predict(op, n) / measured.seconds[(op, n)] - 1
                for op in self.links for n in sizes if (op, n) in measured.seconds}


def fit(measured: Measured, sizes: Sequence[int] | None = None) -> Fit:
    """Fit latency and bandwidth of each collective to ``measured`` at ``sizes`` (all by default)."""
    links = {}
    for op in sorted({o for o, _ in measured.seconds}):
        k = steps(op, measured.world_size)
        a11 = a12 = a22 = b1 = b2 = 0.0
        for x, t in measured.points(op, sizes):        # t = k alpha + x beta, each point weighted by 1 / t
            w = 1.0 / (t * t)
            a11, a12, a22 = a11 + w * k * k, a12 + w * k * x, a22 + w * x * x
            b1, b2 = b1 + w * k * t, b2 + w * x * t
        det = a11 * a22 - a12 * a12
        if det == 0:
            raise ValueError(f"{op}: fitting needs at least two sizes")
        alpha, beta = (b1 * a22 - b2 * a12) / det, (a11 * b2 - a12 * b1) / det
        links[op] = Link(f"gloo {op} on {measured.world_size} CPU ranks", max(alpha, 0.0), 1 / max(beta, 1e-15))
    return Fit(links, measured.world_size, sorted({n for _, n in measured.seconds} if sizes is None else sizes))


def _flops_rank(rank: int, world_size: int, n: int, repeats: int) -> float:
    import time

    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - began)
    return 2 * n**3 / best


def flop_rate(world_size: int = 4, n: int = 384, repeats: int = 9, **settings) -> float:
    """FLOP/s one rank reaches on an n x n float32 matrix product while ``world_size`` ranks do the same (the
    slowest rank's best try): the compute rate of this machine's CPU ranks."""
    from .launcher import launch

    settings = {"output": "quiet", "timeout": 120, **settings}
    return min(launch(_flops_rank, world_size, (n, repeats), **settings))
