"""Traces of torch.distributed calls: who sent what to whom, and when.

Pass ``trace=True`` to :func:`helpers.launch`, :meth:`helpers.Cluster.run` or
``%%distributed --trace`` and the result carries a :class:`Trace`: every point-to-point
and collective call each rank made, with its peer, size and timing. From it you can
count messages and bytes, build the matrix of bytes between ranks, and draw pictures
(the drawing itself is :mod:`helpers.trace_plots`).

Example::

    >>> def ring(rank, world_size):
    ...     t = torch.ones(4)
    ...     right, left = (rank + 1) % world_size, (rank - 1) % world_size
    ...     if rank % 2 == 0:
    ...         dist.send(t, right); dist.recv(t, left)
    ...     else:
    ...         dist.recv(t, left); dist.send(t, right)
    >>> trace = launch(ring, 4, trace=True).trace
    >>> trace.summary()[0]["sent_messages"], trace.link_matrix()[0][1]
    (1, 16)
    >>> fig = trace.plot_timeline()

Every collective is in it however it was made: a torch.distributed function, a
``ProcessGroup`` method called directly, or a functional collective (DTensor's
redistribution, ``parallelize_module``, ``clip_grad_norm_`` on DTensor gradients). Each
event's ``op`` is the public call doing that work, so ``op_totals()`` counts them together;
``via`` says how one was made when it was not a torch.distributed function
(``"process_group"`` or ``"functional"``) and ``note`` names the method or op, so
``[e for e in trace.events if e.via is None]`` keeps the program's own calls.

Times are seconds from the first call in the trace. Point-to-point traffic is exact;
collectives are recorded as calls with their tensor sizes, but how many bytes they
move between which ranks depends on the backend's algorithm, so the link matrix counts
point-to-point messages only (``Trace.link_note`` says so).
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from dataclasses import dataclass, field, replace
from typing import Any, Iterable

from . import trace_plots as plots
from ._runtime.protocol import TraceEvent

__all__ = ["Event", "Trace", "RING_PHASES"]

#: The two phases of a ring all-reduce, in the order it runs them.
RING_PHASES = ("reduce-scatter", "all-gather")
#: One torch.distributed call on one rank (the record the ranks send home).
Event = TraceEvent


@dataclass
class Trace:
    """All events of one traced request, across ranks, times relative to the first call."""

    world_size: int
    events: list[Event] = field(default_factory=list)
    link_note: str = (
        "Counts point-to-point messages only (send, isend, send_object_list and the sends in "
        "batch_isend_irecv). Collectives are listed by op_totals(); the bytes they move "
        "between ranks depend on the backend's algorithm and are not counted here."
    )

    @classmethod
    def from_events(cls, world_size: int, events: Iterable[TraceEvent]) -> "Trace":
        """A trace of the ranks' events, their clock times made relative to the first call."""
        raw = list(events)
        t0 = min((e.start for e in raw), default=0.0)

        def rel(x: float | None) -> float | None:
            return None if x is None else x - t0

        shifted = [
            replace(e, start=e.start - t0, end=e.end - t0, wait_start=rel(e.wait_start), waited=rel(e.waited))
            for e in raw
        ]
        shifted.sort(key=lambda ev: (ev.start, ev.rank))
        return cls(world_size, shifted)

    def for_rank(self, rank: int) -> list[Event]:
        """The events of one rank, in the order it made the calls."""
        return [e for e in self.events if e.rank == rank]

    def summary(self) -> dict[int, dict[str, int]]:
        """Per rank: messages and bytes sent and received point-to-point, and collective calls."""
        out = {
            r: {"sent_messages": 0, "sent_bytes": 0, "recv_messages": 0, "recv_bytes": 0, "collectives": 0}
            for r in range(self.world_size)
        }
        for e in self.events:
            row = out.setdefault(e.rank, {"sent_messages": 0, "sent_bytes": 0, "recv_messages": 0, "recv_bytes": 0, "collectives": 0})
            if e.is_send:
                row["sent_messages"] += 1
                row["sent_bytes"] += e.nbytes or 0
            elif e.is_recv:
                row["recv_messages"] += 1
                row["recv_bytes"] += e.nbytes or 0
            else:
                row["collectives"] += 1
        return out

    def link_matrix(self) -> list[list[int]]:
        """``m[i][j]`` = bytes rank i sent to rank j point-to-point (see ``link_note``)."""
        n = self.world_size
        m = [[0] * n for _ in range(n)]
        for e in self.events:
            if e.is_send and e.peer is not None and 0 <= e.peer < n:
                m[e.rank][e.peer] += e.nbytes or 0
        return m

    def op_totals(self) -> dict[str, dict[str, int]]:
        """Per operation name: number of calls (all ranks) and bytes of their tensors."""
        out: dict[str, dict[str, int]] = {}
        for e in self.events:
            row = out.setdefault(e.op, {"calls": 0, "bytes": 0})
            row["calls"] += 1
            row["bytes"] += e.nbytes or 0
        return dict(sorted(out.items()))

    def matched_messages(self) -> list[tuple[Event, Event | None]]:
        """Pairs (send, matching recv) in delivery order per (sender, receiver, tag).

        A send whose receive is not in the trace is paired with None.
        """
        recvs: dict[tuple[int, int, int], deque] = defaultdict(deque)
        for e in self.events:
            if e.is_recv and e.peer is not None:
                recvs[(e.peer, e.rank, e.tag)].append(e)
        pairs = []
        for e in self.events:
            if e.is_send and e.peer is not None:
                queue = recvs.get((e.rank, e.peer, e.tag))
                pairs.append((e, queue.popleft() if queue else None))
        return pairs

    def __len__(self) -> int:
        return len(self.events)

    def __repr__(self) -> str:
        s = self.summary()
        sent = sum(r["sent_messages"] for r in s.values())
        total = sum(r["sent_bytes"] for r in s.values())
        return (
            f"<Trace of {self.world_size} ranks: {len(self.events)} calls, {sent} point-to-point "
            f"messages, {plots.human_bytes(total)} sent>"
        )

    def table(self) -> str:
        """A text table of the per-rank summary."""
        lines = [f"{'rank':>4}  {'sent msgs':>9}  {'sent bytes':>10}  {'recv msgs':>9}  {'recv bytes':>10}  {'collectives':>11}"]
        for r, row in sorted(self.summary().items()):
            lines.append(
                f"{r:>4}  {row['sent_messages']:>9}  {row['sent_bytes']:>10}  {row['recv_messages']:>9}  "
                f"{row['recv_bytes']:>10}  {row['collectives']:>11}"
            )
        return "\n".join(lines)

    # -- ring steps -------------------------------------------------------------------

    def ring_steps(self, numel: int | None = None, phases: tuple[str, ...] = RING_PHASES) -> list[dict[str, Any]]:
        """Reconstruct a ring all-reduce (or one of its phases) step by step from its point-to-point messages.

        ``phases`` are the phases the trace holds, in order, p-1 steps each: the default is a
        whole all-reduce; ``("reduce-scatter",)`` or ``("all-gather",)`` reads a trace of one
        phase alone (a lone all-gather starts with rank r holding finished chunk r only).
        Step ``k`` is each rank's ``k``-th send. The chunk a message carries is read from
        where the sent tensor lies in its parent tensor (a view such as ``t[a:b]``); when
        the sends are copies, the course's ring schedule is assumed (rank r ends the
        reduce-scatter owning chunk r) and ``assumed_chunks`` is True. Returns, per step:
        ``phase``, ``sends`` [(src, dst, chunk)], and ``holdings``: for each rank and chunk,
        how many ranks' values that chunk now sums (p = fully reduced, 0 = nothing yet).
        """
        phases = tuple(phases)
        if not phases or any(ph not in RING_PHASES for ph in phases):
            raise ValueError(f"phases is a sequence of {RING_PHASES}, in the order the trace ran them; got {phases!r}")
        p = self.world_size
        sends = {r: [e for e in self.for_rank(r) if e.is_send] for r in range(p)}
        steps = max((len(v) for v in sends.values()), default=0)
        if phases[0] == "all-gather":
            contributors = [[set(range(p)) if c == r else set() for c in range(p)] for r in range(p)]
        else:
            contributors = [[{r} for _ in range(p)] for r in range(p)]
        holdings = [[len(c) for c in row] for row in contributors]  # holdings[rank][chunk]
        out = []
        assumed = False
        for k in range(steps):
            index = min(k // max(p - 1, 1), len(phases) - 1)
            phase, j = phases[index], k - index * (p - 1)  # j: the step within the phase
            moves = []
            for r in range(p):
                if k >= len(sends[r]):
                    continue
                e = sends[r][k]
                chunk = _chunk_of(e, p)
                if chunk is None:
                    assumed = True
                    chunk = (r - j - 1) % p if phase == "reduce-scatter" else (r - j) % p
                moves.append((r, e.peer, chunk))
            new = [row[:] for row in contributors]
            for src, dst, chunk in moves:
                if dst is None:
                    continue
                if phase == "reduce-scatter":
                    new[dst][chunk] = contributors[dst][chunk] | contributors[src][chunk]
                else:
                    new[dst][chunk] = set(contributors[src][chunk])
            contributors = new
            holdings = [[len(contributors[r][c]) for c in range(p)] for r in range(p)]
            out.append({"step": k, "phase": phase, "sends": moves, "holdings": holdings, "assumed_chunks": assumed})
        return out

    # -- pictures (drawn by helpers.trace_plots) -----------------------------------------

    def plot_timeline(self, ax: Any = None, arrows: bool = True, title: str | None = None) -> Any:
        """One lane per rank, a bar per call, an arrow per message from sender to receiver.

        Returns the matplotlib Figure; as a cell's last expression Jupyter shows it (end
        the line with ``;`` and it is not shown). Pass ``ax`` to draw on your own axes.
        """
        return plots.plot_timeline(self.events, self.world_size, self.matched_messages() if arrows else (), ax, title)

    def plot_links(self, ax: Any = None, title: str | None = None) -> Any:
        """Heatmap of bytes sent from each rank (rows) to each rank (columns)."""
        return plots.plot_links(self.link_matrix(), ax, title)

    def plot_ring_steps(self, interactive: bool | None = None, phases: tuple[str, ...] = RING_PHASES) -> Any:
        """A ring all-reduce (or one phase of it, see ``ring_steps``), step by step: which chunk each rank holds and sends.

        In a notebook with widgets this returns a slider over the steps; elsewhere (or with
        ``interactive=False``) a Figure with one panel per step.
        """
        return plots.plot_ring_steps(self.ring_steps(phases=phases), self.world_size, tuple(phases), interactive)


def _chunk_of(e: Event, p: int) -> int | None:
    """Which of p near-equal chunks of its parent tensor a sent view covers, if it is a view."""
    if e.offset is None or e.base_nbytes is None or not e.nbytes or e.nbytes >= e.base_nbytes:
        return None
    item = _itemsize(e.dtype)
    n = e.base_nbytes // item
    start = e.offset // item
    size = math.ceil(n / p)
    return min(start // size, p - 1) if size else None


def _itemsize(dtype: str | None) -> int:
    import torch

    value = getattr(torch, dtype or "float32", None)
    return value.itemsize if isinstance(value, torch.dtype) else 1
