"""Measuring communication: ping-pong, the alpha-beta model, and all-reduce sweeps.

The alpha-beta model says sending ``n`` bytes takes ``alpha + n * beta``: a fixed start-up
cost (latency) plus a cost per byte (the inverse of bandwidth). Fit it from a ping-pong
between two ranks, then compare any all-reduce against the ring's prediction,
``T = 2(p-1) alpha + 2(p-1)/p * n * beta``.

Example::

    >>> from helpers import perf
    >>> pp = perf.pingpong(sizes=[1 << 10, 1 << 20, 16 << 20])
    >>> fit = pp.fit()
    >>> print(fit)                       # e.g. alpha = 45 us, beta = 0.35 ns/B (2.9 GB/s)
    >>> sweep = perf.time_allreduce(None, sizes=[1 << 10, 1 << 20], world_size=4)
    >>> fig = sweep.plot_alpha_beta(fit)

All timings run in fresh ranks through :func:`helpers.launch`, on whatever backend it
picks; sizes are in bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

__all__ = ["AlphaBeta", "PingPong", "Sweep", "pingpong", "time_allreduce", "ring_model", "DEFAULT_SIZES"]

DEFAULT_SIZES = tuple(1 << k for k in range(10, 27, 2))  # 1 KB ... 64 MB


def _launch(worker: Callable, world_size: int, args: tuple, backend: str, timeout: float | None) -> Any:
    """Run a timing ``worker`` quietly on fresh ranks; by default for up to 180 s (launch's
    grading default, 10 s, while nbgrader grades)."""
    from .launcher import launch
    from .settings import default_timeout

    timeout = default_timeout(180.0) if timeout is None else timeout
    return launch(worker, world_size, args, backend=backend, timeout=timeout, output="quiet")


def _loglog(ax: Any, xlabel: str, ylabel: str, title: str) -> Any:
    """Label, legend and grid the log-log ``ax``; returns its figure, closed so that it shows once."""
    import matplotlib.pyplot as plt

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize="small")
    ax.grid(True, which="both", alpha=0.3)
    ax.figure.tight_layout()
    plt.close(ax.figure)
    return ax.figure


def ring_model(nbytes: float, world_size: int, alpha: float, beta: float) -> float:
    """Seconds a bandwidth-optimal ring all-reduce of ``nbytes`` takes in the model."""
    p = world_size
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta


@dataclass
class AlphaBeta:
    """Latency ``alpha`` (s) and time per byte ``beta`` (s/B) of one link."""

    alpha: float
    beta: float

    @property
    def bandwidth(self) -> float:
        """Bytes per second, 1 / beta."""
        return 1.0 / self.beta if self.beta > 0 else math.inf

    def __str__(self) -> str:
        return (
            f"alpha = {self.alpha * 1e6:.1f} us, beta = {self.beta * 1e9:.3f} ns/B "
            f"({self.bandwidth / 1e9:.2f} GB/s)"
        )


@dataclass
class PingPong:
    """One-way message times between two ranks (half the measured round trip)."""

    sizes: list[int]
    seconds: list[float]
    backend: str = ""

    def fit(self) -> AlphaBeta:
        """Least-squares fit of ``t = alpha + n * beta``, weighting each size equally in relative terms."""
        # Minimise sum(((alpha + n*beta) - t) / t)^2: plain least squares would let the
        # largest messages decide alone.
        a11 = a12 = a22 = b1 = b2 = 0.0
        for n, t in zip(self.sizes, self.seconds):
            w = 1.0 / (t * t)
            a11 += w
            a12 += w * n
            a22 += w * n * n
            b1 += w * t
            b2 += w * n * t
        det = a11 * a22 - a12 * a12
        if det == 0:
            raise ValueError("need at least two different message sizes to fit alpha and beta")
        alpha = (b1 * a22 - b2 * a12) / det
        beta = (a11 * b2 - a12 * b1) / det
        return AlphaBeta(max(alpha, 0.0), max(beta, 1e-15))

    def plot(self, fit: AlphaBeta | None = None):
        """Measured one-way time against message size (log-log), with the fitted line."""
        import matplotlib.pyplot as plt

        fit = fit or self.fit()
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.loglog(self.sizes, self.seconds, "o", label="measured (half round trip)")
        ax.loglog(self.sizes, [fit.alpha + n * fit.beta for n in self.sizes], "-", label=f"fit: {fit}")
        return _loglog(ax, "message size (bytes)", "one-way time (s)",
                       f"Ping-pong between two ranks{' on ' + self.backend if self.backend else ''}")


@dataclass
class Sweep:
    """Median seconds of an all-reduce at each size on ``world_size`` ranks."""

    label: str
    world_size: int
    sizes: list[int]
    seconds: list[float]
    others: list["Sweep"] = field(default_factory=list)

    def algbw(self) -> list[float]:
        """Algorithm bandwidth, bytes / seconds."""
        return [n / t for n, t in zip(self.sizes, self.seconds)]

    def busbw(self) -> list[float]:
        """Bus bandwidth: algbw x 2(p-1)/p, comparable across world sizes (nccl-tests' convention)."""
        p = self.world_size
        return [b * 2 * (p - 1) / p for b in self.algbw()]

    def table(self, fit: AlphaBeta | None = None) -> str:
        lines = [f"{'size':>10}  {'time (ms)':>10}  {'busbw GB/s':>10}" + (f"  {'model (ms)':>10}" if fit else "")]
        for n, t, bw in zip(self.sizes, self.seconds, self.busbw()):
            row = f"{n:>10}  {t * 1e3:>10.3f}  {bw / 1e9:>10.3f}"
            if fit:
                row += f"  {ring_model(n, self.world_size, fit.alpha, fit.beta) * 1e3:>10.3f}"
            lines.append(row)
        return "\n".join(lines)

    def plot_alpha_beta(self, fit: AlphaBeta, *others: "Sweep"):
        """Measured time against message size for this sweep (and ``others``), with the ring model."""
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for sweep, marker in zip((self, *others, *self.others), "os^vD*"):
            ax.loglog(sweep.sizes, sweep.seconds, marker + "-", label=f"{sweep.label} (measured)")
        sizes = sorted({n for s in (self, *others) for n in s.sizes})
        model = [ring_model(n, self.world_size, fit.alpha, fit.beta) for n in sizes]
        ax.loglog(sizes, model, "k--", label="ring model 2(p-1)a + 2(p-1)/p n b")
        return _loglog(ax, "tensor size (bytes)", "time per all-reduce (s)",
                       f"All-reduce on {self.world_size} ranks against the alpha-beta model\n({fit})")


def _median_seconds(sizes: list[int], repeats: int, once: Callable[[Any], float]) -> list[float]:
    """On a rank: for each size in bytes, a float32 tensor of that size and the median seconds of
    ``once(tensor)`` over ``repeats`` tries, each after a barrier, after one more to warm up."""
    import statistics

    import torch
    import torch.distributed as dist

    out = []
    for n in sizes:
        buf = torch.ones(max(1, n // 4), dtype=torch.float32)
        times = []
        for i in range(repeats + 1):
            dist.barrier()
            seconds = once(buf)
            if i:  # the first try warms the connection up
                times.append(seconds)
        out.append(statistics.median(times))
    return out


def _pingpong_rank(rank: int, world_size: int, sizes: list[int], repeats: int) -> list[float]:
    import time

    import torch.distributed as dist

    def round_trip(buf: Any) -> float:
        start = time.perf_counter()
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        elif rank == 1:
            dist.recv(buf, 0)
            dist.send(buf, 0)
        return (time.perf_counter() - start) / 2

    return _median_seconds(sizes, repeats, round_trip)


def pingpong(
    sizes: Sequence[int] = DEFAULT_SIZES, repeats: int = 5, backend: str = "auto", timeout: float | None = None
) -> PingPong:
    """Time messages of each size (bytes) between two ranks; returns a :class:`PingPong`."""
    sizes = [int(n) for n in sizes]
    result = _launch(_pingpong_rank, 2, (sizes, repeats), backend, timeout)
    return PingPong(sizes, result[0], result.backend)


def _sweep_rank(rank: int, world_size: int, fn: Callable | None, sizes: list[int], repeats: int) -> list[float]:
    import time

    import torch
    import torch.distributed as dist

    reduce = fn or (lambda t: dist.all_reduce(t))

    def slowest(buf: Any) -> float:
        start = time.perf_counter()
        reduce(buf)
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank decides
        return elapsed.item()

    return _median_seconds(sizes, repeats, slowest)


def time_allreduce(
    fn: Callable[[Any], Any] | None,
    sizes: Sequence[int] = DEFAULT_SIZES,
    world_size: int = 4,
    repeats: int = 5,
    label: str | None = None,
    backend: str = "auto",
    timeout: float | None = None,
) -> Sweep:
    """Median time of ``fn(tensor)`` (default: ``dist.all_reduce``) at each size in bytes."""
    sizes = [int(n) for n in sizes]
    result = _launch(_sweep_rank, world_size, (fn, sizes, repeats), backend, timeout)
    name = label or (getattr(fn, "__name__", "fn") if fn is not None else "dist.all_reduce")
    return Sweep(name, world_size, sizes, result[0])
